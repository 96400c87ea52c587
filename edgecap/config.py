"""Frozen configuration dataclasses, named presets and strict ``SECTION.FIELD=VALUE`` overrides (torch-free).

Architecture always comes from the artifact (checkpoint or manifest), never from CLI flags: these configs are only
read when a run starts from scratch. Training options are grouped by concern, and each group is a ``--set``
section: ``optim``, ``xe`` (cross-entropy), ``scst`` (self-critical), ``hard`` (hard attention), ``select``
(dev selection and early stopping); ``train`` holds the few that belong to the whole run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from edgecap.errors import EdgecapError

DEFAULT_MODEL = Path(__file__).resolve().parent / "assets" / "default" / "model.pt"
DEFAULT_EXPORT = DEFAULT_MODEL.parent / "export"  # the same model exported for --target cpu: what `edgecap caption`
# runs, with no torch
SHIPPED = "shipped"  # encoder.weights naming the shipped default model's (fine-tuned) encoder


def _share(section: str, name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise EdgecapError(f"{section}.{name} must be in [0, 1], got {value}")


def _at_least(section: str, config: object, low: float, *names: str, strict: bool = False) -> None:
    """Each named field of ``config`` is a finite number >= ``low`` (> with ``strict``), or one line names it."""
    for name in names:
        value = getattr(config, name)
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise EdgecapError(f"{section}.{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                               f"got {value}")


@dataclass(frozen=True)
class EncoderConfig:
    name: str = "efficientnet_lite0"  # efficientnet_lite0/1/2, resnet101 or small_cnn
    image_size: int = 224  # square input side; grid is image_size/32 (small_cnn: /16)
    weights: str = ""  # replaces the ImageNet weights: a state dict or edgecap checkpoint file (its encoder), or
    # "shipped" for the shipped default model's encoder; resnet101 needs one (torchvision format)
    finetune: bool = False  # train the encoder too (GPU); a frozen encoder allows the feature cache
    frozen_batchnorm: bool = False  # a fine-tuned encoder's BatchNorm keeps its running statistics, which inference
    # uses, instead of each batch's (its scale and shift still train): for self-critical training of a fine-tuned
    # encoder, whose rewarded captions are sampled from these features
    channels: int = 64  # small_cnn width

    def __post_init__(self):
        _at_least("encoder", self, 1, "image_size", "channels")
        if self.frozen_batchnorm and not self.finetune:
            raise EdgecapError("encoder.frozen_batchnorm=true needs --finetune-encoder: a frozen encoder always "
                               "normalises by its running statistics")

    def weights_file(self) -> Path:
        """The file ``weights`` names; the shipped default model for ``shipped``."""
        return DEFAULT_MODEL if self.weights == SHIPPED else Path(self.weights)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 4e-4  # AdamW peak learning rate of cross-entropy
    encoder_lr: float = 0.0  # peak rate of a trained encoder (0: lr); a pretrained one wants ~lr/10, and
    # self-critical training scales scst.lr by the same encoder_lr / lr
    weight_decay: float = 1e-4  # AdamW decoupled weight decay
    warmup_steps: int = 500  # linear warm-up, then cosine decay to lr/10 over xe.epochs
    grad_clip: float = 2.0  # max global gradient norm
    ema_decay: float = 0.0  # d of an exponential moving average of the weights that dev selection scores and
    # best.pt keeps (0: the raw weights); it ramps up as min(d, (1+n)/(10+n)) over the first n steps

    def __post_init__(self):
        _at_least("optim", self, 0, "encoder_lr", "weight_decay", "warmup_steps")
        _at_least("optim", self, 0, "lr", "grad_clip", strict=True)
        if not 0.0 <= self.ema_decay < 1.0:
            raise EdgecapError(f"optim.ema_decay must be in [0, 1), got {self.ema_decay}")


@dataclass(frozen=True)
class XEConfig:
    epochs: int = 20  # cross-entropy epochs at most (patience may end the phase sooner)
    batch_size: int = 64  # (image, caption) pairs per step, over all processes
    max_steps: int = 0  # stop cross-entropy after this many optimiser steps (0: no limit)
    label_smoothing: float = 0.0  # eps of the target (1-eps) one-hot + eps uniform
    mirror_share: float = 0.0  # share of captions trained on their photo flipped left-right, "left" and "right"
    # swapped (a frozen encoder caches the flipped photos once more)
    doubly_stochastic: float = 1.0  # lambda of mean_i (1 - sum_t alpha_ti)^2, for models that return soft attention
    captions_per_image: int = 1  # k > 1: k captions of a photo side by side in a batch, which encodes it once

    def __post_init__(self):
        if not 0.0 <= self.label_smoothing < 1.0:
            raise EdgecapError(f"xe.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        _share("xe", "mirror_share", self.mirror_share)
        _at_least("xe", self, 0, "epochs", "max_steps", "doubly_stochastic")
        _at_least("xe", self, 1, "batch_size", "captions_per_image")


OBJECTIVES = ("auto", "scst", "c2f")


@dataclass(frozen=True)
class SCSTConfig:
    epochs: int = 0  # self-critical epochs after cross-entropy (0: none)
    lr: float = 2e-5  # constant learning rate of the phase
    samples: int = 5  # sampled captions per image
    baseline: str = "mean"  # "mean" (of the image's other samples) or "greedy" (its greedy caption)
    objective: str = "auto"  # "scst": reward the caption; "c2f": every stage of a multi-stage decoder (Stack-
    # Captioning's coarse-to-fine RL); "auto": c2f for multi-stage decoders, else scst
    batch_images: int = 32  # images per step, over all processes
    mirror_share: float = 0.0  # share of images sampled on their photo flipped left-right, scored against their
    # references with "left" and "right" swapped
    score_end: bool = False  # the reward's CIDEr-D also scores each caption's end token against the references' ends

    def __post_init__(self):
        if self.baseline not in ("mean", "greedy"):
            raise EdgecapError(f"scst.baseline must be 'mean' or 'greedy', got '{self.baseline}'")
        if self.objective not in OBJECTIVES:
            raise EdgecapError(f"scst.objective must be one of {', '.join(OBJECTIVES)}, got '{self.objective}'")
        if self.baseline == "mean" and self.samples < 2:
            raise EdgecapError(f"scst.baseline=mean needs scst.samples >= 2, got {self.samples}")
        _share("scst", "mirror_share", self.mirror_share)
        _at_least("scst", self, 0, "epochs", "lr")
        _at_least("scst", self, 1, "samples", "batch_images")


@dataclass(frozen=True)
class HardAttentionConfig:
    reinforce_weight: float = 0.1  # lambda_r on the REINFORCE term of the sampled locations
    entropy: float = 0.01  # lambda_e of the entropy bonus
    baseline_decay: float = 0.9  # moving-average baseline b = d*b + (1-d)*log p(y|s,a)
    expected_share: float = 0.5  # share of captions trained on the expected context instead of a sampled location,
    # as the paper does for half its images (section 4.1)

    def __post_init__(self):
        _at_least("hard", self, 0, "reinforce_weight", "entropy")
        _share("hard", "expected_share", self.expected_share)
        if not 0.0 <= self.baseline_decay < 1.0:
            raise EdgecapError(f"hard.baseline_decay must be in [0, 1), got {self.baseline_decay}")


@dataclass(frozen=True)
class SelectionConfig:
    patience: int = 3  # epochs without a better dev CIDEr-D in the current phase before it stops
    beam: int = 3  # beam size of the dev captions selection scores
    images: int = 0  # dev photos scored (0: all)

    def __post_init__(self):
        _at_least("select", self, 1, "patience", "beam")
        _at_least("select", self, 0, "images")


@dataclass(frozen=True)
class TrainConfig:
    optim: OptimConfig = field(default_factory=OptimConfig)
    xe: XEConfig = field(default_factory=XEConfig)
    scst: SCSTConfig = field(default_factory=SCSTConfig)
    hard: HardAttentionConfig = field(default_factory=HardAttentionConfig)
    select: SelectionConfig = field(default_factory=SelectionConfig)
    seed: int = 0  # seeds torch, numpy and the batch order
    min_word_count: int = 5  # rarer training words become <unk>
    max_caption_length: int = 20  # words kept per training caption and longest decode
    init: str = ""  # start from this edgecap checkpoint (a .pt, run directory or shipped id such as glied): its
    # vocabulary and decoder, and its encoder when the encoder trains; with xe.epochs=0 the run starts at
    # self-critical training

    def __post_init__(self):
        _at_least("train", self, 1, "max_caption_length", "min_word_count")
        _at_least("train", self, 0, "seed")
        if self.xe.epochs < (0 if self.init else 1):
            raise EdgecapError(f"xe.epochs must be >= 1 (>= 0 with train.init), got {self.xe.epochs}")
        if self.xe.epochs == 0 and not self.scst.epochs:
            raise EdgecapError("xe.epochs=0 needs scst.epochs >= 1: the run would train nothing")

    @classmethod
    def from_json(cls, data: dict) -> TrainConfig:
        groups = {f.name: f.type for f in dataclasses.fields(cls) if f.name in _GROUPS}
        return cls(**{k: _GROUPS[k](**v) if k in groups else v for k, v in data.items()})


_GROUPS: dict[str, type] = {"optim": OptimConfig, "xe": XEConfig, "scst": SCSTConfig, "hard": HardAttentionConfig,
                            "select": SelectionConfig}
SECTIONS = ("encoder", "model", "train", *_GROUPS)  # what --set SECTION.FIELD=VALUE may name


@dataclass(frozen=True)
class Preset:
    """A named starting point of ``edgecap train --preset NAME``: sizes for any architecture, or a measured recipe
    for one (``model_id``), which is then the default ``--model``."""

    summary: str  # one line for --help and the docs
    encoder: EncoderConfig
    train: TrainConfig
    size: str = "base"  # the model sizes of the registry entry: "base" or "tiny"
    model_id: str | None = None  # a recipe's architecture
    model: dict = field(default_factory=dict)  # model-config overrides on top of the size


_BASE_TRAIN = TrainConfig(optim=OptimConfig(lr=5e-4, warmup_steps=300), xe=XEConfig(epochs=12, batch_size=128),
                          scst=SCSTConfig(epochs=8))
_SHIPPED_OPTIM = dataclasses.replace(_BASE_TRAIN.optim, ema_decay=0.998)
_SHIPPED_XE = dataclasses.replace(_BASE_TRAIN.xe, epochs=10, label_smoothing=0.2, mirror_share=0.5)
_LITE2 = EncoderConfig(name="efficientnet_lite2", image_size=260)
# Five captions to a photo: a Transformer's encoder layers, most of its step, run once per photo (docs/results.md,
# "Training cost"); GLIED keeps the 7-epoch schedule it was measured with (docs/experiments.md).
_SHARED_PHOTOS_XE = dataclasses.replace(_SHIPPED_XE, captions_per_image=5)
_RECIPE_XE = {"a2": _SHARED_PHOTOS_XE, "glied": dataclasses.replace(_SHARED_PHOTOS_XE, epochs=7)}
_SHIPPED_SCST = SCSTConfig(epochs=40, lr=5e-5, mirror_share=0.5)
# Stack-Captioning's self-critical phase passed its cross-entropy start only as plain SCST with a reward that scores
# where a caption ends (docs/experiments.md, (3d) to (3h)).
_RECIPE_SCST = {"stackcap": dataclasses.replace(_SHIPPED_SCST, objective="scst", mirror_share=0.0, score_end=True)}

PRESETS: dict[str, Preset] = {
    "base": Preset("any model at its Flickr8k size: frozen EfficientNet-Lite0, 12 + 8 epochs",
                   EncoderConfig(), _BASE_TRAIN),
    "tiny": Preset("any model, small enough to train on shapes in minutes on a CPU (tests)",
                   EncoderConfig(name="small_cnn", image_size=96, finetune=True, channels=64),
                   TrainConfig(optim=OptimConfig(lr=2e-3, warmup_steps=50),
                               xe=XEConfig(epochs=8, batch_size=32), scst=SCSTConfig(lr=5e-5, batch_images=16),
                               select=SelectionConfig(patience=8, beam=1, images=100),
                               min_word_count=1, max_caption_length=16),
                   size="tiny"),
    **{f"{model_id}-flickr8k": Preset(
        f"{summary} on the shipped fine-tuned EfficientNet-Lite2 at 260 px, frozen: the shipped decoder's recipe"
        f"{', five captions to a photo' if model_id in _RECIPE_XE else ''} (CPU)",
        dataclasses.replace(_LITE2, weights=SHIPPED),
        dataclasses.replace(_BASE_TRAIN, optim=_SHIPPED_OPTIM, xe=_RECIPE_XE.get(model_id, _SHIPPED_XE),
                            scst=_RECIPE_SCST.get(model_id, _SHIPPED_SCST)),
        model_id=model_id)
       for model_id, summary in (("sat", "the shipped SAT"), ("spca", "SPCA"), ("stackcap", "Stack-Captioning"),
                                 ("a2", "A²"), ("glied", "GLIED"))},
    "sat-flickr8k-finetune": Preset(
        "the shipped encoder's recipe: EfficientNet-Lite2 at 260 px fine-tuned with a SAT decoder (GPU)",
        dataclasses.replace(_LITE2, finetune=True),
        dataclasses.replace(_BASE_TRAIN, optim=dataclasses.replace(_SHIPPED_OPTIM, encoder_lr=5e-5),
                            xe=dataclasses.replace(_SHIPPED_XE, epochs=5), scst=SCSTConfig(epochs=12, lr=5e-5)),
        model_id="sat"),
}


def _coerce(value: str, current: object, key: str) -> object:
    if isinstance(current, bool):
        if value.lower() in ("1", "true", "yes"):
            return True
        if value.lower() in ("0", "false", "no"):
            return False
        raise EdgecapError(f"--set {key}={value}: expected true or false")
    try:
        return type(current)(value) if current is not None else value
    except ValueError:
        raise EdgecapError(f"--set {key}={value}: expected a {type(current).__name__}") from None


def _known(config: object) -> list[str]:
    return [f.name for f in dataclasses.fields(config) if f.name not in _GROUPS]


def apply_overrides(preset: Preset, overrides: list[str], model_fields: dict[str, object]) -> Preset:
    """``["optim.lr=1e-3", "model.hidden_dim=256", "encoder.finetune=true"]`` applied strictly and together.

    ``model_fields`` maps the model config's settable field names to their defaults, so model overrides are
    checked against the chosen architecture. Values are validated once all are applied: no order between them.
    """
    model = dict(preset.model)
    changes: dict[str, dict[str, object]] = {section: {} for section in SECTIONS if section != "model"}
    for item in overrides:
        key, sep, value = item.partition("=")
        section, _, name = key.partition(".")
        if not sep or not name or section not in SECTIONS:
            raise EdgecapError(f"--set {item}: expected SECTION.FIELD=VALUE with SECTION one of {', '.join(SECTIONS)}")
        if section == "model":
            if name not in model_fields:
                raise EdgecapError(f"--set {item}: the model has no field '{name}'; known: {', '.join(model_fields)}")
            model[name] = _coerce(value, model.get(name, model_fields[name]), key)
            continue
        target = preset.encoder if section == "encoder" else getattr(preset.train, section, preset.train)
        if name not in _known(target):
            raise EdgecapError(f"--set {item}: {section} has no field '{name}'; known: {', '.join(_known(target))}")
        changes[section][name] = _coerce(value, getattr(target, name), key)
    groups = {g: dataclasses.replace(getattr(preset.train, g), **changes[g]) for g in _GROUPS}
    train = dataclasses.replace(preset.train, **groups, **changes["train"])
    return dataclasses.replace(preset, encoder=dataclasses.replace(preset.encoder, **changes["encoder"]),
                               train=train, model=model)
