"""Training on a CUDA GPU: ``edgecap train`` trains there whenever one is visible, with no flag.

CI has no GPU, so these skip there; every other training test also runs on the GPU on a machine that has one.
This one proves the GPU was used, and that what a GPU run saves is what the CPU side (eval, export, the
runtime) loads: checkpoints hold CPU tensors (loaded here without ``map_location``), and a resumed run carries
its weight average on.
"""

import json

import pytest
import torch

from edgecap.checkpoint import read_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU is visible to torch")


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _tensors(value)


def test_a_run_trains_on_the_gpu_and_its_checkpoints_load_on_the_cpu(tmp_path):
    from tests.helpers import SAMPLES, invoke

    run = tmp_path / "cuda"
    torch.cuda.reset_peak_memory_stats()
    code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(run), "--max-steps", "60",
                          "--scst-epochs", "1", "--set", "select.images=10", "--set", "xe.label_smoothing=0.1",
                          "--set", "optim.ema_decay=0.95")
    assert code == 0, output
    assert torch.cuda.max_memory_allocated() > 0, "the run never allocated GPU memory: it trained on the CPU"
    assert f"trainable parameters on cuda ({torch.cuda.get_device_name()})" in output

    phases = [json.loads(line)["phase"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "xe" in phases and "scst" in phases
    for name in ("best.pt", "last.pt"):
        devices = {t.device.type for t in _tensors(torch.load(run / name, weights_only=True))}
        assert devices == {"cpu"}, f"{name} holds tensors on {devices}"

    code, output = invoke("caption", str(SAMPLES / "chelsea.jpg"), "--model", str(run), "--beam", "2")
    assert code == 0 and output.strip(), output

    config = json.loads((run / "config.json").read_text())
    config["train"]["scst"]["epochs"] = 2
    (run / "config.json").write_text(json.dumps(config))
    code, output = invoke("train", "--out", str(run), "--resume")
    assert code == 0, output
    assert read_checkpoint(run / "last.pt")["train_state"]["weight_average"]["updates"] > 60


def test_a_transformer_on_a_frozen_encoder_caches_selects_and_samples_on_the_gpu(tmp_path):
    """The feature cache is filled on the GPU and held there; dev selection and self-critical sampling step the
    Transformer there, its position index included."""
    from tests.helpers import invoke

    run = tmp_path / "a2"
    code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--model", "a2", "--out", str(run),
                          "--max-steps", "30", "--scst-epochs", "1", "--set", "select.images=10",
                          "--set", "encoder.finetune=false", "--cache-dir", str(tmp_path / "cache"))
    assert code == 0, output
    phases = [json.loads(line)["phase"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "xe" in phases and "scst" in phases
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 2  # train and dev, filled by the GPU
