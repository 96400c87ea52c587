import itertools

import numpy as np
import pytest
from edgecap.runtime.search import Hypothesis, SearchOptions, bad_ending_ids, beam_search, filter_candidates, rank_score

from edgecap.vocab import BOS, EOS, PAD, UNK


class TableSession:
    """log p(next | previous token) from a per-image table (B, V, V); state = full token history per row."""

    def __init__(self, tables: np.ndarray, k: int, length: int = 4):
        self.tables = np.log(tables / tables.sum(-1, keepdims=True))
        self.k, self.length = k, length
        self.image = np.arange(len(tables))  # image of each row: the "memory"
        self.histories = [[] for _ in range(len(tables))]
        self.calls = []

    def step(self, tokens, reorder, position):
        assert tokens.dtype == np.int64 and reorder.dtype == np.int64
        self.histories = [self.histories[r] + [int(t)] for r, t in zip(reorder, tokens, strict=True)]
        self.calls.append((tokens.copy(), reorder.copy(), position))
        logp = self.tables[self.image, tokens].astype(np.float32)
        ids = np.argsort(-logp, axis=1, kind="stable")[:, : self.k]
        attention = np.zeros((len(tokens), self.length), np.float32)
        attention[:, position % self.length] = 1
        return np.take_along_axis(logp, ids, 1), ids.astype(np.int64), attention

    def tile_memory(self, beam_size):
        self.image = np.repeat(self.image, beam_size)


def chain_table(v=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((v, v)) + 0.01


def brute_force(table, max_length, alpha=0.0, min_length=1):
    logt = np.log(table / table.sum(-1, keepdims=True))
    best = None
    words = range(4, table.shape[0])
    for n in range(min_length, max_length + 1):
        for seq in itertools.product(words, repeat=n):
            prev, total = BOS, 0.0
            for w in (*seq, EOS):
                total += logt[prev, w]
                prev = w
            score = rank_score(total, n, alpha)
            if best is None or score > best[0]:
                best = (score, seq)
    return best


def test_greedy_follows_the_argmax_chain():
    table = chain_table()
    session = TableSession(table[None], k=8)
    [hyps] = beam_search(session, 1, SearchOptions(beam_size=1, max_length=5, candidates=8, bad_endings=()))
    logt = np.log(table / table.sum(-1, keepdims=True))
    logt[:, [PAD, BOS, UNK]] = -np.inf
    prev, expected = BOS, []
    for _ in range(5):
        nxt = int(np.argmax(logt[prev]))
        if nxt == EOS:
            break
        expected.append(nxt)
        prev = nxt
    assert hyps[0].tokens == tuple(expected)


@pytest.mark.parametrize("alpha", [0.0, 0.7])
def test_wide_beam_is_exact_on_a_small_vocabulary(alpha):
    table = np.ones((7, 7))
    table[:, PAD] = table[:, BOS] = table[:, UNK] = 1e-9
    table += np.random.default_rng(3).random((7, 7)) * 3
    options = SearchOptions(beam_size=27, max_length=3, candidates=7, length_penalty=alpha, bad_endings=())
    [hyps] = beam_search(TableSession(table[None], k=7), 1, options)
    score, seq = brute_force(table, 3, alpha)
    assert hyps[0].tokens == seq
    assert hyps[0].score == pytest.approx(score)


def test_beam_finds_what_greedy_misses():
    v = 7
    table = np.full((v, v), 1e-6)
    table[BOS, 4], table[BOS, 5] = 0.55, 0.45  # greedy takes 4 ...
    table[4, 6] = table[4, EOS] = 1.0  # ... which then has two weak options
    table[4, 4] = 1.0
    table[5, EOS] = 1.0  # 5 ends with certainty: 0.45 > 0.55 / 3
    table[6, EOS] = 1.0
    greedy = beam_search(TableSession(table[None], k=4), 1, SearchOptions(beam_size=1, candidates=4, bad_endings=()))
    beam = beam_search(TableSession(table[None], k=4), 1, SearchOptions(beam_size=2, bad_endings=()))
    assert greedy[0][0].tokens[0] == 4 and beam[0][0].tokens == (5,)
    assert beam[0][0].logprob > greedy[0][0].logprob


def test_batch_equals_images_searched_alone():
    tables = np.stack([chain_table(seed=s) for s in range(3)])
    options = SearchOptions(beam_size=3, max_length=6, bad_endings=())
    together = beam_search(TableSession(tables, k=6), 3, options)
    for b in range(3):
        [alone] = beam_search(TableSession(tables[b:b + 1], k=6), 1, options)
        assert [h.tokens for h in together[b]] == [h.tokens for h in alone]
        assert [h.logprob for h in together[b]] == pytest.approx([h.logprob for h in alone])


def test_reorder_gathers_the_parent_history():
    tables = np.stack([chain_table(seed=s) for s in range(2)])
    session = TableSession(tables, k=6)
    results = beam_search(session, 2, SearchOptions(beam_size=3, max_length=5, bad_endings=()))
    assert session.calls[0][1].tolist() == [0, 1] and session.calls[1][1].tolist()[:3] == [0, 0, 0]
    for b, hyps in enumerate(results):
        for hyp in hyps:
            # The session's history of some row must be bos + the hypothesis' words.
            assert any(h[: len(hyp.tokens) + 1] == [BOS, *hyp.tokens] for h in session.histories[b * 3:(b + 1) * 3]) \
                or len(hyp.tokens) < len(session.histories[0]) - 1


def test_hypotheses_carry_one_attention_row_per_step():
    [hyps] = beam_search(TableSession(chain_table()[None], k=6), 1, SearchOptions(beam_size=2, max_length=5))
    for hyp in hyps:
        assert hyp.attention.shape == (len(hyp.tokens) + 1, 4)
        assert hyp.attention[:, :].argmax(1).tolist() == [t % 4 for t in range(len(hyp.tokens) + 1)]


def test_max_length_forces_the_end():
    table = np.ones((6, 6))
    table[:, EOS] = 1e-9
    [hyps] = beam_search(TableSession(table[None], k=6), 1, SearchOptions(beam_size=2, max_length=4, bad_endings=()))
    assert all(len(h.tokens) == 4 for h in hyps)


def test_unk_is_never_emitted_and_eos_waits_for_min_length():
    table = np.full((6, 6), 0.01)
    table[:, UNK] = 1.0
    table[:, EOS] = 0.9
    [hyps] = beam_search(TableSession(table[None], k=6), 1,
                         SearchOptions(beam_size=1, min_length=3, max_length=5, candidates=6, bad_endings=()))
    assert UNK not in hyps[0].tokens and len(hyps[0].tokens) == 3


def test_bad_endings_are_not_final_words():
    table = np.full((7, 7), 0.01)
    table[BOS, 4] = 1.0
    table[4, EOS] = 1.0  # "the" then end: banned
    table[4, 5] = 0.5
    table[5, EOS] = 1.0
    words = ["<pad>", "<bos>", "<eos>", "<unk>", "the", "dog", "x"]
    banned = bad_ending_ids(words, ("the",))
    assert banned == frozenset({4})
    [hyps] = beam_search(TableSession(table[None], k=4), 1, SearchOptions(beam_size=1, candidates=4),
                         bad_ending_ids=banned)
    assert hyps[0].tokens == (4, 5)


def test_trigram_blocking():
    history = np.array([[4, 5, 6, 4, 5]])
    ids = np.array([[6, 7]])
    out = filter_candidates(np.zeros((1, 2)), ids, history, 5, SearchOptions(block_trigrams=True), frozenset())
    assert out[0, 0] == -np.inf and out[0, 1] == 0


def test_length_penalty_changes_the_ranking():
    short, long_ = Hypothesis((4,), -2.0, 0, np.zeros((2, 1))), Hypothesis((4, 5, 6, 7), -3.0, 0, np.zeros((5, 1)))
    assert rank_score(short.logprob, 1, 0) > rank_score(long_.logprob, 4, 0)
    assert rank_score(short.logprob, 1, 1.0) < rank_score(long_.logprob, 4, 1.0)


def test_search_is_deterministic():
    tables = np.stack([chain_table(seed=s) for s in range(2)])
    options = SearchOptions(beam_size=3, max_length=6)
    a = beam_search(TableSession(tables, k=6), 2, options)
    b = beam_search(TableSession(tables, k=6), 2, options)
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]


@pytest.mark.parametrize(("field", "value"), [("beam_size", 0), ("max_length", 0), ("min_length", -1),
                                              ("candidates", -1), ("length_penalty", -1.0)])
def test_options_are_validated_naming_the_bad_value(field, value):
    with pytest.raises(ValueError, match=field):
        SearchOptions(**{"beam_size": 2, field: value})
