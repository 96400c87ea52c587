"""Self-critical sequence training (Rennie et al. 2017) with a CIDEr-D reward.

Sampling runs the decoder's step contract, so every model family gets SCST
without code of its own; a decoder that also has a parallel teacher-forced pass
scores its samples with it: the same policy gradient (to rounding, without
dropout), computed cheaper.
Baselines: the greedy decode of the same image, or the mean reward of the other
samples of the same image.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from edgecap.cider import CiderD
from edgecap.training.distributed import global_sum
from edgecap.vocab import BOS, EOS, PAD, Vocab


def sample_captions(decoder: nn.Module, features: torch.Tensor, *, samples: int, max_length: int,
                    greedy: bool = False, stages: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode ``samples`` captions per image of (B, L, C) features.

    Returns tokens (B*S, T) with eos included and pad after it, their log-probs
    (B*S, T) (differentiable unless under no_grad) and the mask (B*S, T) of
    positions that count (up to and including eos). Rows are image-major.

    With ``stages`` the decoder is multi-stage (``stage_step``, coarse to fine): every
    stage picks its own word from its own distribution at each step, the last stage's
    word is the one fed back, and all three tensors gain a leading stage axis (K, B*S, T).
    A row ends with its last stage's caption, so an earlier stage's caption stops at its
    own eos or there, whichever comes first.
    """
    memory, state = decoder.prepare(features)
    memory = {k: v.repeat_interleave(samples, dim=0) for k, v in memory.items()}
    state = {k: v.repeat_interleave(samples, dim=0) for k, v in state.items()}
    rows = features.shape[0] * samples
    tokens = torch.full((rows,), BOS, dtype=torch.long, device=features.device)
    alive = torch.ones(rows, dtype=torch.bool, device=features.device)
    out_tokens, out_logprobs, out_mask = [], [], []
    for t in range(max_length + 1):
        position = torch.tensor(t, device=features.device)
        if stages:
            logprobs, state, _ = decoder.stage_step(tokens, state, memory, position)
            logprobs = torch.stack(logprobs)  # (K, rows, V)
        else:
            logprobs, state, _ = decoder.step(tokens, state, memory, position)
            logprobs = logprobs.unsqueeze(0)
        if greedy:
            words = logprobs.argmax(dim=-1)
        else:
            words = torch.multinomial(logprobs.detach().exp().flatten(0, 1), 1).view(logprobs.shape[:2])
        alive = alive.expand(words.shape)
        out_mask.append(alive.clone())
        out_tokens.append(torch.where(alive, words, torch.full_like(words, PAD)))
        out_logprobs.append(logprobs.gather(-1, words.unsqueeze(-1)).squeeze(-1))
        tokens = words[-1]
        alive = alive & (words != EOS) & (tokens != EOS)
        if not alive.any():
            break
    out = tuple(torch.stack(x, -1) for x in (out_tokens, out_logprobs, out_mask))
    return out if stages else tuple(x[0] for x in out)


def policy_samples(decoder: nn.Module, features: torch.Tensor, *, samples: int,
                   max_length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sample_captions``' tokens, differentiable log-probs and mask, computed the cheaper way for the decoder.

    A decoder with a parallel teacher-forced pass (``teacher_forced``, the Transformers) samples without autograd
    and then scores its captions in one pass: backpropagating through its step loop would keep a copy of the KV
    cache per step. Dropout draws its masks anew for the scoring pass, as in every training forward.
    """
    if not hasattr(decoder, "teacher_forced"):
        return sample_captions(decoder, features, samples=samples, max_length=max_length)
    with torch.no_grad():
        tokens, _, mask = sample_captions(decoder, features, samples=samples, max_length=max_length)
    memory, _ = decoder.prepare(features)
    memory = {k: v.repeat_interleave(samples, dim=0) for k, v in memory.items()}
    inputs = torch.cat([torch.full_like(tokens[:, :1], BOS), tokens[:, :-1]], dim=1)
    logprobs, _ = decoder.teacher_forced(inputs, memory)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), mask


def words_of(tokens: torch.Tensor, vocab: Vocab) -> list[list[str]]:
    """Token rows -> word lists (up to eos), the form CIDEr-D scores."""
    return [vocab.decode(row).split() for row in tokens.tolist()]


def leave_one_out_mean(rewards: np.ndarray) -> np.ndarray:
    """Each sample's baseline: the mean reward of the other samples of its image (the last axis holds them).

    Unlike a greedy decode it is unbiased for the sample it scores: an image's advantages sum to zero.
    """
    samples = rewards.shape[-1]
    return (rewards.sum(axis=-1, keepdims=True) - rewards) / (samples - 1)


def scst_loss(decoder: nn.Module, features: torch.Tensor, image_ids: Sequence[str], *, cider: CiderD, vocab: Vocab,
              samples: int, max_length: int, baseline: str) -> tuple[torch.Tensor, float]:
    """The policy-gradient loss -(r - b) log p(w) averaged over tokens (every rank's, when distributed, so summed
    gradients are the global batch's), and this rank's mean sample reward."""
    tokens, logprobs, mask = policy_samples(decoder, features, samples=samples, max_length=max_length)
    ids = [i for i in image_ids for _ in range(samples)]
    rewards = cider.score(ids, words_of(tokens, vocab)).reshape(len(image_ids), samples)
    if baseline == "greedy":
        was_training = decoder.training
        decoder.eval()
        with torch.no_grad():
            greedy, _, _ = sample_captions(decoder, features, samples=1, max_length=max_length, greedy=True)
        decoder.train(was_training)
        base = cider.score(list(image_ids), words_of(greedy, vocab))[:, None]
    else:
        base = leave_one_out_mean(rewards)
    advantage = torch.from_numpy((rewards - base).reshape(-1).astype(np.float32)).to(logprobs.device)
    mask = mask.float()
    loss = -(advantage[:, None] * logprobs * mask).sum() / global_sum(mask.sum())  # over every rank's tokens
    return loss, float(rewards.mean())
