"""CIDEr-D with document frequencies from the training corpus, for self-critical rewards (numpy only).

pycocoevalcap's ``Cider`` takes document frequencies from the captions it is handed: given one SCST
batch, the idf would come from 50 images and the reward would change with the batch. ``CiderD``
counts them once over the whole reference corpus. Otherwise it follows pycocoevalcap 1.2's
``CiderScorer`` exactly (the coco-caption "CIDEr-D"): raw n-gram counts times ``log(N) - log(df)``,
candidate weights clipped to the reference's, a gaussian penalty on the length difference, the mean
over n-gram orders and references, times 10. Scoring a split against its own references therefore
reproduces pycocoevalcap's ``Cider().compute_score`` (the tests check this).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np

NGram = tuple[str, ...]


def _ngrams(words: Sequence[str], k: int) -> Iterator[NGram]:
    return zip(*(words[i:] for i in range(k)), strict=False)


class _References(NamedTuple):
    """One image's reference vectors, inverted so a candidate looks each of its n-grams up once, not once per ref."""

    postings: dict[NGram, list[tuple[int, float]]]  # n-gram -> [(reference index, tf-idf weight)]
    norms: list[list[float]]  # per reference, per n-gram order
    lengths: list[int]  # per reference


class CiderD:
    """CIDEr-D scorer whose idf is fixed by ``references`` (image id -> tokenised reference captions).

    Reference vectors are rebuilt for the images of each ``score`` call rather than cached: that is
    about half of the ~30 ms a 50-image x 6-sample batch takes, while caching them for a COCO-sized
    corpus costs GBs (and shuffled epochs give a bounded cache few hits).
    """

    def __init__(self, references: Mapping[str, Sequence[Sequence[str]]], *, n: int = 4, sigma: float = 6.0,
                 end_token: str | None = None):
        """With ``end_token``, every reference and candidate ends with it, so a caption's last words are scored as
        an ending (a self-critical reward then pays for stopping where references stop, not only for what came
        before); None scores them as pycocoevalcap does."""
        if not references:
            raise ValueError("CiderD needs a non-empty reference corpus")
        if n < 1 or sigma <= 0:
            raise ValueError(f"CiderD needs n >= 1 and sigma > 0, got n={n}, sigma={sigma}")
        self.n = n
        self.sigma = sigma
        self._end = (end_token,) if end_token else ()
        self._references: dict[str, tuple[tuple[str, ...], ...]] = {}
        document_frequency: Counter[NGram] = Counter()
        for image_id, refs in references.items():
            if not refs or any(isinstance(ref, str) for ref in refs):
                raise ValueError(f"image {image_id!r}: references must be a non-empty list of token lists")
            refs = self._references[image_id] = tuple(tuple(ref) + self._end for ref in refs)
            document_frequency.update({g for ref in refs for k in range(1, n + 1) for g in _ngrams(ref, k)})
        # pycocoevalcap's "ref_len": log of the number of images in the corpus.
        self._log_images = math.log(len(self._references))
        # Store idf = log(N) - log(df) once; n-grams absent from the corpus have df 0 -> idf log(N).
        self._idf = {g: self._log_images - math.log(df) for g, df in document_frequency.items()}

    def _vector(self, words: Sequence[str]) -> tuple[dict[NGram, float], list[float], int]:
        """tf-idf weights, per-order norms, and length of one caption.

        Length counts bigrams, as pycocoevalcap does (it tests ``n == 1`` on a zero-based order), so it
        is ``len(words) - 1``, and 0 when ``n`` is 1. The penalty only uses differences, so this matches.
        """
        vector: dict[NGram, float] = {}
        norms = []
        idf, log_images = self._idf, self._log_images
        for k in range(1, self.n + 1):
            square = 0.0
            for g, tf in Counter(_ngrams(words, k)).items():
                weight = vector[g] = tf * idf.get(g, log_images)
                square += weight * weight
            norms.append(math.sqrt(square))
        length = max(len(words) - 1, 0) if self.n >= 2 else 0
        return vector, norms, length

    def _reference_index(self, image_id: str) -> _References:
        refs = self._references.get(image_id)
        if refs is None:
            raise KeyError(f"image {image_id!r} has no references in the CIDEr-D corpus")
        postings: dict[NGram, list[tuple[int, float]]] = {}
        norms, lengths = [], []
        for r, ref in enumerate(refs):
            vector, norm, length = self._vector(ref)
            for g, weight in vector.items():
                postings.setdefault(g, []).append((r, weight))
            norms.append(norm)
            lengths.append(length)
        return _References(postings, norms, lengths)

    def _score_one(self, words: Sequence[str], refs: _References) -> float:
        n = self.n
        vector, norm, length = self._vector(words)
        dots = [[0.0] * n for _ in refs.lengths]
        for g, weight in vector.items():
            for r, ref_weight in refs.postings.get(g, ()):
                # CIDEr-D clipping: a candidate n-gram earns at most the reference's own weight.
                dots[r][len(g) - 1] += min(weight, ref_weight) * ref_weight
        total = 0.0
        for dot, ref_norm, ref_length in zip(dots, refs.norms, refs.lengths, strict=True):
            penalty = math.exp(-((length - ref_length) ** 2) / (2 * self.sigma**2))
            for k in range(n):
                denominator = norm[k] * ref_norm[k]
                if denominator:
                    total += dot[k] / denominator * penalty
        return 10.0 * total / (n * len(refs.lengths))

    def score(self, image_ids: Sequence[str], candidates: Sequence[Sequence[str]]) -> np.ndarray:
        """CIDEr-D (raw scale, x10) of each tokenised candidate against the references of ``image_ids[i]``.

        Returns float64 ``(len(candidates),)``. Candidates may share image ids (several samples per image);
        each image's references are vectorised once per call.
        """
        if len(image_ids) != len(candidates):
            raise ValueError(f"got {len(image_ids)} image ids for {len(candidates)} candidates")
        indexed: dict[str, _References] = {}
        scores = np.empty(len(candidates))
        for i, (image_id, words) in enumerate(zip(image_ids, candidates, strict=True)):
            if isinstance(words, str):
                raise TypeError(f"candidate {i} is a string; CiderD scores token lists (use edgecap.vocab.tokenize)")
            refs = indexed.get(image_id)
            if refs is None:
                refs = indexed[image_id] = self._reference_index(image_id)
            scores[i] = self._score_one([*words, *self._end], refs)
        return scores


def corpus_cider(references: Mapping[str, Sequence[Sequence[str]]], candidates: Mapping[str, Sequence[str]]) -> float:
    """Mean CIDEr-D of one tokenised candidate per image, idf from ``references``; Java-free validation score.

    With ``candidates`` covering every image of ``references`` this equals pycocoevalcap's corpus CIDEr.
    """
    if not candidates:
        raise ValueError("corpus_cider needs at least one candidate")
    image_ids = list(candidates)
    return float(CiderD(references).score(image_ids, [candidates[i] for i in image_ids]).mean())


def best_constant_cider(references: Mapping[str, Sequence[Sequence[str]]],
                        constants: Sequence[Sequence[str]]) -> float:
    """The highest mean CIDEr-D (raw scale) that one of ``constants``, given to every image, scores.

    The floor a captioner must clear to show it looks at the image at all.
    """
    if not constants:
        raise ValueError("best_constant_cider needs at least one constant caption")
    image_ids = list(references)
    scores = CiderD(references).score([i for _ in constants for i in image_ids],
                                      [list(c) for c in constants for _ in image_ids])
    return float(scores.reshape(len(constants), len(image_ids)).mean(axis=1).max())
