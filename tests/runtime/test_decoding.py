"""The decoding menu on synthetic log-prob tables: sampling, n-best, patience, banned words, learned endings and
``--search FIELD=VALUE``; no model at all."""

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from edgecap.errors import EdgecapError
from edgecap.runtime.decoding import decode, meeting, required_ids, word_rules
from edgecap.runtime.search import SearchOptions, beam_search
from edgecap.vocab import BOS, EOS, SPECIALS, Vocab
from tests.runtime.test_search import NO_ENDINGS, FakeSession, path_logprob, prefix_model, table_model

WORDS = Vocab(SPECIALS + tuple(f"w{i}" for i in range(4, 40)))


def run(model, options: SearchOptions, vocab: Vocab = WORDS, images=(0,)):
    return decode(FakeSession(model, images, options.k), len(images), options, vocab)


def two_word_table() -> np.ndarray:
    """bos -> w4 (0.7) or w5 (0.3), then eos."""
    table = np.full((8, 8), 1e-9)
    table[BOS, 4], table[BOS, 5] = 0.7, 0.3
    table[4, EOS] = table[5, EOS] = 1.0
    return table[None]


def test_sampling_is_repeatable_for_a_seed_and_scores_are_the_models_own():
    model = prefix_model(40, seed=3, eos_bias=1.0)
    options = replace(NO_ENDINGS, sample=True, n_best=6, beam_size=3, seed=11)
    first, again, other = run(model, options), run(model, options), run(model, replace(options, seed=12))
    assert [h.tokens for h in first[0]] == [h.tokens for h in again[0]]
    assert [h.tokens for h in first[0]] != [h.tokens for h in other[0]]
    assert len(first[0]) == 6 and [h.score for h in first[0]] == sorted((h.score for h in first[0]), reverse=True)
    tempered = run(model, replace(options, temperature=2.0))
    for hyp in first[0] + tempered[0]:
        true = path_logprob(model, 0, hyp.tokens)
        if len(hyp.tokens) < options.max_length:
            assert hyp.logprob == pytest.approx(true, abs=1e-4)
        else:  # forced to end: eos outside the top k is scored by its bound, the k-th candidate's log-prob
            assert hyp.logprob >= true - 1e-4
        assert len(hyp.attention) == len(hyp.tokens) + 1


def test_sampling_follows_the_distribution_and_top_p_cuts_its_tail():
    model = table_model(two_word_table())
    options = replace(NO_ENDINGS, sample=True, n_best=4000, beam_size=1, seed=0, candidates=4)
    counts = Counter(h.tokens for h in run(model, options)[0])
    assert counts[(4,)] / 4000 == pytest.approx(0.7, abs=0.03) and counts[(4,)] + counts[(5,)] == 4000
    nucleus = Counter(h.tokens for h in run(model, replace(options, top_p=0.6))[0])
    assert nucleus == {(4,): 4000}  # w4 alone holds 0.6 of the mass
    flat = Counter(h.tokens for h in run(model, replace(options, temperature=100.0, candidates=2))[0])
    assert flat[(5,)] / 4000 == pytest.approx(0.5, abs=0.03)  # a high temperature evens the odds


@pytest.mark.parametrize("narrowing", [{"top_k": 1}, {"top_p": 1e-6}, {"temperature": 1e-4}])
def test_sampling_narrowed_to_one_candidate_is_greedy(narrowing):
    model = prefix_model(40, seed=5, eos_bias=0.5)
    greedy = run(model, replace(NO_ENDINGS, beam_size=1))
    sampled = run(model, replace(NO_ENDINGS, beam_size=1, sample=True, seed=4, **narrowing), images=(0,))
    assert sampled[0][0].tokens == greedy[0][0].tokens


def test_n_best_returns_the_beams_finished_captions_best_first():
    model = prefix_model(30, seed=1, eos_bias=1.0)
    options = replace(NO_ENDINGS, beam_size=4, n_best=3)
    found = run(model, options, images=(0, 1))
    full = beam_search(FakeSession(model, (0, 1), options.k), 2, options)
    assert [[h.tokens for h in f] for f in found] == [[h.tokens for h in f[:3]] for f in full]
    assert all(len(f) == 3 and f[0].score >= f[1].score >= f[2].score for f in found)
    with pytest.raises(ValueError, match="n_best"):
        SearchOptions(beam_size=2, n_best=3)


def test_patience_only_finds_more_candidates_so_the_best_never_gets_worse():
    for seed in range(12):
        model = prefix_model(25, seed=seed, eos_bias=1.5)
        options = replace(NO_ENDINGS, beam_size=2, max_length=12)
        quick, patient = FakeSession(model, (0,), options.k), FakeSession(model, (0,), options.k)
        [[best, *_]] = beam_search(quick, 1, options)
        [[patient_best, *_]] = beam_search(patient, 1, replace(options, patience=3.0))
        assert patient_best.score >= best.score - 1e-9 and len(patient.calls) >= len(quick.calls)


def test_banned_words_are_never_said_and_unknown_ones_are_refused():
    model = prefix_model(40, seed=2, eos_bias=0.5)
    free = run(model, replace(NO_ENDINGS, beam_size=3), images=(0, 1, 2))
    said = sorted({w for f in free for w in f[0].tokens})
    banned = tuple(WORDS.words[w] for w in said[:3])
    kept = run(model, replace(NO_ENDINGS, beam_size=3, ban_words=banned), images=(0, 1, 2))
    assert not {w for f in kept for w in f[0].tokens} & set(said[:3])
    with pytest.raises(EdgecapError, match="zebra not in the model's vocabulary"):
        word_rules(WORDS, SearchOptions(ban_words=("zebra",)))


def test_required_words_choose_the_best_caption_that_holds_them_or_say_they_were_not_met():
    model = prefix_model(40, seed=2, eos_bias=0.5)
    options = replace(NO_ENDINGS, beam_size=4, n_best=4)
    found = run(model, options)[0]
    best_words = set(found[0].tokens)
    # a word some other caption the search found has and the best one lacks
    word = next(w for h in found[1:] for w in h.tokens if w not in best_words)
    wanted = replace(options, require_words=(WORDS.words[word],))
    ranked = [h.tokens for h in run(model, wanted)[0]]
    holders = [h.tokens for h in found if word in h.tokens]
    assert ranked[0] == holders[0] and [t for t in ranked if word not in t] == \
        [h.tokens for h in found if word not in h.tokens]  # the rest keep their order
    absent = next(w for w in range(4, 40) if all(w not in h.tokens for h in found))
    unmet = run(model, replace(options, require_words=(WORDS.words[absent],)))[0]
    assert [h.tokens for h in unmet] == [h.tokens for h in found]  # nothing holds it: the search's own order
    assert meeting(found, frozenset()) is found
    with pytest.raises(EdgecapError, match="require_words: zebra not in the model's vocabulary"):
        required_ids(WORDS, SearchOptions(require_words=("zebra",)))


def test_a_caption_says_which_required_words_it_lacks():
    from edgecap.config import DEFAULT_EXPORT
    from edgecap.preprocess import SAMPLE_IMAGES
    from edgecap.runtime.pipeline import Captioner

    pytest.importorskip("onnxruntime", reason="the shipped export runs on onnxruntime")
    captioner = Captioner.from_dir(DEFAULT_EXPORT)
    photo = SAMPLE_IMAGES / "dog.jpg"
    plain = captioner.caption([photo], SearchOptions(beam_size=3, n_best=3))[0]
    other = next(w for text in plain.alternatives for w in text.split() if w not in plain.text.split())
    held = captioner.caption([photo], SearchOptions(beam_size=3, require_words=(other,)))[0]
    assert other in held.text.split() and held.unmet_words == ()
    missing = captioner.caption([photo], SearchOptions(beam_size=3, require_words=("elephant", other)))[0]
    assert missing.unmet_words in (("elephant",), ("elephant", other)) and missing.text == plain.text
    assert SearchOptions().overridden(["require_words=dog+grass"]).require_words == ("dog", "grass")


def test_learned_endings_come_from_the_training_captions():
    vocab = Vocab.build(["a dog runs on the grass"] * 5 + ["a dog on a beach"] * 5, min_count=5)
    assert set(vocab.learned_endings) == {"a", "dog", "runs", "on", "the"}  # never last; grass and beach are
    assert Vocab.from_json(vocab.to_json()) == vocab
    endings, _ = word_rules(vocab, SearchOptions(learned_endings=True))
    assert endings == {vocab.words.index(w) for w in vocab.learned_endings}
    with pytest.raises(EdgecapError, match="no learned endings"):
        word_rules(Vocab(vocab.words), SearchOptions(learned_endings=True))


def test_search_items_parse_into_options_and_bad_ones_name_themselves():
    options = SearchOptions().overridden(["n_best=2", "sample=true", "top_p=0.9", "ban_words=man+woman",
                                          "bad_endings=none", "seed=7"])
    assert (options.n_best, options.sample, options.top_p, options.seed) == (2, True, 0.9, 7)
    assert options.ban_words == ("man", "woman") and options.bad_endings == ()
    for item, message in (("speed=3", "expected FIELD=VALUE"), ("n_best", "expected FIELD=VALUE"),
                          ("sample=maybe", "true or false"), ("top_k=many", "expected a int"),
                          ("candidates=4", "expected FIELD=VALUE")):
        with pytest.raises(ValueError, match=message):
            SearchOptions().overridden([item])
    with pytest.raises(ValueError, match="top_p"):
        SearchOptions().overridden(["top_p=1.5"])


def test_diverse_groups_without_a_penalty_each_find_the_greedy_caption():
    model = prefix_model(30, seed=8, eos_bias=1.0)
    [[greedy]] = run(model, replace(NO_ENDINGS, beam_size=1))
    [found] = run(model, replace(NO_ENDINGS, beam_size=3, groups=3, diversity=0.0, n_best=3))
    assert [h.tokens for h in found] == [greedy.tokens] * 3


def test_diverse_groups_start_on_distinct_words_ranked_by_the_model():
    model = prefix_model(30, seed=9, eos_bias=1.0)
    options = replace(NO_ENDINGS, beam_size=4, groups=4, diversity=100.0, n_best=4)
    for found in run(model, options, images=(0, 1)):
        first = [h.tokens[0] for h in found]
        assert len(set(first)) == 4  # a huge penalty: each group takes the best word no earlier group took
    first_step = model(0, (BOS,))
    top = [int(w) for w in np.argsort(-first_step) if w > 3][:4]  # specials are never words
    assert {h.tokens[0] for h in run(model, options)[0]} == set(top)
    for hyp in run(model, options)[0]:
        if len(hyp.tokens) < options.max_length:  # log-probs are the model's, the penalty left out
            assert hyp.logprob == pytest.approx(path_logprob(model, 0, hyp.tokens), abs=1e-4)


def test_diverse_groups_with_two_beams_each_return_every_groups_best():
    model = prefix_model(30, seed=4, eos_bias=1.0)
    plain = run(model, replace(NO_ENDINGS, beam_size=2, n_best=2))
    [found] = run(model, replace(NO_ENDINGS, beam_size=4, groups=2, diversity=0.0, n_best=4))
    # no penalty: both groups are the same two-beam search
    assert [h.tokens for h in found] == [h.tokens for h in plain[0] for _ in range(2)]
    with pytest.raises(ValueError, match="must divide beam_size"):
        SearchOptions(beam_size=3, groups=2)
