"""What every decoder's teacher-forced ``forward`` returns: the one type the training objectives read."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecoderOutput:
    logprobs: torch.Tensor  # (B, T, V) log-probs of the next word at every position (the last stage's)
    attention: torch.Tensor | None = None  # (B, T, L) attention over the grid cells at every position
    doubly_stochastic: bool = False  # the attention is the soft attention the doubly stochastic term regularises
    stage_logprobs: tuple[torch.Tensor, ...] = ()  # coarse-to-fine models: every earlier stage's (B, T, V)
    auxiliary_loss: torch.Tensor | None = None  # a model's own extra objective, already weighted (scalar)
    location_logprob: torch.Tensor | None = None  # hard attention: (B, T) log p of each sampled location
    entropy: torch.Tensor | None = None  # hard attention: (B, T) entropy of each location distribution
