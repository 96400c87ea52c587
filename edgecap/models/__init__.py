"""Model registry: model id -> (config dataclass, nn.Module class)."""

from __future__ import annotations

from dataclasses import fields

from torch import nn

from edgecap.errors import ModelError
from edgecap.models.a2 import A2, A2Config
from edgecap.models.glied import GLIED, GLIEDConfig
from edgecap.models.sat import SAT, SATConfig
from edgecap.models.spca import SPCA, SPCAConfig
from edgecap.models.stackcap import StackCap, StackCapConfig

MODELS: dict[str, tuple[type, type[nn.Module]]] = {"sat": (SATConfig, SAT), "spca": (SPCAConfig, SPCA),
                                                    "stackcap": (StackCapConfig, StackCap), "a2": (A2Config, A2),
                                                    "glied": (GLIEDConfig, GLIED)}


def build_model(model_id: str, config: dict) -> nn.Module:
    """An untrained model from its id and a config dict (as stored in checkpoints)."""
    if model_id not in MODELS:
        raise ModelError(f"unknown model '{model_id}'; choose one of {', '.join(MODELS)}")
    config_class, module_class = MODELS[model_id]
    known = {f.name for f in fields(config_class)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ModelError(f"model '{model_id}' has no option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return module_class(config_class(**config))
