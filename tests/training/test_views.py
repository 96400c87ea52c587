"""The mirrored view of the training photos: flipped left-right, "left" and "right" swapped in their captions, and
cached once more for a frozen encoder."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edgecap.config import EncoderConfig, SCSTConfig, XEConfig
from edgecap.data import load_dataset
from edgecap.data.features import cached_features
from edgecap.data.records import ImageRecord
from edgecap.data.shapes import generate_shapes
from edgecap.errors import EdgecapError
from edgecap.models.caption_model import CaptionModel
from edgecap.models.encoder import build_encoder, grid_features
from edgecap.preprocess import Preprocessing, load_images
from edgecap.training.data import ImageFeatures, caption_pairs, mirrored_id, mirrored_token_table, tokenised_references
from edgecap.vocab import Vocab
from tests.helpers import invoke

ENCODER = EncoderConfig(name="small_cnn", image_size=64, channels=8)
PREP = Preprocessing(image_size=64)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    json_path = generate_shapes(tmp_path_factory.mktemp("shapes") / "small", n_train=12, n_dev=4, n_test=0)
    return load_dataset(f"karpathy:{json_path}").split("train")


@pytest.fixture(scope="module")
def captioner():
    torch.manual_seed(0)
    return CaptionModel(build_encoder(ENCODER).eval(), torch.nn.Linear(1, 1))


@pytest.fixture(autouse=True)
def same_encoder_weights():
    """A cache builds its own small_cnn, randomly initialised: seeded, it equals ``captioner``'s."""
    torch.manual_seed(0)


def test_left_and_right_trade_places_and_nothing_else_moves():
    vocab = Vocab.build(["a dog runs left", "a dog looks right", "a cat on the left"], min_count=1)
    table = mirrored_token_table(vocab)
    assert table[vocab.index["left"]] == vocab.index["right"] and table[vocab.index["right"]] == vocab.index["left"]
    others = [i for i, w in enumerate(vocab.words) if w not in ("left", "right")]
    assert (table[others] == others).all()


def test_a_batch_swaps_left_and_right_in_its_mirrored_rows_only():
    vocab = Vocab.build(["a dog runs left", "a dog looks right"], min_count=1)
    pairs = caption_pairs(_records(["a dog runs left", "a dog looks right"]), vocab, max_length=6)
    tokens = pairs.batch(np.array([1, 0, 1]), np.array([True, True, False]), mirrored_token_table(vocab))
    assert [vocab.decode(t[1:]) for t in tokens] == ["a dog looks left", "a dog runs right", "a dog looks right"]
    assert vocab.decode(pairs.tokens[0][1:]) == "a dog runs left"  # the pairs themselves are untouched


def _records(captions):
    return [ImageRecord(image_id=str(i), path=Path(f"{i}.jpg"), captions=(c,)) for i, c in enumerate(captions)]


def test_a_vocabulary_with_one_of_the_pair_keeps_it():
    vocab = Vocab.build(["a dog runs left"], min_count=1)
    assert (mirrored_token_table(vocab) == np.arange(len(vocab))).all()


def test_mirrored_cache_holds_the_flipped_photos_features_in_a_file_of_its_own(records, captioner, tmp_path):
    encoder = captioner.encoder
    plain = cached_features(records, ENCODER, PREP, directory=tmp_path)
    torch.manual_seed(0)
    mirrored = cached_features(records, ENCODER, PREP, directory=tmp_path, mirrored=True)
    assert len(list(tmp_path.glob("*.npy"))) == 2
    pixels = torch.from_numpy(load_images([r.path for r in records], PREP))
    with torch.no_grad():
        expected = grid_features(encoder, pixels.flip(-1)).numpy()
        unflipped = grid_features(encoder, pixels).numpy()
    np.testing.assert_allclose(mirrored.astype(np.float32), expected, atol=1e-4, rtol=1e-2)
    np.testing.assert_allclose(plain.astype(np.float32), unflipped, atol=1e-4, rtol=1e-2)
    assert np.abs(expected - unflipped).max() > 0.01  # the shapes photos are not symmetric


@pytest.mark.parametrize("finetune", [False, True])
def test_features_of_mirrored_rows_come_from_the_flipped_photo(records, captioner, tmp_path, finetune):
    config = EncoderConfig(name="small_cnn", image_size=64, channels=8, finetune=finetune)
    if not finetune:  # the mirrored view, cached second, must come from the same weights
        cached_features(records, ENCODER, PREP, directory=tmp_path)
        torch.manual_seed(0)
    features = ImageFeatures(records, captioner, config, PREP, cache_dir=tmp_path, label="t", mirrored=True)
    indices = np.array([5, 0, 3, 7])
    mirrored = np.array([True, False, True, False])
    pixels = torch.from_numpy(load_images([records[i].path for i in indices], PREP))
    with torch.no_grad():
        got = features.get(indices, mirrored)
        plain = grid_features(captioner.encoder, pixels)
        flipped = grid_features(captioner.encoder, pixels.flip(-1))
    expected = torch.where(torch.from_numpy(mirrored)[:, None, None], flipped, plain)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-2)


def test_a_split_built_without_mirror_refuses_mirrored_rows(records, captioner, tmp_path):
    features = ImageFeatures(records, captioner, ENCODER, PREP, cache_dir=tmp_path, label="t")
    with pytest.raises(ValueError, match="mirror"):
        features.get(np.array([0, 1]), np.array([True, False]))


@pytest.mark.parametrize("config", [XEConfig, SCSTConfig])
def test_mirror_share_out_of_range_is_refused(config):
    with pytest.raises(EdgecapError, match="mirror_share"):
        config(mirror_share=1.5)


def test_a_mirrored_reference_corpus_holds_both_views_with_left_and_right_swapped_in_the_flipped_one():
    references = tokenised_references(_records(["a dog runs left", "A cat sits."]), mirrored=True)
    assert references == {"0": [["a", "dog", "runs", "left"]], "1": [["a", "cat", "sits"]],
                          mirrored_id("0"): [["a", "dog", "runs", "right"]], mirrored_id("1"): [["a", "cat", "sits"]]}


@pytest.mark.parametrize("mirror", [0.0, 1.0])
def test_self_critical_images_are_sampled_and_scored_on_the_view_the_share_picks(shapes_trainer, mirror):
    trainer = shapes_trainer(["scst.epochs=1", "scst.batch_images=4", f"scst.mirror_share={mirror}"])
    asked, scored = [], []
    get = trainer.train_features.get

    def get_and_record(indices, flipped=None):
        asked.extend(flipped)
        return get(indices, flipped)

    trainer.train_features.get = get_and_record
    trainer._scst_epoch(0)  # builds the training corpus, then scores every batch against it
    score = trainer.train_cider.score
    trainer.train_cider.score = lambda ids, captions: scored.extend(ids) or score(ids, captions)
    trainer._scst_epoch(1)
    assert len(asked) == 16 and all(flip == bool(mirror) for flip in asked)
    flipped = {mirrored_id(r.image_id) for r in trainer.train_records}
    assert len(scored) == 8 * trainer.cfg.scst.samples and all((i in flipped) == bool(mirror) for i in scored)


def test_a_frozen_run_with_mirroring_trains_and_caches_both_views(tmp_path):
    json_path = generate_shapes(tmp_path / "shapes", n_train=24, n_dev=4, n_test=0)
    run = tmp_path / "run"
    code, output = invoke("train", "--data", f"karpathy:{json_path}", "--preset", "tiny", "--out", str(run),
                          "--set", "xe.epochs=1", "--set", "select.images=4", "--set", "encoder.finetune=false",
                          "--set", "xe.mirror_share=0.5", "--cache-dir", str(tmp_path / "cache"))
    assert code == 0, output
    names = sorted(p.name for p in (tmp_path / "cache").glob("*.npy"))
    assert len(names) == 3 and sum("-mirrored-" in n for n in names) == 1  # train, train mirrored, dev
    assert json.loads((run / "config.json").read_text())["train"]["xe"]["mirror_share"] == 0.5
