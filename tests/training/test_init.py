"""train.init starts a new run from another run's checkpoint: fine-tune on a GPU, go on self-critically on a CPU."""

import json

import pytest
import torch

from edgecap.checkpoint import read_checkpoint, save_atomic
from edgecap.config import EncoderConfig, SCSTConfig, TrainConfig, XEConfig
from edgecap.data.shapes import generate_shapes
from edgecap.errors import EdgecapError
from edgecap.weight_storage import INT4, INT8, pack_int4, pack_int8, stored_weights
from tests.helpers import invoke

BATCH_NORM_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


@pytest.fixture(scope="module")
def small_shapes(tmp_path_factory) -> str:
    json_path = generate_shapes(tmp_path_factory.mktemp("shapes") / "small", n_train=32, n_dev=8, n_test=0)
    return f"karpathy:{json_path}"


@pytest.fixture(scope="module")
def source_run(small_shapes, tmp_path_factory):
    """A tiny run whose small_cnn encoder trained with the decoder (as --finetune-encoder does on a GPU)."""
    run = tmp_path_factory.mktemp("source") / "run"
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(run),
                          "--set", "xe.epochs=2", "--set", "select.images=8")
    assert code == 0, output
    return run


def _metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("finetune", ["true", "false"])
def test_a_run_started_at_self_critical_training_holds_the_init_weights(small_shapes, source_run, tmp_path, finetune):
    # scst_lr=0 leaves the weights as loaded: the new run's checkpoint and dev score must be the source's.
    # Frozen, the encoder comes from encoder.weights = the same checkpoint, through the feature cache.
    source = source_run / "best.pt"
    run = tmp_path / "run"
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(run),
                          "--set", f"train.init={source}", "--set", "xe.epochs=0", "--set", "scst.epochs=1",
                          "--set", "scst.lr=0", "--set", "select.images=8",
                          "--set", f"encoder.finetune={finetune}", "--set", f"encoder.weights={source}",
                          "--cache-dir", str(tmp_path / "cache"))
    assert code == 0, output
    before, after = read_checkpoint(source), read_checkpoint(run / "best.pt")
    assert json.loads((run / "vocab.json").read_text()) == before["vocab"]
    for part in ("decoder", "encoder"):
        assert after[part].keys() == before[part].keys()
        weights = [k for k in before[part] if not k.endswith(BATCH_NORM_STATISTICS)]  # these move in train mode
        assert weights and all(torch.equal(after[part][k], before[part][k]) for k in weights)
    assert [m["phase"] for m in _metrics(run)] == ["scst"]
    assert _metrics(run)[0]["dev_cider"] == pytest.approx(before["metrics"]["dev_cider"], abs=1e-3)


def test_an_init_of_another_decoder_shape_is_one_line(small_shapes, source_run, tmp_path):
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(tmp_path / "run"),
                          "--set", f"train.init={source_run / 'best.pt'}", "--set", "model.embed_dim=48",
                          "--set", "select.images=8")
    assert code == 2
    assert output.startswith(f"error: {source_run / 'best.pt'}: train.init holds a sat decoder")
    assert "embed_dim" in output and "\n" not in output.strip()


def test_no_cross_entropy_epochs_need_an_init_and_self_critical_epochs():
    with pytest.raises(EdgecapError, match="xe.epochs must be >= 1"):
        TrainConfig(xe=XEConfig(epochs=0), scst=SCSTConfig(epochs=3))
    with pytest.raises(EdgecapError, match="needs scst.epochs"):
        TrainConfig(xe=XEConfig(epochs=0), init="run/best.pt")
    assert TrainConfig(xe=XEConfig(epochs=0), scst=SCSTConfig(epochs=3), init="run/best.pt").xe.epochs == 0


@pytest.mark.parametrize("frozen", [True, False])
def test_frozen_batchnorm_keeps_a_fine_tuned_encoders_statistics_while_its_weights_train(small_shapes, source_run,
                                                                                         tmp_path, frozen):
    source = source_run / "best.pt"
    run = tmp_path / "run"
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(run),
                          "--set", f"train.init={source}", "--set", "xe.epochs=0", "--set", "scst.epochs=1",
                          "--set", "scst.lr=1e-3", "--set", "select.images=8", "--set",
                          f"encoder.weights={source}", "--set", f"encoder.frozen_batchnorm={str(frozen).lower()}")
    assert code == 0, output
    before, after = read_checkpoint(source)["encoder"], read_checkpoint(run / "last.pt")["encoder"]
    statistics = [k for k in before if k.endswith(BATCH_NORM_STATISTICS)]
    weights = [k for k in before if k.endswith("weight")]
    assert statistics and weights
    assert all(torch.equal(after[k], before[k]) for k in statistics) == frozen
    assert not all(torch.equal(after[k], before[k]) for k in weights)


def test_frozen_batchnorm_needs_a_fine_tuned_encoder():
    with pytest.raises(EdgecapError, match="frozen_batchnorm=true needs --finetune-encoder"):
        EncoderConfig(frozen_batchnorm=True)
    assert EncoderConfig(finetune=True, frozen_batchnorm=True).frozen_batchnorm


def test_a_run_killed_before_its_first_checkpoint_starts_again_from_its_init(small_shapes, source_run, tmp_path):
    # What the killed start leaves behind (a long feature cache is the usual place to stop one): config.json,
    # command.txt and vocab.json, no checkpoint. Started again, the run must still load train.init's decoder.
    source, run = source_run / "best.pt", tmp_path / "run"
    run.mkdir()
    (run / "vocab.json").write_text(json.dumps(read_checkpoint(source)["vocab"]))
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(run),
                          "--set", f"train.init={source}", "--set", "xe.epochs=0", "--set", "scst.epochs=1",
                          "--set", "scst.lr=0", "--set", "select.images=8")
    assert code == 0, output
    before, after = read_checkpoint(source)["decoder"], read_checkpoint(run / "best.pt")["decoder"]
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_a_new_run_rewrites_the_vocabulary_a_killed_start_left(small_shapes, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "vocab.json").write_text(json.dumps({"words": ["<pad>", "<bos>", "<eos>", "<unk>", "stale"]}))
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(run),
                          "--set", "xe.epochs=1", "--set", "select.images=8")
    assert code == 0, output
    assert "stale" not in json.loads((run / "vocab.json").read_text())["words"]


@pytest.mark.parametrize("pack, suffix", [(pack_int8, INT8), (pack_int4, INT4)])
def test_a_checkpoint_stored_with_quantised_weights_starts_a_run_with_its_rounded_weights(small_shapes, source_run,
                                                                                          tmp_path, pack, suffix):
    # A shipped checkpoint may store weight-only INT8 or INT4: as train.init and encoder.weights it must give the
    # weights it stands for, which scst_lr=0 leaves in the new run's checkpoint.
    packed = read_checkpoint(source_run / "best.pt")
    packed["decoder"], packed["encoder"] = pack(packed["decoder"]), pack(packed["encoder"])
    source, run = tmp_path / "packed.pt", tmp_path / "run"
    save_atomic(packed, source)
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(run),
                          "--set", f"train.init={source}", "--set", "xe.epochs=0", "--set", "scst.epochs=1",
                          "--set", "scst.lr=0", "--set", "select.images=8", "--set", "encoder.finetune=true",
                          "--set", f"encoder.weights={source}", "--cache-dir", str(tmp_path / "cache"))
    assert code == 0, output
    after = read_checkpoint(run / "best.pt")
    assert any(k.endswith(suffix) for k in packed["decoder"]) and any(k.endswith(suffix) for k in packed["encoder"])
    for part in ("decoder", "encoder"):
        expected = stored_weights(packed[part])
        weights = [k for k in expected if not k.endswith(BATCH_NORM_STATISTICS)]
        assert weights and all(torch.equal(after[part][k], expected[k]) for k in weights)


def test_a_shipped_id_names_its_checkpoint(small_shapes, tmp_path):
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(tmp_path / "run"),
                          "--set", "train.init=glied", "--set", "select.images=8")
    assert code == 2  # the shipped GLIED file was read: its decoder is not the tiny SAT this run builds
    assert output.startswith("error: glied: train.init holds a glied decoder"), output
