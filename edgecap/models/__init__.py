"""The architectures edgecap trains, by model id: the one registry that training, export and the CLI read.

Torch-free: an entry names its module and classes, which are imported only when a model is built, so the command
line lists model ids on an install without torch. Adding an architecture is a model file plus one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from importlib import import_module
from typing import TYPE_CHECKING

from edgecap.errors import ModelError

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ModelEntry:
    module: str  # where the classes live
    model: str  # the nn.Module class: prepare / step / teacher-forced forward
    config: str  # its frozen config dataclass
    paper: str  # what it implements, for --help and the docs
    sizes: dict[str, dict] = field(default_factory=dict)  # size preset ("tiny", "base") -> model-config overrides
    coarse_to_fine: bool = False  # every stage has its own output (``stage_step``): self-critical training is C2F RL

    def classes(self) -> tuple[type, type[nn.Module]]:
        module = import_module(self.module)
        return getattr(module, self.config), getattr(module, self.model)


_LSTM_BASE = {"embed_dim": 256, "att_dim": 256}
_LSTM_TINY = {"embed_dim": 64, "hidden_dim": 128, "att_dim": 64, "dropout": 0.1}
# Narrower than the papers' 512 for COCO: Flickr8k has a fifth of COCO's captions and these train on a 2-core CPU.
_A2_BASE = {"d_model": 256, "heads": 8, "layers": 3, "ff_dim": 1024}
_A2_TINY = {"d_model": 64, "heads": 2, "layers": 2, "ff_dim": 128}
_GLIED_BASE = {"d_model": 256, "heads": 8, "layers": 2, "ff_dim": 1024, "dropout": 0.2}
_GLIED_TINY = {"d_model": 64, "heads": 2, "layers": 2, "ff_dim": 128, "attributes_vocab": 50}

MODELS: dict[str, ModelEntry] = {
    "sat": ModelEntry("edgecap.models.sat", "SAT", "SATConfig", "Show, Attend and Tell (Xu et al., 2015)",
                      {"base": _LSTM_BASE, "tiny": _LSTM_TINY}),
    "spca": ModelEntry("edgecap.models.spca", "SPCA", "SPCAConfig",
                       "Structure-preserving convolutional attention (SPCA)", {"base": _LSTM_BASE, "tiny": _LSTM_TINY}),
    "stackcap": ModelEntry("edgecap.models.stackcap", "StackCap", "StackCapConfig",
                           "Stack-Captioning, coarse to fine (Gu et al., 2018)",
                           {"base": _LSTM_BASE, "tiny": _LSTM_TINY}, coarse_to_fine=True),
    "a2": ModelEntry("edgecap.models.a2", "A2", "A2Config", "the Attention-Aligned Transformer (A²)",
                     {"base": _A2_BASE, "tiny": _A2_TINY}),
    "glied": ModelEntry("edgecap.models.glied", "GLIED", "GLIEDConfig",
                        "global and local information exploring and distilling (GLIED)",
                        {"base": _GLIED_BASE, "tiny": _GLIED_TINY}),
}

DERIVED_FIELDS = ("vocab_size", "feature_dim", "num_locations")
"""Model-config fields that come from the data and the encoder, never from a preset or ``--set``."""


def entry(model_id: str) -> ModelEntry:
    if model_id not in MODELS:
        raise ModelError(f"unknown model '{model_id}'; choose one of {', '.join(MODELS)}")
    return MODELS[model_id]


def settable_fields(model_id: str) -> dict[str, object]:
    """The model config's fields a preset or ``--set model.FIELD`` may change, with their defaults."""
    return {f.name: f.default for f in fields(entry(model_id).classes()[0]) if f.name not in DERIVED_FIELDS}


def build_model(model_id: str, config: dict) -> nn.Module:
    """An untrained model from its id and a config dict (as stored in checkpoints)."""
    config_class, module_class = entry(model_id).classes()
    known = {f.name for f in fields(config_class)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ModelError(f"model '{model_id}' has no option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    try:
        return module_class(config_class(**config))
    except (ValueError, TypeError, RuntimeError) as err:  # torch's own checks: dropout above 1, sizes below 1
        raise ModelError(f"model '{model_id}' cannot be built with these options ({str(err).splitlines()[0][:120]});"
                         " check the --set model.* values") from None
