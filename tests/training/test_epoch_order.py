"""A cross-entropy epoch's order: every caption once; ``xe.captions_per_image`` k keeps up to k captions of a photo
side by side with one flip, and a batch then reads and encodes each photo view once."""

import numpy as np
import pytest
import torch

from edgecap.training.data import epoch_order
from edgecap.training.losses import xe_loss
from edgecap.vocab import PAD

PHOTOS = np.repeat(np.arange(6), [5, 5, 5, 3, 7, 5])  # the photo of each caption pair; one has 7, one 3


def test_one_caption_per_image_is_the_plain_shuffle():
    order, flipped = epoch_order(PHOTOS, captions_per_image=1, mirror_share=0.5, seed=7)
    assert (order == np.random.default_rng(7).permutation(len(PHOTOS))).all()
    assert (flipped == (np.random.default_rng(2007).random(len(PHOTOS)) < 0.5)).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouped_captions_are_adjacent_with_one_flip_and_every_pair_comes_once(seed):
    order, flipped = epoch_order(PHOTOS, captions_per_image=5, mirror_share=0.5, seed=seed)
    assert sorted(order) == list(range(len(PHOTOS)))
    for photo, captions in enumerate(np.bincount(PHOTOS)):
        positions = np.flatnonzero(PHOTOS[order] == photo)
        groups = np.split(positions, np.flatnonzero(np.diff(positions) > 1) + 1)  # runs of adjacent positions
        assert len(groups) <= -(-captions // 5)  # 7 captions: a group of 5 and one of 2, maybe side by side
        assert sum(len(set(flipped[order[g]])) for g in groups) <= -(-captions // 5)
    assert flipped.any() and not flipped.all()


def test_a_grouped_batch_encodes_each_photo_view_once_and_keeps_the_per_caption_loss(shapes_trainer):
    trainer = shapes_trainer(["xe.captions_per_image=5", "xe.mirror_share=0.5"])
    trainer.model.eval()  # no dropout: the two losses must agree to rounding
    order, flipped = epoch_order(trainer.pairs.image_index, captions_per_image=5, mirror_share=0.5, seed=0)
    rows = order[:12]
    asked = []
    get = trainer.train_features.get
    trainer.train_features.get = lambda indices, flips=None: asked.append(len(indices)) or get(indices, flips)
    loss, _ = trainer._xe_loss(rows, flipped[rows], len(rows))
    views = {(p, f) for p, f in zip(trainer.pairs.image_index[rows], flipped[rows], strict=True)}
    assert asked == [len(views)] and len(views) < len(rows)

    tokens = torch.from_numpy(trainer.pairs.batch(rows, flipped[rows], trainer.mirrored_tokens))
    tokens = tokens[:, :int((tokens != PAD).sum(1).max())]
    out = trainer.model.decoder(get(trainer.pairs.image_index[rows], flipped[rows]), tokens[:, :-1])
    mask = (tokens[:, 1:] != PAD).float()
    expected, _ = xe_loss(out, tokens[:, 1:], mask, trainer.cfg.xe, n_tokens=mask.sum(), n_rows=len(rows))
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
