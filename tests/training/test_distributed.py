"""Data-parallel training on CPU (gloo) or GPUs (nccl): two ranks train what one process trains; rank 0 writes."""

import json

import numpy as np
import pytest
import torch

from edgecap.checkpoint import load_model
from edgecap.data.shapes import generate_shapes
from edgecap.errors import EdgecapError
from edgecap.training import distributed
from tests.helpers import invoke

# 64 images x 5 captions = 320 pairs: 10 global batches of 32 per epoch. Dropout off so the runs are comparable.
TINY = ["--preset", "tiny", "--set", "model.dropout=0", "--set", "select.images=8"]
# Under CUDA each rank takes a GPU of its own (nccl); CPU machines run the ranks on gloo.
two_ranks = pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                               reason="2 ranks under CUDA need 2 GPUs; this machine has 1")


@pytest.fixture(scope="module")
def small_shapes(tmp_path_factory) -> str:
    json_path = generate_shapes(tmp_path_factory.mktemp("shapes") / "small", n_train=64, n_dev=8, n_test=0)
    return f"karpathy:{json_path}"


def _history(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@two_ranks
def test_two_ranks_follow_the_single_process_loss_trajectory(small_shapes, tmp_path):
    """Same global batch and seed: 30 steps on 2 gloo ranks match 30 steps in one process.

    Gradients differ only by float summation order (~1e-7 relative). Per-epoch losses are logged to 4
    decimals, hence 2e-4. AdamW divides by sqrt(v), which turns that noise into lr-sized steps for the
    attention-score bias, whose true gradient is zero (softmax ignores a shift); it does not move the
    outputs, and log-probs of the final models agree to ~1e-4, hence 1e-3.
    """
    args = ["train", "--data", small_shapes, *TINY, "--set", "xe.epochs=3", "--set", "encoder.finetune=false"]
    code, output = invoke(*args, "--out", str(tmp_path / "one"), "--cache-dir", str(tmp_path / "cache1"))
    assert code == 0, output
    code, output = invoke(*args, "--out", str(tmp_path / "two"), "--cache-dir", str(tmp_path / "cache2"),
                          "--nproc", "2")
    assert code == 0, output
    one, two = _history(tmp_path / "one"), _history(tmp_path / "two")
    assert [h["step"] for h in two] == [10, 20, 30]
    np.testing.assert_allclose([h["train_loss"] for h in two], [h["train_loss"] for h in one], atol=2e-4)
    assert [h["train_loss"] for h in two][-1] < [h["train_loss"] for h in two][0] - 0.3  # it did learn
    np.testing.assert_allclose([h["dev_cider"] for h in two], [h["dev_cider"] for h in one], atol=0.01)
    torch.manual_seed(0)
    features, tokens = torch.randn(4, 36, 64), torch.randint(4, 20, (4, 8))
    a, b = (load_model(tmp_path / run / "last.pt").model.decoder for run in ("one", "two"))
    with torch.no_grad():
        torch.testing.assert_close(b(features, tokens).logprobs, a(features, tokens).logprobs, atol=1e-3,
                                   rtol=0)
    # rank 0 alone built the feature cache (train and dev), and it is complete
    assert sorted(p.suffix for p in (tmp_path / "cache2").iterdir()) == [".npy", ".npy"]


@pytest.mark.slow
@two_ranks
def test_rank_zero_writes_a_loadable_run_with_self_critical_c2f(small_shapes, tmp_path):
    """Stack-Captioning with a fine-tuned encoder: XE, then coarse-to-fine RL with an all-reduced reward."""
    out = tmp_path / "stack"
    code, output = invoke("train", "--model", "stackcap", "--data", small_shapes, *TINY, "--out", str(out),
                          "--max-steps", "6", "--scst-epochs", "1", "--set", "scst.batch_images=32",
                          "--nproc", "2")
    assert code == 0, output
    assert sorted(p.name for p in out.iterdir()) == ["best.pt", "command.txt", "config.json", "last.pt",
                                                     "metrics.jsonl", "vocab.json"]
    history = _history(out)
    assert [(h["phase"], h["step"]) for h in history] == [("xe", 6), ("scst", 8)]  # one line per epoch, not per rank
    assert 0 <= history[1]["train_reward"] <= 1000
    assert len((out / "command.txt").read_text().splitlines()) == 1
    loaded = load_model(out)
    assert loaded.model_id == "stackcap" and loaded.metrics["phase"] in ("xe", "scst")
    assert all(not k.startswith("module.") for k in torch.load(out / "best.pt", weights_only=True)["decoder"])


@pytest.mark.parametrize(("flags", "message"), [(["--nproc", "0"], "--nproc 0"),
                                                (["--nproc", "3", "--set", "xe.batch_size=2"], "batch_size=2")])
def test_bad_process_counts_are_one_line_errors(tmp_path, flags, message):
    code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(tmp_path / "run"), *flags)
    assert code == 2 and message in output and "\n" not in output.strip()
    assert not (tmp_path / "run").exists()


def test_nproc_inside_a_launched_rank_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(EdgecapError, match="torchrun already starts"):
        distributed.launch(2, print)


def test_shards_are_disjoint_and_cover_the_global_batch():
    batch = np.arange(11)
    shards = [distributed.shard(batch, distributed.Context(rank=r, world_size=3)) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 3]
    np.testing.assert_array_equal(np.concatenate(shards), batch)
    assert distributed.shard(batch, distributed.Context()) is batch
