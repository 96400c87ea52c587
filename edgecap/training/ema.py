"""An exponential moving average of the trained weights: the copy dev selection scores and best.pt keeps.

On frozen features the dev CIDEr-D of the raw weights swings by a few points from one epoch to the next while the
train loss still falls; the average over the last few hundred steps is smoother, and is the model worth keeping.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class WeightAverage:
    """shadow = d * shadow + (1 - d) * weight after every optimiser step, over the parameters that train.

    The decay ramps up as ``min(decay, (1 + n) / (10 + n))`` after n updates, so the first steps, whose weights
    are far from where training goes, are forgotten quickly.
    """

    def __init__(self, module: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.params = {name: p for name, p in module.named_parameters() if p.requires_grad}
        self.shadow: dict[str, torch.Tensor] = {}
        self.reset()

    def reset(self) -> None:
        """Start the average again from the weights the module holds now."""
        self.shadow = {name: p.detach().clone() for name, p in self.params.items()}
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for name, p in self.params.items():
            self.shadow[name].lerp_(p.detach(), 1.0 - decay)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Inside the block the module holds the averaged weights; its own come back afterwards."""
        own = {name: p.detach().clone() for name, p in self.params.items()}
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(self.shadow[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in self.params.items():
                    p.copy_(own[name])

    def state_dict(self) -> dict:
        return {"updates": self.updates, "shadow": {k: v.cpu() for k, v in self.shadow.items()}}

    def load_state_dict(self, state: dict) -> None:
        missing = set(self.params) - set(state["shadow"])
        if missing:
            raise KeyError(f"weight average lacks {sorted(missing)[:3]}")
        self.updates = int(state["updates"])
        self.shadow = {name: state["shadow"][name].to(p.device, p.dtype) for name, p in self.params.items()}
