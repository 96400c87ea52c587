import random
from collections import defaultdict

import numpy as np
import pytest

from edgecap.cider import CiderD, corpus_cider
from edgecap.vocab import tokenize

Cider = pytest.importorskip("pycocoevalcap.cider.cider", reason="the reference CIDEr is pycocoevalcap's "
                            "(pip install edgecap[metrics])").Cider

SUBJECTS = ["a dog", "two dogs", "a man", "a little girl", "a woman", "the boy", "a brown dog", "people"]
VERBS = ["runs", "is running", "jumps", "sits", "plays", "walks", "is standing"]
PLACES = ["on the grass", "in the snow", "on the beach", "in the water", "near a tree", "on a red bench", ""]


def synthetic_split(images: int, seed: int) -> tuple[dict[str, list[list[str]]], dict[str, list[str]]]:
    """References sharing each image's subject and verb, and candidates from good to empty."""
    rng = random.Random(seed)
    references, candidates = {}, {}
    for i in range(images):
        subject, verb = rng.choice(SUBJECTS), rng.choice(VERBS)
        refs = [
            f"{subject} {rng.choice([verb, rng.choice(VERBS)])} {rng.choice(PLACES)}" for _ in range(rng.randint(1, 5))
        ]
        references[str(i)] = [r.split() for r in refs]
        kind = i % 5
        if kind == 0:
            candidates[str(i)] = references[str(i)][0]
        elif kind == 1:
            candidates[str(i)] = f"{subject} {subject} {verb} {verb} zebra".split()  # repeats and an unseen word
        elif kind == 2:
            candidates[str(i)] = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(PLACES)}".split()
        elif kind == 3:
            candidates[str(i)] = rng.choice(VERBS).split()[:1]
        else:
            candidates[str(i)] = []
    return references, candidates


def pycocoevalcap_cider(references, candidates, **options) -> tuple[float, np.ndarray]:
    gts = {i: [" ".join(r) for r in references[i]] for i in candidates}
    res = {i: [" ".join(candidates[i])] for i in candidates}
    score, scores = Cider(**options).compute_score(gts, res)
    return score, scores


# pycocoevalcap always counts 1..4-grams (it crashes for n != 4), so only sigma can vary here.
@pytest.mark.parametrize("options", [{}, {"sigma": 3.0}])
def test_matches_pycocoevalcap_on_a_whole_split(options):
    references, candidates = synthetic_split(300, seed=0)
    expected, expected_per_image = pycocoevalcap_cider(references, candidates, **options)
    scores = CiderD(references, **options).score(list(candidates), list(candidates.values()))
    assert expected > 0.1
    np.testing.assert_allclose(scores, expected_per_image, rtol=0, atol=1e-9)
    assert scores.mean() == pytest.approx(expected, abs=1e-6)
    assert corpus_cider(references, candidates) == pytest.approx(
        pycocoevalcap_cider(references, candidates)[0], abs=1e-6
    )


@pytest.mark.flickr8k
def test_matches_pycocoevalcap_on_flickr8k_captions(flickr8k_dir):
    captions = defaultdict(list)
    for line in (flickr8k_dir / "Flickr8k.token.txt").read_text().splitlines()[:2000]:
        key, _, caption = line.partition("\t")
        captions[key.split("#")[0]].append(tokenize(caption))
    rng = random.Random(0)
    ids = sorted(captions)
    # Hold the last caption out as a candidate, or borrow a (possibly truncated) one from another image.
    references = {i: captions[i][:-1] for i in ids}
    candidates = {
        i: captions[i][-1] if rng.random() < 0.5 else rng.choice(captions[rng.choice(ids)])[: rng.randint(0, 12)]
        for i in ids
    }
    expected, expected_per_image = pycocoevalcap_cider(references, candidates)
    scores = CiderD(references).score(ids, [candidates[i] for i in ids])
    np.testing.assert_allclose(scores, expected_per_image, rtol=0, atol=1e-9)
    assert scores.mean() == pytest.approx(expected, abs=1e-6)


def test_idf_comes_from_the_corpus_not_the_batch():
    references, candidates = synthetic_split(100, seed=1)
    cider = CiderD(references)
    ids = list(candidates)
    whole = cider.score(ids, [candidates[i] for i in ids])
    alone = np.array([cider.score([i], [candidates[i]])[0] for i in ids])
    np.testing.assert_array_equal(whole, alone)
    # pycocoevalcap on the same 10 images takes its idf from them and disagrees.
    batch = {i: candidates[i] for i in ids[:10]}
    assert not np.allclose(pycocoevalcap_cider(references, batch)[1], whole[:10])


def test_several_candidates_per_image():
    references, _ = synthetic_split(20, seed=2)
    cider = CiderD(references)
    samples = [references["3"][0], ["a", "dog"], [], references["3"][0]]
    scores = cider.score(["3"] * 4, samples)
    assert scores.shape == (4,)
    assert scores[0] == scores[3] > scores[1] > scores[2] == 0.0
    assert scores[1] == cider.score(["3"], [["a", "dog"]])[0]


def test_end_token_scores_where_a_caption_stops():
    references = {"0": [["a", "dog", "runs", "on", "the", "grass"], ["a", "brown", "dog", "runs"]],
                  "1": [["a", "man", "walks", "down", "the", "street"], ["a", "man", "stands", "in", "a", "city"]]}
    plain, ended = CiderD(references), CiderD(references, end_token="<eos>")
    cut_short, reference_ending = ["a", "dog", "runs", "on", "the"], ["a", "dog", "runs"]
    # The same words with the end token appended on both sides, spelled out, give the same scores.
    spelled = CiderD({i: [[*ref, "<eos>"] for ref in refs] for i, refs in references.items()})
    for words in (cut_short, reference_ending):
        assert ended.score(["0"], [words])[0] == spelled.score(["0"], [[*words, "<eos>"]])[0]
    # A caption stopped mid-phrase loses reward; one stopping where a reference stops gains.
    assert ended.score(["0"], [cut_short])[0] < plain.score(["0"], [cut_short])[0]
    assert ended.score(["0"], [reference_ending])[0] > plain.score(["0"], [reference_ending])[0]


def test_rejects_bad_input():
    references, _ = synthetic_split(5, seed=3)
    cider = CiderD(references)
    with pytest.raises(KeyError, match="no references"):
        cider.score(["missing"], [["a", "dog"]])
    with pytest.raises(TypeError, match="token lists"):
        cider.score(["0"], ["a dog"])
    with pytest.raises(ValueError, match="2 image ids for 1 candidates"):
        cider.score(["0", "1"], [["a"]])
    with pytest.raises(ValueError, match="non-empty list of token lists"):
        CiderD({"0": ["a dog runs"]})
    with pytest.raises(ValueError, match="non-empty list of token lists"):
        CiderD({"0": []})
