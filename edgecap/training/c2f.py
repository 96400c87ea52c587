"""Coarse-to-fine reinforcement learning for multi-stage decoders (Stack-Captioning, Gu et al. 2018, eq. 15).

Every stage i samples a caption w^i and decodes one greedily, ŵ^i; its advantage is
normalised twice: by its own test-time (greedy) output, as in self-critical training,
and, past the coarse stage, by the sample of the stage before it, so a stage is
rewarded for improving on its predecessor:

    Δr(w^1) = r(w^1) - r(ŵ^1)
    Δr(w^i) = [r(w^i) - r(ŵ^i)] + [r(w^i) - r(w^{i-1})]    for i >= 2

All stages share one time loop (``sample_captions(..., stages=True)``): at each step
every stage draws its word from its own distribution and the last stage's word is fed
back, which is also the word inference feeds back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from edgecap.training.cider import CiderD
from edgecap.training.distributed import global_sum
from edgecap.training.scst import sample_captions, words_of
from edgecap.vocab import Vocab


def stage_advantages(rewards: np.ndarray, greedy_rewards: np.ndarray) -> np.ndarray:
    """Δr per stage and sample: rewards (K, R) of the samples, greedy_rewards (K, R) of each row's greedy decode."""
    advantage = rewards - greedy_rewards
    advantage[1:] += rewards[1:] - rewards[:-1]
    return advantage


def c2f_loss(decoder: nn.Module, features: torch.Tensor, image_ids: Sequence[str], *, cider: CiderD, vocab: Vocab,
             samples: int, max_length: int) -> tuple[torch.Tensor, float]:
    """The loss -sum_i Δr(w^i) log p(w^i), each stage averaged over its tokens, and the last stage's mean reward."""
    tokens, logprobs, mask = sample_captions(decoder, features, samples=samples, max_length=max_length, stages=True)
    ids = [i for i in image_ids for _ in range(samples)]
    rewards = np.stack([cider.score(ids, words_of(stage, vocab)) for stage in tokens])
    was_training = decoder.training
    decoder.eval()
    with torch.no_grad():
        greedy, _, _ = sample_captions(decoder, features, samples=1, max_length=max_length, greedy=True, stages=True)
    decoder.train(was_training)
    greedy_rewards = np.stack([cider.score(list(image_ids), words_of(stage, vocab)) for stage in greedy])
    advantage = stage_advantages(rewards, greedy_rewards.repeat(samples, axis=1))
    advantage = torch.from_numpy(advantage.astype(np.float32)).to(logprobs.device)
    mask = mask.float()
    per_stage = -(advantage[..., None] * logprobs * mask).sum((1, 2)) / global_sum(mask.sum((1, 2)))  # every rank's
    return per_stage.sum(), float(rewards[-1].mean())
