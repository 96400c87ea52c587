import importlib.util
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
FLICKR8K = SHARED_DATA / "flickr8k"


@pytest.fixture(scope="session")
def flickr8k_dir() -> Path:
    if not (FLICKR8K / "Flickr8k.token.txt").is_file():
        pytest.skip(f"{FLICKR8K} not found: the real-photo tests need ../shared/data/flickr8k beside the checkout")
    return FLICKR8K


@pytest.fixture(scope="session")
def coco_mini_dir() -> Path:
    root = SHARED_DATA / "coco_mini"
    if not (root / "annotations").is_dir():
        pytest.skip(f"{root} not found: the COCO reader test needs ../shared/data/coco_mini beside the checkout")
    return root


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory) -> Path:
    """A tiny SAT trained on shapes for 150 steps (``run/``) and exported in fp32 and fp16 (``exp/``)."""
    from tests.helpers import invoke

    for package in ("torch", "onnx"):
        pytest.importorskip(package, reason=f"training and exporting need {package} (the train and export extras)")
    root = tmp_path_factory.mktemp("export")
    code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(root / "run"),
                          "--max-steps", "150", "--set", "select.images=20")
    assert code == 0, output
    code, output = invoke("export", str(root / "run"), "--out", str(root / "exp"), "--precision", "fp32,fp16")
    assert code == 0, output
    return root


@pytest.fixture(scope="session")
def int8_export(tiny_export, tmp_path_factory) -> Path:
    """``tiny_export``'s run exported by the CLI with INT8 graphs in the TensorRT scheme (the default), every layer
    INT8 (``exp/``; fp32 + int8)."""
    from tests.helpers import invoke

    directory = tmp_path_factory.mktemp("int8") / "exp"
    code, output = invoke("export", str(tiny_export / "run"), "--out", str(directory), "--precision", "fp32,int8",
                          "--calib-data", "shapes", "--calib-images", "48", "--calib-heldout", "24",
                          "--calib-max-delta", "100")
    assert code == 0, output
    assert "int8 (tensorrt, max): ΔCIDEr" in output
    return directory


def pytest_configure(config):
    """One intra-op thread: tiny models gain nothing from two, and two threads collapse under contention. torch only
    where it is installed: ``pytest tests/runtime`` runs on an install with the runtime extra alone."""
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)
