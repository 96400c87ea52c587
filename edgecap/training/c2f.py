"""Coarse-to-fine reinforcement learning for multi-stage decoders (Stack-Captioning, Gu et al. 2018, eq. 15).

Every stage i samples a caption w^i and decodes one greedily, ŵ^i; its advantage is
normalised twice: by its own test-time (greedy) output, as in self-critical training,
and, past the coarse stage, by the sample of the stage before it, so a stage is
rewarded for improving on its predecessor:

    Δr(w^1) = r(w^1) - r(ŵ^1)
    Δr(w^i) = [r(w^i) - r(ŵ^i)] + [r(w^i) - r(w^{i-1})]    for i >= 2

``baseline="greedy"`` is the paper's r(ŵ^i). The default ``"mean"`` puts in its place the mean reward of
the other samples of the same image and stage (as SCST's default does), which is unbiased for the sample
it scores: sampled captions score far below greedy ones, so greedy-baselined advantages are almost all
negative. The inter-stage term is eq. 15's in both cases.

All stages share one time loop (``sample_captions(..., stages=True)``): at each step
every stage draws its word from its own distribution and the last stage's word is fed
back, which is also the word inference feeds back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from edgecap.cider import CiderD
from edgecap.models import MODELS
from edgecap.training.distributed import global_sum
from edgecap.training.scst import leave_one_out_mean, sample_captions, scst_loss, words_of
from edgecap.vocab import Vocab


def stage_advantages(rewards: np.ndarray, baselines: np.ndarray) -> np.ndarray:
    """Δr per stage and sample: rewards (K, R) of the samples, baselines (K, R) each row's baseline per stage."""
    advantage = rewards - baselines
    advantage[1:] += rewards[1:] - rewards[:-1]
    return advantage


def _greedy_rewards(decoder: nn.Module, features: torch.Tensor, image_ids: Sequence[str], *, cider: CiderD,
                    vocab: Vocab, max_length: int) -> np.ndarray:
    """(K, images): CIDEr-D of every stage's greedy decode, in eval mode as at test time."""
    was_training = decoder.training
    decoder.eval()
    with torch.no_grad():
        greedy, _, _ = sample_captions(decoder, features, samples=1, max_length=max_length, greedy=True, stages=True)
    decoder.train(was_training)
    return np.stack([cider.score(list(image_ids), words_of(stage, vocab)) for stage in greedy])


def c2f_loss(decoder: nn.Module, features: torch.Tensor, image_ids: Sequence[str], *, cider: CiderD, vocab: Vocab,
             samples: int, max_length: int, baseline: str = "mean") -> tuple[torch.Tensor, float]:
    """The loss -sum_i Δr(w^i) log p(w^i), each stage averaged over its tokens, and the last stage's mean reward.

    ``baseline``: "mean" (of the image's other samples in the same stage) or "greedy" (the paper's).
    """
    tokens, logprobs, mask = sample_captions(decoder, features, samples=samples, max_length=max_length, stages=True)
    ids = [i for i in image_ids for _ in range(samples)]
    rewards = np.stack([cider.score(ids, words_of(stage, vocab)) for stage in tokens])
    if baseline == "greedy":
        baselines = _greedy_rewards(decoder, features, image_ids, cider=cider, vocab=vocab,
                                    max_length=max_length).repeat(samples, axis=1)
    else:
        baselines = leave_one_out_mean(rewards.reshape(len(rewards), len(image_ids), samples)).reshape(rewards.shape)
    advantage = torch.from_numpy(stage_advantages(rewards, baselines).astype(np.float32)).to(logprobs.device)
    mask = mask.float()
    per_stage = -(advantage[..., None] * logprobs * mask).sum((1, 2)) / global_sum(mask.sum((1, 2)))  # every rank's
    return per_stage.sum(), float(rewards[-1].mean())


def self_critical_objective(model_id: str, objective: str = "auto") -> Callable[..., tuple[torch.Tensor, float]]:
    """The loss of a run's self-critical phase (``scst.objective``): ``c2f_loss`` for "c2f", and for "auto" on a
    multi-stage decoder; otherwise ``scst_loss``, which rewards the caption a decoder outputs (its last stage's)."""
    coarse_to_fine = objective == "c2f" or (objective == "auto" and MODELS[model_id].coarse_to_fine)
    return c2f_loss if coarse_to_fine else scst_loss
