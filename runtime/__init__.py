"""edgecap's deployment runtime: captions through an export directory, with no torch anywhere.

    from edgecap.runtime import Captioner, SearchOptions
    captioner = Captioner.from_dir("exports/default")
    print(captioner.caption(["photo.jpg"], SearchOptions(beam_size=3))[0].text)

The names below load on first use, so importing one submodule (the manifest, say) loads nothing else.
"""

from importlib import import_module

_PUBLIC = {"Captioner": "pipeline", "Caption": "pipeline", "SearchOptions": "search", "Manifest": "manifest"}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'edgecap.runtime' has no attribute {name!r}")
    return getattr(import_module(f"edgecap.runtime.{_PUBLIC[name]}"), name)
