"""What every decoder's teacher-forced ``forward`` returns, the one type the training objectives read, and how it
reads photos shared by several captions."""

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


def per_caption(tensors: dict[str, torch.Tensor], rows: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """A photo's memory or state repeated for each of its captions: ``rows`` (B,) is each caption's photo (None:
    caption i is photo i). A batch of several captions per photo encodes each photo once."""
    return tensors if rows is None else {k: v.index_select(0, rows) for k, v in tensors.items()}
