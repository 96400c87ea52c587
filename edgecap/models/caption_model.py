"""Encoder + decoder as one module: what a checkpoint restores and what export wraps."""

from __future__ import annotations

import torch
from torch import nn

from edgecap.models.encoder import grid_features


class CaptionModel(nn.Module):
    """``encode`` pixels to annotation vectors; the decoder's step contract does the rest."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) -> (N, L, C)."""
        return grid_features(self.encoder, pixels)
