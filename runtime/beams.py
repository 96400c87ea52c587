"""The beam update: each image's next beams among its rows' candidates, and the hypotheses that end with eos.

It owns no model state: it emits back-pointers (``parent``, the ``reorder`` of the next step) that the session gathers
its state by. :func:`update_groups` is diverse beam search's coupled update of several groups.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from edgecap.vocab import EOS

NEG_INF = -np.inf


class BeamUpdate(NamedTuple):
    parent: np.ndarray  # int64 (B, beam): row, within its image, that each new beam continues (the back-pointer)
    words: np.ndarray  # int64 (B, beam): word each new beam appends
    cumulative: np.ndarray  # float64 (B, beam): log-prob of each new beam, best first; -inf for dead beams
    ended_image: np.ndarray  # int64 (E,): image of each hypothesis that ends with eos at this step, best first
    ended_row: np.ndarray  # int64 (E,): its row within the image
    ended_logprob: np.ndarray  # float64 (E,): its total log-prob, eos included


_NO_ROWS = np.zeros(0, dtype=np.int64)  # what a step at which nothing ends reports
_NO_LOGPROBS = np.zeros(0, dtype=np.float64)


@lru_cache(maxsize=16)
def _image_column(batch: int) -> np.ndarray:
    """int64 (B, 1): 0 .. B-1, the row index that pairs with a (B, beam) column index."""
    column = np.arange(batch)[:, None]
    column.flags.writeable = False
    return column


def update_beams(cumulative: np.ndarray, scores: np.ndarray, ids: np.ndarray, beam: int) -> BeamUpdate:
    """Choose each image's next beams among rows x k candidates by cumulative log-prob.

    cumulative (B, R) log-prob of each row; scores (B * R, k) filtered log-probs of its candidates ids (B * R, k),
    image-major. An eos among an image's best ``beam`` candidates ends that hypothesis (so one beam is greedy
    decoding); the beams go on with the best ``beam`` other candidates. Ties keep row-then-rank order (stable sorts).
    """
    batch, k = len(cumulative), scores.shape[1]
    totals = (scores + cumulative.reshape(-1, 1)).reshape(batch, -1)
    flat_ids = ids.reshape(batch, -1)
    images = _image_column(batch)
    top = (-totals).argsort(axis=1, kind="stable")[:, :beam]
    top_words = flat_ids[images, top]
    top_is_eos = top_words == EOS
    if not top_is_eos.any():
        # Nothing ends, and the best candidates are the next beams: taking the eos out of the ranking cannot
        # move a candidate above them (the common step, so it skips the second sort).
        return BeamUpdate(parent=top // k, words=top_words, cumulative=totals[images, top],
                          ended_image=_NO_ROWS, ended_row=_NO_ROWS, ended_logprob=_NO_LOGPROBS)
    top_totals = totals[images, top]
    ended = top_is_eos & np.isfinite(top_totals)
    ended_image, ended_rank = ended.nonzero()
    live = np.where(flat_ids == EOS, NEG_INF, totals)
    choice = (-live).argsort(axis=1, kind="stable")[:, :beam]
    return BeamUpdate(parent=choice // k, words=flat_ids[images, choice],
                      cumulative=live[images, choice], ended_image=ended_image,
                      ended_row=top[ended_image, ended_rank] // k, ended_logprob=top_totals[ended])


def update_groups(cumulative: np.ndarray, scores: np.ndarray, ids: np.ndarray, beam: int, groups: int,
                  diversity: float) -> BeamUpdate:
    """Diverse beam search's update (Vijayakumar et al., 2018): :func:`update_beams` of each group in turn, its
    candidates penalised by ``diversity`` x how often earlier groups of the same image chose each word at this step.

    Rows ``(b * groups + g) * beam + j`` are beam ``j`` of group ``g`` of image ``b``: each group is one "image" of
    ``beam`` beams to the rest of the search. The penalty steers only this step's choice: beams keep their model
    log-probs, so finished captions rank by what the model says.
    """
    batch, k = len(cumulative) // groups, scores.shape[1]
    by_group = [cumulative.reshape(batch, groups, beam), scores.reshape(batch, groups, beam, k),
                ids.reshape(batch, groups, beam, k)]
    images = _image_column(batch)
    chosen = np.zeros((batch, 0), dtype=np.int64)  # words earlier groups chose at this step, -1 for dead beams
    parts = []
    for g in range(groups):
        cum, raw, cand = (a[:, g] for a in by_group)  # (B, beam), (B, beam, k), (B, beam, k)
        times = (cand[..., None] == chosen[:, None, None, :]).sum(-1)
        update = update_beams(cum, (raw - diversity * times).reshape(-1, k), cand.reshape(-1, k), beam)
        parent_cand = cand[images, update.parent]  # (B, beam, k): the candidates the new beams came from
        column = (parent_cand == update.words[..., None]).argmax(-1)
        model_total = cum[images, update.parent] + raw[images, update.parent, column]
        alive = np.isfinite(update.cumulative)
        eos_column = (cand[update.ended_image, update.ended_row] == EOS).argmax(-1)
        ended = cum[update.ended_image, update.ended_row] + raw[update.ended_image, update.ended_row, eos_column]
        parts.append(BeamUpdate(update.parent, update.words, np.where(alive, model_total, NEG_INF),
                                update.ended_image * groups + g, update.ended_row, ended))
        chosen = np.concatenate([chosen, np.where(alive, update.words, -1)], axis=1)
    stack = [np.stack([getattr(p, f) for p in parts], axis=1).reshape(batch * groups, beam)
             for f in ("parent", "words", "cumulative")]
    return BeamUpdate(*stack, *(np.concatenate([getattr(p, f) for p in parts])
                                for f in ("ended_image", "ended_row", "ended_logprob")))
