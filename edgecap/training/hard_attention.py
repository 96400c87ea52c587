"""The per-caption baseline of hard attention's REINFORCE term (Show, Attend and Tell, section 4.1)."""

from __future__ import annotations

import torch

from edgecap.vocab import PAD


def caption_logprob(logprobs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """log p(y) of each row's caption: its words' log-probabilities (B, T, V) summed over the non-pad targets."""
    words = logprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return (words * (target != PAD)).sum(1)


@torch.no_grad()
def expected_context_logprob(decoder: torch.nn.Module, features: torch.Tensor, tokens: torch.Tensor,
                             sampled: torch.Tensor) -> torch.Tensor:
    """log p(y | a) of each sampled row's caption decoded with the expected context; 0 on the other rows.

    The paper's moving-average baseline follows the mean log-likelihood over captions, so its advantage
    log p(y | s, a) - b mostly says how long and how hard a caption is (a spread of about 17 nats on
    Flickr8k), not whether the sampled locations helped. The same caption under the expected context
    knows its length and words, and costs one teacher-forced pass without gradients over the sampled rows.
    """
    baseline = torch.zeros(len(tokens), device=tokens.device)
    if sampled.any():
        out = decoder(features[sampled], tokens[sampled, :-1])
        baseline[sampled] = caption_logprob(out["logprobs"], tokens[sampled, 1:])
    return baseline
