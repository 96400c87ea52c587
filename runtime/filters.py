"""Logit filters of the search: what a caption may not say next (specials, repeated trigrams, early or bad endings,
banned words) and how it must end at its maximum length. Every step runs them, so they are table lookups."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from edgecap.vocab import EOS, UNK

if TYPE_CHECKING:
    from edgecap.runtime.search import SearchOptions

NEG_INF = -np.inf


def word_ids(words: Sequence[str], endings: Sequence[str]) -> frozenset[int]:
    """Vocabulary ids of ``words`` among ``endings`` (a set of words: bad endings, banned words)."""
    wanted = set(endings)
    return frozenset(i for i, w in enumerate(words) if w in wanted)


def repeats_trigram(history: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """bool (R, k): candidate ids (R, k) that would repeat a trigram of the word history (R, t)."""
    t = history.shape[1]
    if t < 3:
        return np.zeros(ids.shape, dtype=bool)
    # Trigrams starting at i <= t-3 whose first two words are the history's last two; their third words are banned.
    same_prefix = (history[:, : t - 2] == history[:, t - 2: t - 1]) & (history[:, 1: t - 1] == history[:, t - 1:])
    out = np.zeros(ids.shape, dtype=bool)
    rows = np.flatnonzero(same_prefix.any(axis=1))  # usually few: compare candidates on those rows only
    if len(rows):
        third = history[rows, 2:]
        out[rows] = (same_prefix[rows, :, None] & (third[:, :, None] == ids[rows, None, :])).any(axis=1)
    return out


@lru_cache(maxsize=16)
def id_mask(chosen: frozenset[int]) -> np.ndarray:
    """bool (max id + 2,): True at the chosen ids; the last entry (False) stands for every larger id
    (``np.take(..., mode="clip")``)."""
    mask = np.zeros(max(chosen, default=-1) + 2, dtype=bool)
    mask[list(chosen)] = True
    mask.flags.writeable = False
    return mask


def never_words(ban_unk: bool) -> int:
    """Ids below this are never emitted (pad, bos, unk when banned), eos excepted: the vocabulary's specials
    come first, in that order, so one comparison finds them."""
    return UNK + 1 if ban_unk else EOS


@lru_cache(maxsize=2)
def never_mask(ban_unk: bool) -> np.ndarray:
    """bool (never_words + 1,): True at the ids that are never emitted; the last entry (False) stands for every
    larger id, so one ``np.take(..., mode="clip")`` bans them (and eos stays allowed)."""
    mask = np.arange(never_words(ban_unk) + 1) < never_words(ban_unk)
    mask[EOS] = False
    mask.flags.writeable = False
    return mask


def filter_candidates(logprobs: np.ndarray, ids: np.ndarray, *, history: np.ndarray, position: int,
                      options: SearchOptions, banned_endings: frozenset[int] = frozenset(),
                      banned_words: frozenset[int] = frozenset()) -> np.ndarray:
    """Candidate log-probs float64 (R, k) with banned continuations set to -inf: specials, ``banned_words``, eos
    before ``min_length`` or after one of ``banned_endings``, and repeated trigrams when asked.

    ``ids`` (R, k) are the candidates of rows whose word history is ``history`` (R, position).
    The end at ``max_length`` is not a filter: see :func:`force_end`. Every step runs this, so it keeps to a few
    numpy calls: table lookups instead of chains of comparisons.
    """
    out = logprobs.astype(np.float64)  # a copy: the session keeps its buffer
    banned = never_mask(options.ban_unk).take(ids, mode="clip")
    if position < options.min_length:
        banned |= ids == EOS
    elif position > 0 and banned_endings:
        banned |= (ids == EOS) & id_mask(banned_endings).take(history[:, -1], mode="clip")[:, None]
    if banned_words:
        banned |= id_mask(banned_words).take(ids, mode="clip")
    if options.block_trigrams:
        banned |= repeats_trigram(history, ids)
    out[banned] = NEG_INF
    return out


def force_end(logprobs: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The only candidate of each row at max length: eos, as (log-probs float64 (R, 1), ids int64 (R, 1)).

    Eos is scored with its log-prob when it is among the row's k candidates. When it is not, its log-prob is
    unknown but at most the k-th candidate's, and that bound is used: ending there never ranks above ending a
    row whose eos made the top k with the same score, and the caption still gets its full length.
    """
    is_eos = ids == EOS
    eos_logprob = np.where(is_eos.any(axis=1), np.where(is_eos, logprobs, 0).sum(axis=1), logprobs[:, -1])
    return eos_logprob.astype(np.float64)[:, None], np.full((len(ids), 1), EOS, dtype=np.int64)


