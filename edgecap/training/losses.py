"""The cross-entropy objective: label-smoothed word likelihoods of every stage, the doubly stochastic attention
term and a model's own auxiliary loss, each a mean over the global batch when training is distributed."""

from __future__ import annotations

import torch

from edgecap.config import XEConfig
from edgecap.models.output import DecoderOutput


def word_nll(logprobs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """-log p of each target word: logprobs (B, T, V), target (B, T) -> (B, T)."""
    return -logprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)


def smoothed_nll(logprobs: torch.Tensor, nll: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-token cross-entropy against (1 - eps) one-hot + eps uniform; eps 0 is the plain nll."""
    return nll if not eps else (1 - eps) * nll - eps * logprobs.mean(-1)


def xe_loss(out: DecoderOutput, target: torch.Tensor, mask: torch.Tensor, cfg: XEConfig, *, n_tokens: torch.Tensor,
            n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the loss to minimise, the plain word cross-entropy it is logged as) of one batch.

    target, mask (B, T): this rank's rows; ``n_tokens`` and ``n_rows`` count the global batch, so that gradients
    summed over ranks are the global batch's means. Coarse-to-fine models add every earlier stage's cross-entropy.
    """
    nll = word_nll(out.logprobs, target)
    xe = (nll * mask).sum() / n_tokens
    loss = (smoothed_nll(out.logprobs, nll, cfg.label_smoothing) * mask).sum() / n_tokens
    for stage in out.stage_logprobs:
        loss = loss + (smoothed_nll(stage, word_nll(stage, target), cfg.label_smoothing) * mask).sum() / n_tokens
    if out.auxiliary_loss is not None:  # a mean over this rank's rows
        loss = loss + out.auxiliary_loss * (len(target) / n_rows)
    if cfg.doubly_stochastic and out.doubly_stochastic:
        coverage = (out.attention * mask.unsqueeze(-1)).sum(1)
        loss = loss + cfg.doubly_stochastic * ((1 - coverage) ** 2).sum() / (n_rows * coverage.shape[1])
    return loss, xe
