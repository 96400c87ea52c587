"""Beam search on synthetic log-prob tables, with no model at all."""

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import pytest

from edgecap.runtime.filters import filter_candidates, repeats_trigram, word_ids
from edgecap.runtime.search import SearchOptions, beam_search, rank_score
from edgecap.vocab import BOS, EOS, PAD, UNK

Model = Callable[[int, tuple[int, ...]], np.ndarray]  # (image, tokens so far incl. bos) -> log-probs (V,)
ATTENTION_LENGTH = 5


def prefix_model(vocab_size: int, seed: int = 0, eos_bias: float = 0.0) -> Model:
    """Random log-probs that depend on the image and the whole prefix: any mix-up of rows changes them."""
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def logprobs(image: int, prefix: tuple[int, ...]) -> np.ndarray:
        key = (image, *prefix)
        if key not in cache:
            logits = np.random.default_rng([seed, *key]).normal(size=vocab_size) * 2
            logits[EOS] += eos_bias
            cache[key] = logits - np.log(np.exp(logits).sum())
        return cache[key]

    return logprobs


def table_model(tables: np.ndarray) -> Model:
    """log p(next | image, last token) from probability tables (images, V, V); pad and bos get ~0, rows sum to 1."""
    tables = tables.astype(np.float64)
    tables[..., [PAD, BOS]] = 1e-12
    logt = np.log(tables / tables.sum(-1, keepdims=True))
    return lambda image, prefix: logt[image, prefix[-1]]


def attention_of(image: int, prefix: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng([7, image, *prefix]).random(ATTENTION_LENGTH).astype(np.float32)


class FakeSession:
    """A StepSession whose state is each row's (image, token history) and whose memory is each row's image.

    It checks the search's side of the contract: int64 inputs, reorder within an image, memory tiled once
    after the first step. Dead rows (fed PAD) get uniform log-probs.
    """

    def __init__(self, model: Model, images: Sequence[int], k: int):
        self.model, self.k = model, k
        self.memory = np.asarray(images)
        self.state_image, self.state_history = self.memory.copy(), [()] * len(images)
        self.calls: list[tuple[np.ndarray, np.ndarray, int]] = []
        self.tiled_after: list[int] = []

    def step(self, tokens, reorder, position):
        assert tokens.dtype == np.int64 and reorder.dtype == np.int64
        assert len(tokens) == len(reorder) == len(self.memory)
        assert (self.state_image[reorder] == self.memory).all(), "a row continues another image's row"
        self.calls.append((tokens.copy(), reorder.copy(), position))
        self.state_image = self.memory.copy()
        self.state_history = [self.state_history[r] + (int(t),) for r, t in zip(reorder, tokens, strict=True)]
        vocab = len(self.model(0, (BOS,)))
        logp = np.stack([self.model(int(i), h) if h[-1] != PAD else np.full(vocab, -np.log(vocab))
                         for i, h in zip(self.memory, self.state_history, strict=True)]).astype(np.float32)
        ids = np.argsort(-logp, axis=1, kind="stable")[:, : self.k]
        attention = np.stack([attention_of(int(i), h) for i, h in zip(self.memory, self.state_history, strict=True)])
        return np.take_along_axis(logp, ids, 1), ids.astype(np.int64), attention

    def tile(self, beam_size):
        self.tiled_after.append(len(self.calls))
        self.memory = np.repeat(self.memory, beam_size)
        self.state_image = np.repeat(self.state_image, beam_size)
        self.state_history = [h for h in self.state_history for _ in range(beam_size)]


def path_logprob(model: Model, image: int, words: Sequence[int]) -> float:
    prefix, total = (BOS,), 0.0
    for w in (*words, EOS):
        total += float(model(image, prefix)[w].astype(np.float32))
        prefix += (w,)
    return total


def search(model: Model, options: SearchOptions, *, images: Sequence[int] = (0,), k: int | None = None,
           bad_endings: frozenset[int] = frozenset()):
    session = FakeSession(model, images, k or options.k)
    return beam_search(session, len(images), options, bad_ending_ids=bad_endings), session


def has_repeated_trigram(words: Sequence[int]) -> bool:
    trigrams = list(zip(words, words[1:], words[2:], strict=False))
    return len(set(trigrams)) < len(trigrams)


def brute_force(model: Model, vocab_size: int, options: SearchOptions, bad_endings: frozenset[int] = frozenset()):
    """Every caption the filters allow, as (score, logprob, words), best first."""
    words = [w for w in range(vocab_size) if w not in (PAD, BOS, EOS) and not (options.ban_unk and w == UNK)]
    out = []
    for n in range(options.min_length, options.max_length + 1):
        for seq in itertools.product(words, repeat=n):
            if options.block_trigrams and has_repeated_trigram(seq):
                continue
            if 0 < n < options.max_length and seq[-1] in bad_endings:  # the end at max length is forced
                continue
            logprob = path_logprob(model, 0, seq)
            out.append((rank_score(logprob, n, options.length_penalty), logprob, seq))
    return sorted(out, key=lambda x: -x[0])


NO_ENDINGS = SearchOptions(bad_endings=())


@pytest.mark.parametrize("options", [
    replace(NO_ENDINGS, beam_size=256, max_length=4),
    replace(NO_ENDINGS, beam_size=256, max_length=4, length_penalty=1.0, min_length=2),
    replace(NO_ENDINGS, beam_size=256, max_length=4, length_penalty=0.6, block_trigrams=True, min_length=0),
    replace(NO_ENDINGS, beam_size=512, max_length=4, ban_unk=False, length_penalty=0.3),
], ids=["plain", "penalty-min2", "trigrams-min0", "unk-allowed"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_beam_as_wide_as_the_vocabulary_ranks_exactly_like_brute_force(options, seed):
    vocab_size, endings = 7, frozenset({5})
    model = prefix_model(vocab_size, seed, eos_bias=1.0)
    [hyps], _ = search(model, replace(options, candidates=vocab_size), bad_endings=endings)
    expected = brute_force(model, vocab_size, options, endings)
    assert [h.tokens for h in hyps] == [seq for _, _, seq in expected]
    assert [h.logprob for h in hyps] == pytest.approx([lp for _, lp, _ in expected], abs=1e-5)
    assert [h.score for h in hyps] == pytest.approx([s for s, _, _ in expected], abs=1e-5)


def test_greedy_follows_the_argmax_chain():
    model = prefix_model(9, seed=3, eos_bias=-1.0)
    [[hyp]], _ = search(model, replace(NO_ENDINGS, beam_size=1, max_length=8, candidates=9))  # k = V: eos is seen
    prefix = (BOS,)
    for _ in range(8):
        logp = model(0, prefix).copy()
        logp[[PAD, BOS, UNK]] = -np.inf
        if len(prefix) == 1:
            logp[EOS] = -np.inf  # min_length 1
        if np.argmax(logp) == EOS:
            break
        prefix += (int(np.argmax(logp)),)
    assert hyp.tokens == prefix[1:]
    assert hyp.logprob == pytest.approx(path_logprob(model, 0, hyp.tokens), abs=1e-5)


def test_beam_finds_what_greedy_misses():
    v = 7
    table = np.full((v, v), 1e-6)
    table[BOS, 4], table[BOS, 5] = 0.55, 0.45  # greedy takes 4 ...
    table[4, 6] = table[4, EOS] = table[4, 4] = 1.0  # ... which then has three weak options
    table[5, EOS] = 1.0  # 5 ends with certainty: 0.45 > 0.55 / 3
    table[6, EOS] = 1.0
    model = table_model(table[None])
    [greedy], _ = search(model, replace(NO_ENDINGS, beam_size=1))
    [beam], _ = search(model, replace(NO_ENDINGS, beam_size=2))
    assert greedy[0].tokens[0] == 4 and beam[0].tokens == (5,)
    assert beam[0].logprob > greedy[0].logprob


def test_session_contract_reorder_tiling_and_attention():
    model = prefix_model(12, seed=5)
    options = replace(NO_ENDINGS, beam_size=3, max_length=6, candidates=12)  # k = V: eos is always seen
    results, session = search(model, options, images=(0, 1))
    assert session.tiled_after == [0]  # tiled once, before the first step: every step has batch * beam rows
    tokens0, reorder0, _ = session.calls[0]
    assert tokens0.tolist() == [BOS] * 6 and reorder0.tolist() == list(range(6))
    assert session.calls[1][1].tolist() == [0, 0, 0, 3, 3, 3]  # every new beam continues its image's live row 0
    assert [c[2] for c in session.calls] == list(range(len(session.calls)))
    for image, hyps in enumerate(results):
        assert len(hyps) == 3 and [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for hyp in hyps:
            # The prefix-dependent model gives these log-probs only if every reorder gathered the right rows.
            assert hyp.logprob == pytest.approx(path_logprob(model, image, hyp.tokens), abs=1e-5)
            prefixes = [(BOS, *hyp.tokens[:s]) for s in range(len(hyp.tokens) + 1)]
            assert hyp.attention.dtype == np.float32 and hyp.attention.shape == (len(hyp.tokens) + 1, ATTENTION_LENGTH)
            np.testing.assert_array_equal(hyp.attention, np.stack([attention_of(image, p) for p in prefixes]))


def test_a_batch_equals_its_images_searched_alone():
    model = prefix_model(10, seed=11, eos_bias=0.5)
    options = SearchOptions(beam_size=3, max_length=7, length_penalty=0.5, block_trigrams=True)
    endings = frozenset({4, 5})
    together, _ = search(model, options, images=(0, 1, 2), bad_endings=endings)
    for image in range(3):
        [alone], _ = search(model, options, images=(image,), bad_endings=endings)
        assert [h.tokens for h in together[image]] == [h.tokens for h in alone]
        assert [h.logprob for h in together[image]] == [h.logprob for h in alone]
        for a, b in zip(together[image], alone, strict=True):
            np.testing.assert_array_equal(a.attention, b.attention)


def test_search_is_deterministic_and_breaks_ties_by_rank():
    table = np.ones((7, 7))  # every word equally likely: ties everywhere
    table[:, EOS] = 2.0
    model = table_model(table[None])
    options = replace(NO_ENDINGS, beam_size=2, max_length=3, candidates=7)
    first, _ = search(model, options, images=(0, 0))
    second, _ = search(model, options, images=(0, 0))
    assert [[h.tokens for h in x] for x in first] == [[h.tokens for h in x] for x in second]
    assert [h.tokens for h in first[0]] == [h.tokens for h in first[1]] == [(4,), (5,)]  # lowest id first


def test_max_length_forces_the_end_scoring_an_unseen_eos_by_the_kth_candidate():
    table = np.ones((7, 7))
    table[:, EOS] = 1e-9  # eos never makes the top 3 (unk, 4, 5)
    model = table_model(table[None])
    [hyps], session = search(model, replace(NO_ENDINGS, beam_size=2, max_length=4, candidates=3))
    assert len(session.calls) == 5 and all(len(h.tokens) == 4 for h in hyps)
    word = model(0, (BOS,))[4]  # every word has this log-prob, and so has the 3rd candidate
    assert hyps[0].logprob == pytest.approx(5 * word)


def test_eos_ends_hypotheses_and_the_search_stops_once_no_live_beam_can_win():
    table = np.ones((8, 8))
    table[BOS, 4:] = [8, 4, 2, 1]
    table[4:, EOS] = 50.0  # after any word, ending is almost certain
    model = table_model(table[None])
    options = replace(NO_ENDINGS, beam_size=3, max_length=10)
    [hyps], session = search(model, options)
    assert len(session.calls) == 2  # the three one-word captions finish at step 2 and nothing can beat them
    assert [h.tokens for h in hyps] == [(4,), (5,), (6,)]
    assert [h.tokens for h in hyps] == [s for _, _, s in brute_force(model, 8, replace(options, max_length=3))[:3]]


def test_unk_is_banned_unless_allowed():
    table = np.full((6, 6), 0.1)
    table[:, UNK] = 1.0
    model = table_model(table[None])
    options = replace(NO_ENDINGS, beam_size=1, max_length=3)
    [[banned]], _ = search(model, options)
    [[allowed]], _ = search(model, replace(options, ban_unk=False))
    assert UNK not in banned.tokens and allowed.tokens == (UNK, UNK, UNK)


def test_eos_waits_for_min_length():
    table = np.full((6, 6), 0.01)
    table[:, EOS] = 1.0
    options = replace(NO_ENDINGS, beam_size=1, min_length=3, max_length=5, candidates=3)  # eos, unk, a word
    [[hyp]], _ = search(table_model(table[None]), options)
    assert len(hyp.tokens) == 3


def test_bad_endings_are_not_final_words():
    table = np.full((7, 7), 0.01)
    table[BOS, 4] = 1.0
    table[4, EOS] = 1.0  # "the" then end: banned
    table[4, 5] = 0.5
    table[5, EOS] = 1.0
    words = ["<pad>", "<bos>", "<eos>", "<unk>", "the", "dog", "x"]
    banned = word_ids(words, ("the", "cat"))
    assert banned == frozenset({4})
    model = table_model(table[None])
    [[hyp]], _ = search(model, SearchOptions(beam_size=1, candidates=4), bad_endings=banned)
    [[free]], _ = search(model, SearchOptions(beam_size=1, candidates=4))
    assert hyp.tokens == (4, 5) and free.tokens == (4,)


def test_trigram_filter():
    history = np.array([[4, 5, 6, 4, 5], [4, 5, 6, 7, 5], [4, 4, 4, 4, 4]])
    ids = np.array([[6, 7], [6, 7], [4, 5]])
    assert repeats_trigram(history, ids).tolist() == [[True, False], [False, False], [True, False]]
    assert not repeats_trigram(history[:, :2], ids).any()
    out = filter_candidates(np.zeros((3, 2)), ids, history=history, position=5,
                            options=SearchOptions(block_trigrams=True))
    assert out.tolist() == [[-np.inf, 0], [0, 0], [-np.inf, 0]]


def test_trigram_blocking_in_the_search():
    table = np.full((8, 8), 0.01)
    table[4, 5] = table[5, 4] = table[BOS, 4] = 1.0  # loves "4 5 4 5 ..."
    table[5, 6] = table[4, 7] = 0.5
    model = table_model(table[None])
    options = replace(NO_ENDINGS, beam_size=2, max_length=8)
    [[loop, *_]], _ = search(model, options)
    [[blocked, *_]], _ = search(model, replace(options, block_trigrams=True))
    assert has_repeated_trigram(loop.tokens) and not has_repeated_trigram(blocked.tokens)


def test_length_penalty_changes_the_ranking():
    table = np.full((8, 8), 1e-9)
    table[BOS, 4], table[BOS, 5] = 0.4, 0.6
    table[4, 6] = table[6, 7] = table[7, EOS] = 1.0  # 4 6 7: one uncertain word, then certain ones
    table[5, EOS], table[5, 6] = 0.8, 0.2  # 5: a likelier first word, then a less certain end
    model = table_model(table[None])
    options = replace(NO_ENDINGS, beam_size=3, max_length=5)
    [raw], _ = search(model, options)
    [normalised], _ = search(model, replace(options, length_penalty=1.0))
    assert raw[0].tokens == (5,) and normalised[0].tokens == (4, 6, 7)
    assert normalised[0].score == pytest.approx(normalised[0].logprob / 3)


def test_only_the_first_k_candidates_are_read():
    model = prefix_model(20, seed=2)
    options = replace(NO_ENDINGS, beam_size=2, max_length=6)
    exact, _ = search(model, options)
    wide, _ = search(model, options, k=20)  # a graph exported with a larger top-k
    assert [h.tokens for h in exact[0]] == [h.tokens for h in wide[0]]


def test_an_image_whose_candidates_are_all_banned_still_gets_a_hypothesis():
    table = np.full((6, 6), 0.01)
    table[:, UNK] = 1.0
    [[hyp]], _ = search(table_model(table[None]), replace(NO_ENDINGS, beam_size=1, candidates=1))
    assert hyp.tokens == () and hyp.logprob == 0.0 and hyp.attention.shape == (1, ATTENTION_LENGTH)


def test_a_session_returning_the_wrong_rows_is_named():
    class Short:
        def step(self, tokens, reorder, position):
            return np.zeros((1, 2), np.float32), np.full((1, 2), 4), np.zeros((1, 3), np.float32)

        def tile(self, beam_size):
            pass

    with pytest.raises(ValueError, match="for 6 tokens at position 0"):
        beam_search(Short(), 2, SearchOptions())


@pytest.mark.parametrize(("fields", "error", "message"), [
    ({"beam_size": 0}, ValueError, "beam_size must be >= 1, got 0"),
    ({"max_length": 0, "min_length": 0}, ValueError, "max_length must be >= 1, got 0"),
    ({"min_length": -1}, ValueError, "min_length must be >= 0, got -1"),
    ({"candidates": -1}, ValueError, "candidates must be >= 0, got -1"),
    ({"length_penalty": -1.0}, ValueError, "length_penalty must be >= 0, got -1.0"),
    ({"length_penalty": float("nan")}, ValueError, "length_penalty must be >= 0, got nan"),
    ({"min_length": 5, "max_length": 4}, ValueError, r"min_length \(5\) exceeds max_length \(4\)"),
    ({"beam_size": 2.0}, TypeError, "beam_size must be an int, got 2.0"),
    ({"bad_endings": "the"}, TypeError, "bad_endings must be a tuple of words, got the string 'the'"),
])
def test_options_are_validated_naming_the_bad_value(fields, error, message):
    with pytest.raises(error, match=message):
        SearchOptions(**fields)


def test_candidates_default_to_twice_the_beam():
    assert SearchOptions(beam_size=3).k == 6 and SearchOptions(beam_size=3, candidates=4).k == 4


def _reference_update(cumulative: np.ndarray, scores: np.ndarray, ids: np.ndarray, beam: int):
    """The beam update rule in plain Python: per image, candidates ranked by total (ties: row, then rank); the best
    ``beam`` that are eos (and finite) end, the best ``beam`` that are not eos go on."""
    batch, k = len(cumulative), scores.shape[1]
    parents, words, totals, ended = [], [], [], []
    for b in range(batch):
        candidates = [(cumulative[b, r] + scores[b * beam + r, j], r * k + j, r, int(ids[b * beam + r, j]))
                      for r in range(cumulative.shape[1]) for j in range(k)]
        ranked = sorted(candidates, key=lambda c: (-c[0], c[1]))
        ended += [(b, r, total) for total, _, r, word in ranked[:beam] if word == EOS and np.isfinite(total)]
        live = sorted(((total if word != EOS else -np.inf, i, r, word) for total, i, r, word in candidates),
                      key=lambda c: (-c[0], c[1]))[:beam]
        parents.append([r for _, _, r, _ in live])
        words.append([w for _, _, _, w in live])
        totals.append([t for t, _, _, _ in live])
    return parents, words, totals, ended


@pytest.mark.parametrize("seed", range(40))
def test_beam_update_matches_the_rule_with_ties_eos_and_dead_rows(seed):
    from edgecap.runtime.beams import update_beams

    rng = np.random.default_rng(seed)
    batch, beam = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    k = 2 * beam
    cumulative = np.round(rng.normal(-3, 1, (batch, beam)), 1)
    cumulative[rng.random((batch, beam)) < 0.2] = -np.inf  # dead beams
    scores = np.round(np.log(rng.random((batch * beam, k))), 1)  # rounded: ties happen
    scores[rng.random(scores.shape) < 0.15] = -np.inf  # filtered candidates
    ids = rng.integers(4, 12, (batch * beam, k))
    ids[rng.random(ids.shape) < rng.choice([0.0, 0.1, 0.4])] = EOS
    update = update_beams(cumulative, scores, ids, beam)
    parents, words, totals, ended = _reference_update(cumulative, scores, ids, beam)
    finite = np.isfinite(update.cumulative)  # dead beams carry -inf; which dead candidate fills them is free
    assert np.array_equal(finite, np.isfinite(totals))
    assert update.parent[finite].tolist() == np.array(parents)[finite].tolist()
    assert update.words[finite].tolist() == np.array(words)[finite].tolist()
    assert update.cumulative[finite].tolist() == np.array(totals)[finite].tolist()
    got = list(zip(update.ended_image.tolist(), update.ended_row.tolist(), update.ended_logprob.tolist(), strict=True))
    assert got == [(b, r, float(t)) for b, r, t in ended]
