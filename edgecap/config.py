"""Frozen configuration dataclasses, presets and strict ``section.field=value`` overrides (torch-free).

Architecture always comes from the artifact (checkpoint or manifest), never from
CLI flags: these configs are only read when a run starts from scratch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from edgecap.errors import EdgecapError


@dataclass(frozen=True)
class EncoderConfig:
    name: str = "efficientnet_lite0"  # efficientnet_lite0/1/2, resnet101 or small_cnn
    image_size: int = 224  # square input side; grid is image_size/32 (small_cnn: /16)
    weights: str = ""  # a state dict or edgecap checkpoint (its fine-tuned encoder) replacing the ImageNet weights;
    # resnet101 needs one (torchvision format)
    finetune: bool = False  # train the encoder too (GPU); a frozen encoder allows the feature cache
    frozen_batchnorm: bool = False  # fine-tuning a pretrained encoder: BatchNorm keeps its running statistics (its
    # scale and shift still train) instead of each batch's, which inference never sees: over batches of 32 photos
    # they cost the shipped model 20 CIDEr-D on training photos, 3.4 on dev ones (benchmarks/encoder_shift.py).
    # Meant for self-critical training, whose rewarded captions are sampled from those features; a short CPU check
    # kept the reward up with it but not the dev score (docs/RESULTS.md row 0r)
    channels: int = 64  # small_cnn width

    def __post_init__(self):
        if self.frozen_batchnorm and not self.finetune:
            raise EdgecapError("encoder.frozen_batchnorm=true needs --finetune-encoder: a frozen encoder always "
                               "normalises by its running statistics")


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 64  # (image, caption) pairs per cross-entropy step
    lr: float = 4e-4  # AdamW peak learning rate (cross-entropy)
    encoder_lr: float = 0.0  # peak rate of a trained encoder (0: lr); a pretrained one wants ~lr/10;
    # self-critical training scales scst_lr by the same encoder_lr / lr
    weight_decay: float = 1e-4  # AdamW decoupled weight decay
    warmup_steps: int = 500  # linear warm-up, then cosine decay to lr/10 over `epochs`
    epochs: int = 20  # cross-entropy epochs at most (early stopping may end sooner)
    max_steps: int = 0  # stop cross-entropy after this many optimiser steps (0: no limit)
    grad_clip: float = 2.0  # max global gradient norm
    label_smoothing: float = 0.0  # cross-entropy: weight eps of the uniform target, (1-eps) nll + eps mean_v -log p_v
    ema_decay: float = 0.0  # d of an exponential moving average of the weights that dev selection scores and
    # best.pt keeps (0: the raw weights); the decay ramps up to d as min(d, (1+n)/(10+n)) over the first n steps
    mirror_share: float = 0.0  # share of cross-entropy captions trained on their photo flipped left-right, with
    # "left" and "right" swapped (a frozen encoder caches the flipped photos' features once more)
    patience: int = 3  # epochs without a better dev CIDEr in the current phase before stopping it
    seed: int = 0  # seeds torch, numpy and the batch order
    min_word_count: int = 5  # rarer training words become <unk>
    max_caption_length: int = 20  # words kept per training caption and longest decode
    doubly_stochastic: float = 1.0  # lambda of mean_i (1 - sum_t alpha_ti)^2 (the paper's sum over i, scaled by 1/L);
    # applies to models whose forward returns a softmax attention "alpha" (B, T, L)
    hard_reinforce_weight: float = 0.1  # hard attention: lambda_r on the REINFORCE term; at 1 its gradient was
    # 3.5x the likelihood's on Flickr8k, so clipping left the words little of each step
    hard_entropy: float = 0.01  # hard attention: entropy bonus lambda_e
    hard_baseline: str = "moving"  # hard attention's REINFORCE baseline: "moving" (the paper's average b) or
    # "caption" (each caption's log p(y|a) under the expected context: one more forward pass, no gradients)
    hard_baseline_decay: float = 0.9  # hard attention: moving-average baseline b = d*b + (1-d)*log p
    hard_expected_share: float = 0.5  # hard attention: share of captions trained on the expected context
    # instead of a sampled location, as the paper does for half its images (section 4.1)
    scst_epochs: int = 0  # self-critical epochs after cross-entropy (0: none)
    scst_lr: float = 2e-5  # learning rate of the self-critical phase
    scst_samples: int = 5  # sampled captions per image
    scst_baseline: str = "mean"  # "mean" (of the other samples) or "greedy"
    scst_batch_images: int = 32  # images per self-critical step
    scst_mirror_share: float = 0.0  # share of self-critical images sampled on their photo flipped left-right and
    # scored against their references with "left" and "right" swapped (a second view against overfitting)
    scst_zoom_share: float = 0.0  # share of the unflipped self-critical images sampled on a crop of one of their
    # corners (80% of the side, scaled back up; four more caches for a frozen encoder), scored as the photo itself
    eval_beam: int = 3  # beam size for dev selection
    eval_images: int = 0  # dev images used for selection (0: all)
    init: str = ""  # start from this edgecap checkpoint (a .pt or run directory): its vocabulary and decoder, and its
    # encoder when the encoder trains; with epochs=0 the run starts at self-critical training (say after a GPU
    # fine-tune, frozen: pass the same file as encoder.weights so the cached features come from its encoder)

    def __post_init__(self):
        if self.scst_baseline not in ("mean", "greedy"):
            raise EdgecapError(f"train.scst_baseline must be 'mean' or 'greedy', got '{self.scst_baseline}'")
        if self.scst_baseline == "mean" and self.scst_samples < 2:
            raise EdgecapError(f"train.scst_baseline=mean needs train.scst_samples >= 2, got {self.scst_samples}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise EdgecapError(f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.hard_reinforce_weight < 0:
            raise EdgecapError(f"train.hard_reinforce_weight must be >= 0, got {self.hard_reinforce_weight}")
        if self.hard_baseline not in ("moving", "caption"):
            raise EdgecapError(f"train.hard_baseline must be 'moving' or 'caption', got '{self.hard_baseline}'")
        if not 0.0 <= self.hard_expected_share <= 1.0:
            raise EdgecapError(f"train.hard_expected_share must be in [0, 1], got {self.hard_expected_share}")
        for name in ("mirror_share", "scst_mirror_share", "scst_zoom_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise EdgecapError(f"train.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise EdgecapError(f"train.ema_decay must be in [0, 1), got {self.ema_decay}")
        for name in ("batch_size", "eval_beam", "max_caption_length"):
            if getattr(self, name) < 1:
                raise EdgecapError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.epochs < (0 if self.init else 1):
            raise EdgecapError(f"train.epochs must be >= 1 (>= 0 with train.init), got {self.epochs}")
        if self.epochs == 0 and not self.scst_epochs:
            raise EdgecapError("train.epochs=0 needs train.scst_epochs >= 1: the run would train nothing")


@dataclass(frozen=True)
class Preset:
    encoder: EncoderConfig
    train: TrainConfig
    model: dict = field(default_factory=dict)  # model-config overrides (fields of the model's config class)


PRESETS = {
    "base": Preset(EncoderConfig(), TrainConfig(batch_size=128, lr=5e-4, warmup_steps=300, epochs=12, scst_epochs=8)),
    "tiny": Preset(
        EncoderConfig(name="small_cnn", image_size=96, finetune=True, channels=64),
        TrainConfig(batch_size=32, lr=2e-3, warmup_steps=50, epochs=8, patience=8, min_word_count=1,
                    max_caption_length=16, eval_beam=1, eval_images=100, scst_lr=5e-5, scst_batch_images=16),
    ),
}
_LSTM_BASE = {"embed_dim": 256, "att_dim": 256}
_LSTM_TINY = {"embed_dim": 64, "hidden_dim": 128, "att_dim": 64, "dropout": 0.1}
# A²: d 256 (3 encoder + 3 decoder layers) rather than the paper's 512 for COCO: Flickr8k has a fifth of COCO's
# captions, and each cross-entropy step runs the decoder twice (aligned, then the mask network's perturbed pass),
# so d 512 would cost ~4x the CPU time per step.
_A2_BASE = {"d_model": 256, "heads": 8, "layers": 3, "ff_dim": 1024}
_A2_TINY = {"d_model": 64, "heads": 2, "layers": 2, "ff_dim": 128}
# GLIED: Flickr8k has ~30k training captions, so a narrow, shallow Transformer (~7M parameters with the 1,000-word
# attribute head) that trains on a 2-core CPU from cached features and overfits less than the paper's 512-wide one.
_GLIED_BASE = {"d_model": 256, "heads": 8, "layers": 2, "ff_dim": 1024, "dropout": 0.2}
_GLIED_TINY = {"d_model": 64, "heads": 2, "layers": 2, "ff_dim": 128, "attributes_vocab": 50}
# Per preset, per model id: model-config overrides (architectures differ, so their sizes do too).
MODEL_PRESETS: dict[str, dict[str, dict]] = {
    "base": {"sat": _LSTM_BASE, "spca": _LSTM_BASE, "stackcap": _LSTM_BASE, "a2": _A2_BASE, "glied": _GLIED_BASE},
    "tiny": {"sat": _LSTM_TINY, "spca": _LSTM_TINY, "stackcap": _LSTM_TINY, "a2": _A2_TINY, "glied": _GLIED_TINY},
}


def preset_for(name: str, model_id: str) -> Preset:
    """The named preset with the model overrides of ``model_id``; every registered model has an entry per preset."""
    return dataclasses.replace(PRESETS[name], model=dict(MODEL_PRESETS[name][model_id]))


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


def apply_overrides(preset: Preset, overrides: list[str], model_fields: dict[str, object]) -> Preset:
    """``["train.lr=1e-3", "model.hidden_dim=256", "encoder.finetune=true"]`` applied strictly.

    ``model_fields`` maps the model config's field names to their defaults, so
    model overrides are checked against the chosen architecture.
    """
    model = dict(preset.model)
    changes: dict[str, dict[str, object]] = {"train": {}, "encoder": {}}  # applied together: no order between fields
    for item in overrides:
        key, sep, value = item.partition("=")
        section, _, name = key.partition(".")
        if not sep or section not in ("train", "model", "encoder"):
            raise EdgecapError(f"--set {item}: expected SECTION.FIELD=VALUE with SECTION train, model or encoder")
        if section == "model":
            if name not in model_fields:
                raise EdgecapError(f"--set {item}: the model has no field '{name}'; known: {', '.join(model_fields)}")
            model[name] = _coerce(value, model.get(name, model_fields[name]), key)
            continue
        target = preset.train if section == "train" else preset.encoder
        known = {f.name for f in dataclasses.fields(target)}
        if name not in known:
            raise EdgecapError(f"--set {item}: {section} has no field '{name}'; known: {', '.join(sorted(known))}")
        changes[section][name] = _coerce(value, getattr(target, name), key)
    return Preset(dataclasses.replace(preset.encoder, **changes["encoder"]),
                  dataclasses.replace(preset.train, **changes["train"]), model)
