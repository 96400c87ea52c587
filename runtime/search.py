"""Backend-agnostic beam search in numpy: step -> logit filters -> beam update -> ranker.

The search sees a decoder only through ``StepSession`` (docs/design.md), so the
PyTorch reference, ONNX Runtime and TensorRT are driven by the very same code
and parity measures only what export and precision change. The session returns
the top-k candidates of every row; filters work on those k, which is why k
defaults to twice the beam. Greedy decoding is beam search with one beam (with
a length penalty that beam goes on past an eos while a longer caption could
still outrank the finished one).

Rows are image-major: after the first step row ``b * beam + j`` is beam ``j``
of image ``b``. The beam update owns no model state: it emits back-pointers
(the ``reorder`` of the next step) and the session gathers its state by them.
Attention is not copied along the beams at every step; it is traced back
through the stored back-pointers once, for the hypotheses that are returned.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from edgecap.runtime.beams import NEG_INF, BeamUpdate, update_beams, update_groups
from edgecap.runtime.filters import filter_candidates, force_end
from edgecap.vocab import BOS, PAD

DEFAULT_BAD_ENDINGS = ("a", "an", "the", "of", "with", "and", "in", "on", "at", "to", "its", "their", "his", "her",
                       "for", "from", "by", "is", "are")


class StepSession(Protocol):
    """A decoder holding per-row state and memory for N rows."""

    def step(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """tokens int64 (N,); reorder int64 (N,): new row i continues previous row reorder[i].

        Returns top-k log-probs float32 (N, k) sorted descending, their ids int64 (N, k)
        and the attention float32 (N, L) of this step. The search copies the attention
        before the next call, so the session may reuse its output buffers.
        """

    def tile(self, beam_size: int) -> None:
        """Repeat every memory and state row ``beam_size`` times (row b -> rows b*beam .. b*beam+beam-1).

        Called once, before the first step, so every tensor of every step has the same N = batch * beam rows:
        the one dynamic dimension of the graph contract (docs/design.md).
        """


@dataclass(frozen=True)
class SearchOptions:
    beam_size: int = 3  # hypotheses kept per image; 1 is greedy decoding
    max_length: int = 20  # words per caption, eos excluded
    min_length: int = 1  # eos is banned before this many words
    length_penalty: float = 0.0  # alpha of the ranker: logprob / len**alpha (0 ranks by the raw sum)
    block_trigrams: bool = False  # ban a word that would repeat a trigram already in the hypothesis
    ban_unk: bool = True  # never emit <unk>
    bad_endings: tuple[str, ...] = DEFAULT_BAD_ENDINGS  # eos is banned right after these words
    learned_endings: bool = False  # ban instead the endings the model's training captions (almost) never had
    ban_words: tuple[str, ...] = ()  # words never emitted
    require_words: tuple[str, ...] = ()  # the best caption found holding all of them is chosen; else it says which not
    n_best: int = 1  # captions returned per image, best first (at most beam_size; with sample, the samples)
    patience: float = 1.0  # an image is done once patience x beam_size captions have ended (<1 stops sooner)
    groups: int = 1  # diverse beam search: beam_size / groups beams per group, each group penalised for the
    diversity: float = 0.5  # words earlier groups chose at the same step, diversity x times chosen (Hamming)
    sample: bool = False  # draw each word at random instead of searching (n_best captions per image)
    temperature: float = 1.0  # sampling: p ∝ exp(logprob / temperature)
    top_k: int = 0  # sampling: from the k most likely allowed candidates (0: all the step returns)
    top_p: float = 1.0  # sampling: from the fewest candidates whose probability sums to top_p (nucleus)
    seed: int = 0  # sampling: the random draws are repeatable
    candidates: int = 0  # k candidates per row the search reads from each step; 0 means 2 * beam_size

    def __post_init__(self):
        for name, low in (("beam_size", 1), ("max_length", 1), ("min_length", 0), ("candidates", 0), ("n_best", 1),
                          ("top_k", 0), ("seed", 0), ("groups", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"SearchOptions.{name} must be an int, got {value!r}")
            if value < low:
                raise ValueError(f"SearchOptions.{name} must be >= {low}, got {value}")
        if self.min_length > self.max_length:
            raise ValueError(f"SearchOptions.min_length ({self.min_length}) exceeds max_length ({self.max_length})")
        for name, ok, bound in (("length_penalty", self.length_penalty >= 0, ">= 0"),
                                ("patience", self.patience > 0, "> 0"), ("temperature", self.temperature > 0, "> 0"),
                                ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
                                ("diversity", self.diversity >= 0, ">= 0")):
            if not ok:  # also false for nan
                raise ValueError(f"SearchOptions.{name} must be {bound}, got {getattr(self, name)}")
        if self.beam_size % self.groups or (self.sample and self.groups > 1):
            raise ValueError(f"SearchOptions.groups ({self.groups}) must divide beam_size ({self.beam_size}), and "
                             "sampling has no groups")
        if not self.sample and self.n_best > self.beam_size:
            raise ValueError(f"SearchOptions.n_best ({self.n_best}) exceeds beam_size ({self.beam_size}): a beam "
                             "search keeps beam_size captions")
        for name in ("bad_endings", "ban_words", "require_words"):
            words = getattr(self, name)
            if isinstance(words, str):
                raise TypeError(f"SearchOptions.{name} must be a tuple of words, got the string {words!r}")

    @property
    def k(self) -> int:
        """Candidates per row read from each step: twice the beam, so filters leave enough; more for a larger top_k."""
        return self.candidates or max(2 * self.beam_size, self.top_k if self.sample else 0)

    def overridden(self, items: Sequence[str]) -> SearchOptions:
        """These options with ``FIELD=VALUE`` items applied (words as ``a+b``); a ValueError names a bad item."""
        changes = {}
        fields_ = {f.name: f for f in dataclasses.fields(self)}
        for item in items:
            name, sep, value = item.partition("=")
            if not sep or name not in fields_ or name == "candidates":
                raise ValueError(f"--search {item}: expected FIELD=VALUE with FIELD one of "
                                 f"{', '.join(n for n in fields_ if n != 'candidates')}")
            current = getattr(self, name)
            if isinstance(current, tuple):
                changes[name] = tuple(w for w in value.split("+") if w) if value != "none" else ()
            elif isinstance(current, bool):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(f"--search {item}: expected true or false")
                changes[name] = value.lower() in ("true", "1", "yes")
            else:
                try:
                    changes[name] = type(current)(value)
                except ValueError:
                    raise ValueError(f"--search {item}: expected a {type(current).__name__}") from None
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # word ids, no bos/eos
    logprob: float  # sum of token log-probs including eos
    score: float  # ranker score (length penalty applied)
    attention: np.ndarray = field(repr=False)  # float32 (len(tokens) + 1, L): one row per step, eos step included


# ---- ranker -------------------------------------------------------------------------------------------------------

def rank_score(logprob: float, length: int, alpha: float) -> float:
    """Ranker score of a finished hypothesis: logprob / len**alpha (len counted as at least 1)."""
    return logprob / max(1, length) ** alpha if alpha else logprob


class _Finished:
    """The best ``beam`` finished hypotheses of each image, best first; on equal scores the earlier one wins."""

    class Record(NamedTuple):
        score: float
        logprob: float
        tokens: tuple[int, ...]
        step: int  # step at which it ended
        row: int  # its row among that step's session rows

    def __init__(self, batch_size: int, beam: int, alpha: float):
        self.beam, self.alpha = beam, alpha
        self.records: list[list[_Finished.Record]] = [[] for _ in range(batch_size)]
        self.count = np.zeros(batch_size, dtype=np.int64)
        self.worst = np.full(batch_size, NEG_INF)  # score of each image's worst kept hypothesis
        self.full = 0  # images that hold ``beam`` hypotheses: until one does, no image can be done by its bound

    def add(self, image: int, words: np.ndarray, logprob: float, *, step: int, row: int) -> None:
        """Keep the hypothesis of ``words`` (t,) ending at ``row`` of ``step`` if it is among the image's best."""
        score = rank_score(logprob, len(words), self.alpha)
        kept = self.records[image]
        if len(kept) == self.beam and score <= kept[-1].score:
            return
        kept.append(self.Record(score, logprob, tuple(words.tolist()), step, row))
        kept.sort(key=lambda r: -r.score)  # stable
        del kept[self.beam:]
        if len(kept) == self.beam > self.count[image]:
            self.full += 1
        self.count[image], self.worst[image] = len(kept), kept[-1].score

    def hypotheses(self, attentions: list[np.ndarray], reorders: list[np.ndarray]) -> list[list[Hypothesis]]:
        """Hypotheses with their attention traced back through each step's (N, L) attention and reorder."""
        flat = [r for kept in self.records for r in kept]
        if not flat:
            return [[] for _ in self.records]
        last = max(r.step for r in flat)
        # Each hypothesis' row at every step, followed back through the back-pointers in plain Python: a few
        # dozen list lookups for a batch-1 caption, where a numpy call per step would cost more than the trace.
        pointers = [reorder.tolist() for reorder in reorders[: last + 1]]
        path = []  # (H, S): row of hypothesis h at step s (0 after it ended)
        for record in flat:
            rows, row = [0] * (last + 1), record.row
            for s in range(record.step, -1, -1):
                rows[s] = row
                row = pointers[s][row]
            path.append(rows)
        traced = np.stack(attentions[: last + 1])[np.arange(last + 1), np.array(path, dtype=np.int64)]  # (H, S, L)
        it = iter(range(len(flat)))
        return [[Hypothesis(r.tokens, r.logprob, r.score, traced[next(it), : r.step + 1]) for r in kept]
                for kept in self.records]


# ---- the search ---------------------------------------------------------------------------------------------------

def _record_finished(update: BeamUpdate, cumulative: np.ndarray, history: np.ndarray, finished: _Finished,
                     done: np.ndarray, *, position: int, length_bound: float) -> bool:
    """Add this step's ended hypotheses to ``finished`` and mark the images that are done (``done``, in place);
    True when some image is done.

    An image is done once it has no live beam (a done image's rows stay at -inf, so it stays so), or when it holds
    ``beam`` hypotheses and, since adding words only lowers a log-prob (<= 0), no live beam can score above
    best / max_length**alpha. An image left with no live beam and no hypothesis ends its best beam where it stands.
    While every beam lives and no image is full, nothing is done: the common step skips the bookkeeping.
    """
    beam = cumulative.shape[1]
    for b, r, logprob in zip(update.ended_image.tolist(), update.ended_row.tolist(), update.ended_logprob.tolist(),
                             strict=True):
        finished.add(b, history[b * beam + r], logprob, step=position, row=b * beam + r)
    best = update.cumulative.max(axis=1)  # beam 0, but for diverse groups, whose beams rank by penalised scores
    alive = np.isfinite(best)
    all_alive = bool(alive.all())
    if not all_alive:
        for b in (~done & ~alive & (finished.count == 0)).nonzero()[0].tolist():
            r = int(cumulative[b].argmax())
            finished.add(b, history[b * beam + r], float(cumulative[b, r]), step=position, row=b * beam + r)
        done |= ~alive
    if finished.full:
        done |= (finished.count == finished.beam) & (best / length_bound <= finished.worst)
    return not all_alive or (finished.full > 0 and bool(done.any()))


class BeamSearch:
    """One beam search over ``batch_size`` images, advanced one step at a time by whoever runs the step graph.

    :func:`beam_search` drives it over a session of its own; an in-flight scheduler drives many at once, each over
    its own rows of one shared step batch, and gets the same captions. ``tokens``, ``reorder`` and ``position``
    are what the next step call takes for this search's ``rows`` rows (``reorder`` indexes them, from 0); ``done``
    is set once the search needs no more steps.
    """

    def __init__(self, batch_size: int, options: SearchOptions, *, bad_ending_ids: frozenset[int] = frozenset(),
                 banned_ids: frozenset[int] = frozenset()):
        self.batch_size, self.options = batch_size, options
        self.groups, self.k = options.groups, options.k
        self.beam = options.beam_size // self.groups  # diverse groups search as images of their own
        images = batch_size * self.groups
        self.endings, self.banned = frozenset(bad_ending_ids), frozenset(banned_ids)
        self.finished = _Finished(images, max(1, math.ceil(options.patience * self.beam)), options.length_penalty)
        self.image_done = np.zeros(images, dtype=bool)
        self.first_rows = np.arange(0, images * self.beam, self.beam, dtype=np.int64)[:, None]  # each image's beam 0
        self.length_bound = options.max_length ** options.length_penalty
        self.rows = images * self.beam
        self.cumulative = np.full((images, self.beam), NEG_INF)  # (B, beam): log-prob of each live beam
        self.cumulative[:, 0] = 0.0
        self.history = np.zeros((self.rows, 0), dtype=np.int64)  # (N, position) word ids of each session row
        self.tokens = np.full(self.rows, BOS, dtype=np.int64)
        self.reorder = np.arange(self.rows, dtype=np.int64)
        self.position = 0
        self.done = False
        self.attentions: list[np.ndarray] = []  # per step (N, L), copied: the session may reuse its buffers
        self.reorders: list[np.ndarray] = []  # per step (N,): the back-pointers

    def advance(self, logprobs: np.ndarray, ids: np.ndarray, attention: np.ndarray) -> None:
        """Take the step's outputs for this search's rows and prepare the next step (or set ``done``)."""
        options, position = self.options, self.position
        if not len(logprobs) == len(ids) == len(attention) == len(self.tokens):
            raise ValueError(f"the step session returned {len(logprobs)}, {len(ids)} and {len(attention)} rows of "
                             f"log-probs, ids and attention for {len(self.tokens)} tokens at position {position}")
        self.attentions.append(np.array(attention, dtype=np.float32))
        self.reorders.append(self.reorder)
        if ids.shape[1] != self.k:  # a graph exported for a larger beam returns more candidates than this one reads
            logprobs, ids = logprobs[:, :self.k], ids[:, :self.k]
        if position < options.max_length:
            scores = filter_candidates(logprobs, ids, history=self.history, position=position, options=options,
                                       banned_endings=self.endings, banned_words=self.banned)
        else:
            scores, ids = force_end(logprobs, ids)
        update = (update_beams(self.cumulative, scores, ids, self.beam) if self.groups == 1
                  else update_groups(self.cumulative, scores, ids, self.beam, self.groups, options.diversity))
        some_done = _record_finished(update, self.cumulative, self.history, self.finished, self.image_done,
                                     position=position, length_bound=self.length_bound)
        if position == options.max_length or some_done and self.image_done.all():
            self.done = True
            return
        self.reorder = (self.first_rows + update.parent).reshape(-1)
        self.history = np.concatenate([self.history[self.reorder], update.words.reshape(-1, 1)], axis=1)
        self.cumulative = (np.where(self.image_done[:, None], NEG_INF, update.cumulative) if some_done
                           else update.cumulative)
        self.tokens = np.where(np.isfinite(self.cumulative), update.words, PAD).reshape(-1).astype(np.int64,
                                                                                                   copy=False)
        self.position = position + 1

    def result(self) -> list[list[Hypothesis]]:
        """Up to ``beam_size`` finished hypotheses per image, best first."""
        found = self.finished.hypotheses(self.attentions, self.reorders)
        groups, beam = self.groups, self.beam
        if groups == 1:
            return [kept[:beam] for kept in found]
        return [sorted((h for kept in found[b * groups:(b + 1) * groups] for h in kept[:beam]), key=lambda h: -h.score)
                for b in range(self.batch_size)]


def beam_search(session: StepSession, batch_size: int, options: SearchOptions, *,
                bad_ending_ids: frozenset[int] = frozenset(),
                banned_ids: frozenset[int] = frozenset()) -> list[list[Hypothesis]]:
    """Up to ``beam_size`` finished hypotheses per image, best first, deterministic.

    The session is tiled to ``batch_size * beam`` rows first; at the first step every row reads bos and only
    beam 0 of each image is live (the others start at -inf), so all rows of an image agree there. An image
    stops once it has ``patience x beam_size`` hypotheses that no live beam can outscore (log-probs only fall as
    words are added), or when it has no live beam left; the search stops when every image has, or after ``max_length``
    words, where every live beam ends (:func:`force_end`). If filters leave an image no candidate at all before it
    has a hypothesis, its best beam ends where it stands, with no eos term. Only the session's first
    ``options.k`` candidates are read, so results do not depend on how many a graph returns. With
    ``options.groups`` > 1 each image's beams split into groups that search as images of their own, coupled by
    :func:`update_groups`, and the image returns the best of every group's hypotheses.
    """
    search = BeamSearch(batch_size, options, bad_ending_ids=bad_ending_ids, banned_ids=banned_ids)
    session.tile(options.beam_size)
    while not search.done:
        search.advance(*session.step(search.tokens, search.reorder, search.position))
    return search.result()
