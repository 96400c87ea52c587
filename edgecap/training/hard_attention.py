"""REINFORCE for Show, Attend and Tell's stochastic hard attention (Xu et al. 2015, section 4.1).

The paper adds lambda_r (log p(y|s,a) - b) dlog p(s|a) and lambda_e dH[s] to each caption's dlog p(y|s,a), with b a
moving average of log p(y|s,a). Here the likelihood term is a mean over tokens, so these terms are too (per caption
they would outweigh it by the caption's length). REINFORCE acts on the rows that sampled a location; the rows that
took the expected context train as soft attention, and b follows the sampled rows only.
"""

from __future__ import annotations

import torch

from edgecap.config import HardAttentionConfig
from edgecap.models.output import DecoderOutput
from edgecap.training.distributed import global_sum


def hard_attention_loss(out: DecoderOutput, nll: torch.Tensor, mask: torch.Tensor, sampled: torch.Tensor, *,
                        baseline: float, cfg: HardAttentionConfig,
                        n_tokens: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(the REINFORCE and entropy terms to add to the loss, the moving baseline updated with this batch).

    nll, mask (B, T) of the words; sampled (B,) bool: the rows whose context was a sampled location.
    """
    caption_logprob = -(nll * mask).sum(1).detach()
    n_sampled = float(global_sum(sampled.float().sum()))
    updated = baseline
    if n_sampled:
        batch_mean = float(global_sum((caption_logprob * sampled.float()).sum())) / n_sampled
        updated = cfg.baseline_decay * baseline + (1 - cfg.baseline_decay) * batch_mean
    location_logprob = (out.location_logprob * mask).sum(1)
    entropy = (out.entropy * mask).sum(1)
    reinforce = ((caption_logprob - baseline) * location_logprob).sum()
    return -(cfg.reinforce_weight * reinforce + cfg.entropy * entropy.sum()) / n_tokens, updated
