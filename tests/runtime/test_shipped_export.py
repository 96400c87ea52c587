"""The shipped model also ships exported, so a runtime-only install captions with no model named and no torch.

scripts/test_runtime_only.sh captions the sample photos through it on such an install; here, that the export is
the shipped checkpoint's and that a command with no model picks it.
"""

import importlib.util

import pytest

from edgecap.config import DEFAULT_EXPORT, DEFAULT_MODEL
from edgecap.model_source import ModelSource
from edgecap.runtime.manifest import Manifest, file_sha256


def test_the_shipped_export_is_the_shipped_checkpoint_exported():
    manifest = Manifest.read(DEFAULT_EXPORT)
    assert manifest.source_checkpoint_sha256 == file_sha256(DEFAULT_MODEL)
    assert manifest.target["name"] == "cpu" and manifest.target["precision"] in manifest.graphs
    passing = [t for t in manifest.target["trials"] if t["parity"] in ("pass", "validated at export")]
    fastest = min(passing, key=lambda t: t["caption_ms_p50"])
    assert fastest["precision"] == manifest.target["precision"] and fastest["candidate"] in manifest.target["reason"]
    for precision in manifest.graphs:
        assert all(file.is_file() for file in manifest.graph_files(DEFAULT_EXPORT, precision))


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="the shipped export runs on onnxruntime")
def test_no_model_named_runs_the_shipped_export_at_its_fastest_passing_precision():
    chosen = Manifest.read(DEFAULT_EXPORT).target["precision"]
    assert ModelSource.fastest(None, None, None) == ModelSource(DEFAULT_EXPORT, "ort", chosen)
    assert ModelSource.fastest(None, None, "fp32") == ModelSource(DEFAULT_EXPORT, "ort", "fp32")
    assert ModelSource.fastest(None, "openvino", None) == ModelSource(DEFAULT_EXPORT, "openvino",
                                                                      chosen)
    assert ModelSource.fastest(None, "torch", None) == ModelSource(None, "torch", "fp32")  # PyTorch, when asked
