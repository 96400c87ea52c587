"""Dataset specs (``KIND:PATH``) to CaptionDataset; every reader lives in its own module."""

from __future__ import annotations

from pathlib import Path

from edgecap.data.records import CaptionDataset, ImageRecord
from edgecap.errors import DataError

__all__ = ["CaptionDataset", "ImageRecord", "load_dataset", "KINDS"]

KINDS = ("flickr8k", "folder", "karpathy", "coco", "shapes")


def _existing(path_text: str, spec: str) -> Path:
    path = Path(path_text).expanduser()
    if not path.exists():
        raise DataError(f"{path}: not found (from data spec '{spec}'); check the path")
    return path.resolve()


def load_dataset(spec: str) -> CaptionDataset:
    """A dataset from its spec.

    ``flickr8k:DIR``, ``folder:DIR`` (photos and a captions.csv), ``karpathy:FILE.json[:IMAGE_ROOT]``,
    ``coco:DIR_OR_JSON[:IMAGE_ROOT]`` or ``shapes[:DIR]``.
    """
    kind, _, rest = spec.partition(":")
    if kind == "shapes":
        from edgecap.data.shapes import load_shapes

        folder = Path(rest).expanduser() if rest else None
        if folder is not None and folder.exists() and not folder.is_dir():
            raise DataError(f"{folder}: a file; shapes:DIR names the folder the generated dataset is written to")
        return load_shapes(folder)
    if kind not in KINDS or not rest:
        raise DataError(f"data spec '{spec}': expected one of flickr8k:DIR, folder:DIR, "
                        "karpathy:FILE.json[:IMAGE_ROOT], coco:DIR_OR_JSON[:IMAGE_ROOT], shapes")
    path_text, _, root_text = rest.partition(":")
    path = _existing(path_text, spec)
    root = _existing(root_text, spec) if root_text else None
    if kind == "flickr8k":
        from edgecap.data.flickr8k import read_flickr8k

        return read_flickr8k(path)
    if kind == "folder":
        from edgecap.data.folder import read_folder

        return read_folder(path)
    if kind == "karpathy":
        from edgecap.data.karpathy import read_karpathy

        return read_karpathy(path, root)
    from edgecap.data.coco import read_coco

    return read_coco(path, root)
