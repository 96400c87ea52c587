"""The runtime ships to devices without torch: importing and running it must never import torch."""


import pytest

from tests.without_torch import run_without_torch


def test_runtime_search_runs_where_importing_torch_fails():
    run_without_torch("""
        import numpy as np
        from edgecap.runtime.search import SearchOptions, beam_search
        from edgecap.preprocess import Preprocessing, to_array
        from edgecap.vocab import Vocab
        from PIL import Image

        class Uniform:
            def step(self, tokens, reorder, position):
                n = len(tokens)
                ids = np.tile(np.arange(4, 10), (n, 1)).astype(np.int64)
                return np.log(np.full((n, 6), 1 / 6, np.float32)), ids, np.ones((n, 4), np.float32)
            def tile(self, beam):
                pass

        to_array(Image.new("RGB", (10, 10)), Preprocessing(image_size=8))
        hyps = beam_search(Uniform(), 2, SearchOptions(beam_size=2, max_length=3))
        assert len(hyps) == 2
    """)


def test_runtime_install_pulls_no_torch():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml with tomllib")
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    runtime_requirements = project["dependencies"] + project["optional-dependencies"]["runtime"]
    assert not [r for r in runtime_requirements if r.lower().startswith("torch")]
