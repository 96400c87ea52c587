"""A trained encoder gets its own learning rate (train.encoder_lr), in both phases."""

import pytest

from edgecap.checkpoint import read_checkpoint
from edgecap.data.shapes import generate_shapes
from tests.helpers import invoke


@pytest.fixture(scope="module")
def small_shapes(tmp_path_factory) -> str:
    json_path = generate_shapes(tmp_path_factory.mktemp("shapes") / "small", n_train=32, n_dev=8, n_test=0)
    return f"karpathy:{json_path}"


def _group_rates(run) -> list[tuple[int, float]]:
    """(parameter count, lr) per optimiser group of the run's last.pt."""
    groups = read_checkpoint(run / "last.pt")["train_state"]["optimizer"]["param_groups"]
    return [(len(g["params"]), g["lr"]) for g in groups]


@pytest.mark.parametrize("encoder_lr, scale", [("1e-4", 0.05), ("0", 1.0)])
def test_encoder_group_runs_at_encoder_lr_over_lr_of_each_phase(small_shapes, tmp_path, encoder_lr, scale):
    # tiny preset: small_cnn encoder trained with the decoder, lr 2e-3, scst_lr 5e-5
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(tmp_path / "run"),
                          "--set", "xe.epochs=1", "--set", "scst.epochs=1", "--set", "select.images=4",
                          "--set", f"optim.encoder_lr={encoder_lr}")
    assert code == 0, output
    (decoder_params, decoder_lr), (encoder_params, encoder_lr_now) = _group_rates(tmp_path / "run")
    assert decoder_params > 0 and encoder_params > 0
    assert decoder_lr == pytest.approx(5e-5) and encoder_lr_now == pytest.approx(5e-5 * scale)


def test_a_frozen_encoder_has_no_group(small_shapes, tmp_path):
    code, output = invoke("train", "--data", small_shapes, "--preset", "tiny", "--out", str(tmp_path / "run"),
                          "--set", "xe.epochs=1", "--set", "select.images=4", "--set", "encoder.finetune=false",
                          "--set", "optim.encoder_lr=1e-4", "--cache-dir", str(tmp_path / "cache"))
    assert code == 0, output
    assert len(_group_rates(tmp_path / "run")) == 1
