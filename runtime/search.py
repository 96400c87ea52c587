"""Backend-agnostic beam search in numpy: step function -> logit filters -> beam update -> ranker.

The search sees a decoder only through ``StepSession`` (DESIGN.md §6), so the
PyTorch reference, ONNX Runtime and TensorRT are driven by the very same code
and parity measures only what export and precision change. The session returns
the top-k candidates of every row; filters work on those k, which is why k
defaults to twice the beam. Greedy decoding is beam search with one beam.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edgecap.vocab import BOS, EOS, PAD, UNK

NEG_INF = -np.inf
DEFAULT_BAD_ENDINGS = ("a", "an", "the", "of", "with", "and", "in", "on", "at", "to", "its", "their", "his", "her",
                       "for", "from", "by", "is", "are")


class StepSession(Protocol):
    """A decoder holding per-row state and memory for N rows."""

    def step(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """tokens int64 (N,); reorder int64 (N,): new row i continues previous row reorder[i].

        Returns top-k log-probs float32 (N, k) sorted descending, their ids int64 (N, k)
        and the attention float32 (N, L) of this step.
        """

    def tile_memory(self, beam_size: int) -> None:
        """Repeat every memory row ``beam_size`` times (row b -> rows b*beam .. b*beam+beam-1)."""


@dataclass(frozen=True)
class SearchOptions:
    beam_size: int = 3  # hypotheses kept per image; 1 is greedy decoding
    max_length: int = 20  # words per caption, eos excluded
    min_length: int = 1  # eos is banned before this many words
    length_penalty: float = 0.0  # alpha of the ranker: logprob / len**alpha (0 ranks by the raw sum)
    block_trigrams: bool = False  # ban a word that would repeat a trigram already in the hypothesis
    ban_unk: bool = True  # never emit <unk>
    bad_endings: tuple[str, ...] = DEFAULT_BAD_ENDINGS  # eos is banned right after these words
    candidates: int = 0  # k the step returns per row; 0 means 2 * beam_size

    def __post_init__(self):
        for name, low in (("beam_size", 1), ("max_length", 1), ("min_length", 0), ("candidates", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"SearchOptions.{name} must be >= {low}, got {getattr(self, name)}")
        if self.min_length > self.max_length:
            raise ValueError(f"SearchOptions.min_length ({self.min_length}) exceeds max_length ({self.max_length})")
        if self.length_penalty < 0:
            raise ValueError(f"SearchOptions.length_penalty must be >= 0, got {self.length_penalty}")

    @property
    def k(self) -> int:
        return self.candidates or 2 * self.beam_size


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # word ids, no bos/eos
    logprob: float  # sum of token log-probs including eos
    score: float  # ranker score (length penalty applied)
    attention: np.ndarray = field(repr=False)  # float32 (len(tokens) + 1, L): one row per step, eos step included


def bad_ending_ids(words: Sequence[str], endings: Sequence[str]) -> frozenset[int]:
    """Vocabulary ids of the words after which a caption may not end."""
    wanted = set(endings)
    return frozenset(i for i, w in enumerate(words) if w in wanted)


def rank_score(logprob: float, length: int, alpha: float) -> float:
    """GNMT-free simple length normalisation: logprob / len**alpha."""
    return logprob / max(1, length) ** alpha if alpha else logprob


def filter_candidates(logprobs: np.ndarray, ids: np.ndarray, history: np.ndarray, position: int,
                      options: SearchOptions, banned_endings: frozenset[int]) -> np.ndarray:
    """Candidate log-probs (R, k) with banned continuations set to -inf; history (R, position) of word ids."""
    out = logprobs.astype(np.float64, copy=True)
    out[(ids == PAD) | (ids == BOS)] = NEG_INF  # never words
    if options.ban_unk:
        out[ids == UNK] = NEG_INF
    eos = ids == EOS
    if position < options.min_length:
        out[eos] = NEG_INF
    if position >= options.max_length:
        out[~eos] = NEG_INF
    if banned_endings and position > 0:
        after_bad = np.isin(history[:, -1], list(banned_endings))
        out[eos & after_bad[:, None]] = NEG_INF
    if options.block_trigrams and position >= 3:
        for r in range(len(ids)):
            seen = {tuple(history[r, i:i + 3]) for i in range(position - 2)}
            last_two = tuple(history[r, -2:])
            for j in range(ids.shape[1]):
                if (*last_two, ids[r, j]) in seen:
                    out[r, j] = NEG_INF
    return out


def _forced_end(logprobs: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Per-row log-prob of ending at max length: eos's if among the candidates, else the k-th (an upper bound)."""
    is_eos = ids == EOS
    return np.where(is_eos.any(axis=1), np.where(is_eos, logprobs, 0.0).sum(axis=1), logprobs[:, -1])


def beam_search(session: StepSession, batch_size: int, options: SearchOptions, *,
                bad_ending_ids: frozenset[int] = frozenset()) -> list[list[Hypothesis]]:
    """Up to ``beam_size`` finished hypotheses per image, best first, deterministic."""
    beam, alpha = options.beam_size, options.length_penalty
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    done = np.zeros(batch_size, dtype=bool)
    tokens = np.full(batch_size, BOS, dtype=np.int64)
    reorder = np.arange(batch_size, dtype=np.int64)
    cumulative = np.zeros((batch_size, 1))  # (B, beams so far): log-prob of each live beam
    history = np.zeros((batch_size, 1, 0), dtype=np.int64)  # (B, beams, t) word ids
    attention_history: np.ndarray | None = None  # (B, beams, t, L)
    for position in range(options.max_length + 1):
        logprobs, ids, attention = session.step(tokens, reorder, position)
        if position == 0:
            session.tile_memory(beam)
        rows_per_image = cumulative.shape[1]
        k = ids.shape[1]
        flat_history = history.reshape(batch_size * rows_per_image, position)
        filtered = filter_candidates(logprobs, ids, flat_history, position, options, bad_ending_ids)
        if position >= options.max_length:
            filtered[:, 0] = np.where(np.isfinite(cumulative.reshape(-1)), _forced_end(logprobs, ids), NEG_INF)
            ids = ids.copy()
            ids[:, 0] = EOS
            filtered[:, 1:] = NEG_INF
        attention = attention.reshape(batch_size, rows_per_image, 1, -1)
        steps_attention = attention if attention_history is None else np.concatenate(
            [attention_history, attention], axis=2)
        totals = (cumulative[:, :, None] + filtered.reshape(batch_size, rows_per_image, k))
        ids = ids.reshape(batch_size, rows_per_image, k)
        totals = totals.reshape(batch_size, rows_per_image * k)
        flat_ids = ids.reshape(batch_size, rows_per_image * k)
        if totals.shape[1] < beam:  # fewer candidates than beams (first step, small k): pad with dead ones
            missing = ((0, 0), (0, beam - totals.shape[1]))
            totals = np.pad(totals, missing, constant_values=NEG_INF)
            flat_ids = np.pad(flat_ids, missing, constant_values=PAD)
        is_eos = flat_ids == EOS
        # An eos among an image's top `beam` candidates ends that hypothesis (so one beam is greedy decoding);
        # the live beams continue with the best `beam` other candidates.
        top = np.argsort(-totals, axis=1, kind="stable")[:, :beam]
        ends = np.take_along_axis(is_eos & np.isfinite(totals), top, axis=1) & ~done[:, None]
        for b, rank in zip(*np.nonzero(ends), strict=True):
            r = top[b, rank] // k
            words = tuple(int(w) for w in history[b, r])
            total = float(totals[b, top[b, rank]])
            finished[b].append(Hypothesis(words, total, rank_score(total, len(words), alpha),
                                          steps_attention[b, r].astype(np.float32)))
        totals = np.where(is_eos, NEG_INF, totals)
        choice = np.argsort(-totals, axis=1, kind="stable")[:, :beam]
        chosen = np.take_along_axis(totals, choice, axis=1)
        parent = np.minimum(choice // k, rows_per_image - 1)
        for b in np.nonzero(~done)[0]:
            if not finished[b] and not np.isfinite(chosen[b, 0]):
                # Every continuation was filtered out: end the best live beam where it stands.
                r = int(np.argmax(cumulative[b]))
                words = tuple(int(w) for w in history[b, r])
                total = float(cumulative[b, r])
                finished[b].append(Hypothesis(words, total, rank_score(total, len(words), alpha),
                                              steps_attention[b, r].astype(np.float32)))
            finished[b].sort(key=lambda h: -h.score)
            del finished[b][beam:]
            if len(finished[b]) == beam:
                best_live = chosen[b, 0]
                bound = best_live / options.max_length ** alpha if alpha else best_live
                done[b] = not np.isfinite(best_live) or bound <= finished[b][-1].score
        if done.all() or position == options.max_length:
            break
        new_words = np.take_along_axis(flat_ids, choice, axis=1)
        history = np.concatenate([np.take_along_axis(history, parent[:, :, None], axis=1), new_words[:, :, None]],
                                 axis=2)
        attention_history = np.take_along_axis(steps_attention, parent[:, :, None, None], axis=1)
        cumulative = np.where(done[:, None], NEG_INF, chosen)
        tokens = np.where(np.isfinite(cumulative), new_words, PAD).reshape(-1).astype(np.int64)
        reorder = (np.arange(batch_size)[:, None] * rows_per_image + parent).reshape(-1).astype(np.int64)
    return [sorted(hyps, key=lambda h: -h.score) for hyps in finished]
