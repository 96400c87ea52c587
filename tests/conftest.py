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


def pytest_configure(config):
    """One intra-op thread: tiny models gain nothing from two, and two threads collapse under contention."""
    import torch

    torch.set_num_threads(1)
