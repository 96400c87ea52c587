"""``encoder.weights``: a backbone read from a file, either a state dict or the fine-tuned encoder of an edgecap
checkpoint, so an encoder fine-tuned on a GPU can be frozen for decoder training on a CPU."""

from pathlib import Path

import pytest
import torch

from edgecap.checkpoint import checkpoint_payload, load_model, save_atomic
from edgecap.config import EncoderConfig
from edgecap.data.features import cached_features
from edgecap.data.records import ImageRecord
from edgecap.errors import ModelError
from edgecap.models import build_model
from edgecap.models.caption_model import CaptionModel
from edgecap.models.encoder import build_encoder, grid_features
from edgecap.preprocess import Preprocessing, load_images
from edgecap.torch_backend import split_features
from edgecap.vocab import Vocab
from edgecap.weight_storage import SCALE, pack_int8

SAMPLES = Path(__file__).resolve().parents[2] / "edgecap" / "assets" / "samples"
PREP = Preprocessing(image_size=64)  # a 2 x 2 grid: enough to compare features, quick on a CPU
RECORDS = [ImageRecord(image_id=name, path=SAMPLES / f"{name}.jpg", captions=("a photo",))
           for name in ("chelsea", "coffee")]


def _lite0(seed: int) -> torch.nn.Module:
    """A Lite0 with its own weights (seeded), standing in for one fine-tuned elsewhere."""
    torch.manual_seed(seed)
    return build_encoder(EncoderConfig(), pretrained=False).eval()


def _features(encoder: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return grid_features(encoder, torch.from_numpy(load_images([r.path for r in RECORDS], PREP)))


def _save_checkpoint(path: Path, encoder: torch.nn.Module, encoder_config: EncoderConfig) -> Path:
    vocab = Vocab.build(["a photo of a cat"], min_count=1)
    decoder = build_model("sat", {"vocab_size": len(vocab), "num_locations": 4, "annotation_dim": 16,
                                  "embed_dim": 8, "hidden_dim": 12, "att_dim": 10})
    save_atomic(checkpoint_payload(CaptionModel(encoder, decoder).eval(), model_id="sat", vocab=vocab, prep=PREP,
                                   encoder_config=encoder_config, metrics={}), path)
    return path


def _save_weights(tmp_path: Path, kind: str, encoder: torch.nn.Module) -> Path:
    if kind == "state dict":
        torch.save(encoder.state_dict(), tmp_path / "lite0.pth")
        return tmp_path / "lite0.pth"
    return _save_checkpoint(tmp_path / "fine-tuned.pt", encoder, EncoderConfig(finetune=True))


@pytest.mark.parametrize("kind", ["state dict", "checkpoint"])
def test_the_encoder_comes_from_the_file(tmp_path, kind):
    source = _lite0(seed=1)
    path = _save_weights(tmp_path, kind, source)
    loaded = build_encoder(EncoderConfig(weights=str(path))).eval()
    assert torch.equal(_features(loaded), _features(source))
    assert not torch.equal(_features(loaded), _features(_lite0(seed=2)))


def test_a_small_cnn_comes_from_the_file_too(tmp_path):
    config = EncoderConfig(name="small_cnn", channels=8)
    torch.manual_seed(1)
    source = build_encoder(config).eval()
    torch.save(source.state_dict(), tmp_path / "cnn.pth")
    torch.manual_seed(2)
    loaded = build_encoder(EncoderConfig(name="small_cnn", channels=8, weights=str(tmp_path / "cnn.pth"))).eval()
    assert torch.equal(_features(loaded), _features(source))


def _frozen_checkpoint(tmp_path: Path) -> Path:
    return _save_checkpoint(tmp_path / "frozen.pt", _lite0(seed=1), EncoderConfig())


def _garbage(tmp_path: Path) -> Path:
    (tmp_path / "garbage.pt").write_bytes(b"not a torch file")
    return tmp_path / "garbage.pt"


def _damaged_int8_checkpoint(tmp_path: Path) -> Path:
    """A fine-tuned checkpoint stored with INT8 weights, one of whose scales went missing."""
    path = _save_checkpoint(tmp_path / "int8.pt", _lite0(seed=1), EncoderConfig(finetune=True))
    payload = torch.load(path, weights_only=True)
    payload["encoder"] = pack_int8(payload["encoder"])
    del payload["encoder"][next(k for k in payload["encoder"] if k.endswith(SCALE))]
    torch.save(payload, path)
    return path


@pytest.mark.parametrize(("make", "name", "message"), [
    (lambda tmp: tmp / "missing.pt", "efficientnet_lite0", "no such encoder weights file"),
    (_garbage, "efficientnet_lite0", "not a readable weights file"),
    (_frozen_checkpoint, "efficientnet_lite0", "stores no encoder"),
    (lambda tmp: _save_weights(tmp, "state dict", _lite0(seed=1)), "efficientnet_lite2", "do not fit"),
    (_damaged_int8_checkpoint, "efficientnet_lite0", "quantised weights without their scales"),
])
def test_a_bad_weights_file_is_a_one_line_error_naming_it(tmp_path, make, name, message):
    path = make(tmp_path)
    with pytest.raises(ModelError, match=message) as err:
        build_encoder(EncoderConfig(name=name, weights=str(path)))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_damaged_int8_checkpoint_is_a_one_line_error_naming_it(tmp_path):
    path = _damaged_int8_checkpoint(tmp_path)
    with pytest.raises(ModelError, match="quantised weights without their scales") as err:
        load_model(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_model_trained_on_a_weights_file_keeps_its_encoder_when_the_file_is_gone(tmp_path):
    source = _lite0(seed=1)
    weights = _save_weights(tmp_path, "checkpoint", source)
    frozen = EncoderConfig(weights=str(weights))
    model = _save_checkpoint(tmp_path / "trained.pt", build_encoder(frozen).eval(), frozen)
    weights.unlink()
    loaded = load_model(model)
    assert loaded.encoder_config.weights == str(weights)
    assert torch.equal(torch.as_tensor(split_features(loaded, RECORDS)), _features(source))


def test_the_feature_cache_follows_the_weights_files_content(tmp_path):
    path = tmp_path / "lite0.pth"
    config, cache = EncoderConfig(weights=str(path)), tmp_path / "cache"
    torch.save(_lite0(seed=1).state_dict(), path)
    first = torch.from_numpy(cached_features(RECORDS, config, PREP, directory=cache).astype("float32"))
    torch.save(_lite0(seed=2).state_dict(), path)
    second = torch.from_numpy(cached_features(RECORDS, config, PREP, directory=cache).astype("float32"))
    assert len(list(cache.glob("*.npy"))) == 2
    assert torch.allclose(first, _features(_lite0(seed=1)).half().float())
    assert torch.allclose(second, _features(_lite0(seed=2)).half().float())


def test_cache_names_written_by_earlier_versions_still_match():
    # Pinned from the version before encoder.frozen_batchnorm existed: a config field that does not change the
    # features must not rename every cache, or an upgrade re-encodes every dataset.
    from edgecap.data.features import _cache_key

    records = [ImageRecord(image_id=n, path=Path("photos") / f"{n}.jpg", captions=("a photo",)) for n in ("a", "b")]
    keys = [_cache_key(records, EncoderConfig(), Preprocessing(image_size=64), mirrored) for mirrored in (False, True)]
    assert keys == ["906729572ac88b00", "e6299c7b819d7635"]
