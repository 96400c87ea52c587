"""One entry point for every decoding: beam search or sampling over any step session, with the options' words (bad
endings, banned words) turned into the vocabulary ids the filters ban. Every backend and every command decodes here.

Sampling draws each row's next word from the candidates the step returns (``SearchOptions.k``: twice the beam, or
``top_k`` when larger): the exported step graph returns its top-k, not the whole distribution, so the distribution
sampled is the model's, cut to those k and renormalised, and ``top_k`` cannot exceed what the export returns.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.runtime.filters import NEG_INF, filter_candidates, force_end, word_ids
from edgecap.runtime.search import Hypothesis, SearchOptions, StepSession, beam_search, rank_score
from edgecap.vocab import BOS, EOS, PAD, Vocab


@lru_cache(maxsize=32)
def _ids(words: tuple[str, ...], chosen: tuple[str, ...]) -> frozenset[int]:
    return word_ids(words, chosen)


def word_rules(vocab: Vocab, options: SearchOptions) -> tuple[frozenset[int], frozenset[int]]:
    """(bad-ending ids, banned-word ids) of ``options`` in ``vocab``; an EdgecapError names what the vocabulary
    lacks (the options are the user's, the vocabulary the model's)."""
    if options.learned_endings and not vocab.learned_endings:
        raise EdgecapError("--search learned_endings=true: this model's vocabulary records no learned endings (it was "
                           "trained before they were); leave it out to use the default bad_endings")
    _require_known(vocab, options.ban_words, "ban_words")
    endings = vocab.learned_endings if options.learned_endings else options.bad_endings
    return _ids(vocab.words, tuple(endings)), _ids(vocab.words, options.ban_words)


def required_ids(vocab: Vocab, options: SearchOptions) -> frozenset[int]:
    """The ids of ``options.require_words``; an EdgecapError names those the vocabulary lacks."""
    _require_known(vocab, options.require_words, "require_words")
    return _ids(vocab.words, options.require_words)


def _require_known(vocab: Vocab, words: tuple[str, ...], option: str) -> None:
    unknown = sorted(set(words) - set(vocab.words))
    if unknown:
        raise EdgecapError(f"--search {option}: {', '.join(unknown)} not in the model's vocabulary, so it never "
                           "says them; drop them")


def meeting(found: list[Hypothesis], required: frozenset[int]) -> list[Hypothesis]:
    """``found`` (best first) with the hypotheses holding every required word first, each part in its order.

    Not constrained beam search: the step graph returns only its top-k candidates, so a required word outside them
    has no score to steer by; among the captions the search found, the best that holds the words wins.
    """
    if not required:
        return found
    return sorted(found, key=lambda h: not required <= set(h.tokens))


def decode(session: StepSession, batch_size: int, options: SearchOptions, vocab: Vocab) -> list[list[Hypothesis]]:
    """``options.n_best`` captions per image, best first: beam search, or sampling with ``options.sample``."""
    endings, banned = word_rules(vocab, options)
    required = required_ids(vocab, options)
    search = sample_search if options.sample else beam_search
    return [meeting(found, required)[: options.n_best]
            for found in search(session, batch_size, options, bad_ending_ids=endings, banned_ids=banned)]


def _nucleus(scores: np.ndarray, options: SearchOptions) -> np.ndarray:
    """Sampling probabilities (R, k) of candidates sorted best first: tempered, cut to top_k and to top_p."""
    logits = scores / options.temperature
    if options.top_k:  # the k best of the candidates the filters allowed
        logits[np.cumsum(np.isfinite(logits), axis=1) > options.top_k] = NEG_INF
    peak = np.max(logits, axis=1, keepdims=True)
    weights = np.where(np.isfinite(logits), np.exp(logits - np.where(np.isfinite(peak), peak, 0)), 0.0)
    total = weights.sum(axis=1, keepdims=True)
    probs = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    if options.top_p < 1:
        before = np.cumsum(probs, axis=1) - probs  # the mass of the better candidates
        probs = np.where(before < options.top_p, probs, 0.0)
        probs /= np.maximum(probs.sum(axis=1, keepdims=True), 1e-300)
    return probs


def sample_search(session: StepSession, batch_size: int, options: SearchOptions, *,
                  bad_ending_ids: frozenset[int] = frozenset(),
                  banned_ids: frozenset[int] = frozenset()) -> list[list[Hypothesis]]:
    """``n_best`` sampled captions per image, ranked by the ranker's score; repeatable for a given ``seed``.

    Each of the image's rows draws its own words; a row whose filters leave no candidate ends where it stands.
    Scores and log-probs are the model's own, untempered.
    """
    n, k = options.n_best, options.k
    rng = np.random.default_rng(options.seed)
    rows = batch_size * n
    session.tile(n)
    tokens, reorder = np.full(rows, BOS, dtype=np.int64), np.arange(rows, dtype=np.int64)
    history = np.zeros((rows, 0), dtype=np.int64)
    logprob, ended = np.zeros(rows), np.full(rows, -1)
    attentions = []
    for position in range(options.max_length + 1):
        logprobs, ids, attention = session.step(tokens, reorder, position)
        attentions.append(np.array(attention, dtype=np.float32))
        logprobs, ids = logprobs[:, :k], ids[:, :k]
        if position < options.max_length:
            scores = filter_candidates(logprobs, ids, history=history, position=position, options=options,
                                       banned_endings=bad_ending_ids, banned_words=banned_ids)
        else:
            scores, ids = force_end(logprobs, ids)
        probs = _nucleus(scores, options)
        pick = np.minimum((np.cumsum(probs, axis=1) < rng.random((rows, 1))).sum(axis=1), probs.shape[1] - 1)
        stuck = probs.sum(axis=1) == 0  # every candidate banned: the row ends here
        words = np.where(stuck, EOS, ids[np.arange(rows), pick])
        live = ended < 0
        logprob += np.where(live & ~stuck, scores[np.arange(rows), pick], 0.0)
        ended = np.where(live & (words == EOS), position, ended)
        history = np.concatenate([history, np.where(live, words, PAD)[:, None]], axis=1)
        tokens = np.where(ended < 0, words, PAD).astype(np.int64)
        if (ended >= 0).all():
            break
    ended = np.where(ended < 0, history.shape[1] - 1, ended)
    steps = np.stack(attentions)  # (S, N, L)
    out = []
    for image in range(batch_size):
        found = []
        for row in range(image * n, (image + 1) * n):
            words = tuple(int(w) for w in history[row, : ended[row]] if w not in (EOS, PAD))
            found.append(Hypothesis(words, float(logprob[row]), rank_score(float(logprob[row]), len(words),
                                                                           options.length_penalty),
                                    steps[: ended[row] + 1, row]))
        out.append(sorted(found, key=lambda h: -h.score))
    return out
