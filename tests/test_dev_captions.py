"""benchmarks/dev_captions.py and score_captions.py: captions written where the GPU is are the ones training selected
on, and score, where Java is, into a report that compare_evals.py pairs; benchmarks/claims_gpu.sh runs an arm end to
end on a CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgecap.checkpoint import read_checkpoint
from edgecap.cider import CiderD
from edgecap.data import load_dataset
from edgecap.data.shapes import generate_shapes
from edgecap.training.data import tokenised_references
from tests.helpers import invoke
from tests.needs import needs_scoring

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(name: str, *args, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGECAP_CACHE": str(cache)}
    command = [str(BENCHMARKS / name)] if name.endswith(".sh") else [sys.executable, str(BENCHMARKS / name)]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory):
    """A tiny run on a frozen encoder, its dev selection over every dev photo, and the cache it filled."""
    root = tmp_path_factory.mktemp("frozen")
    data = f"karpathy:{generate_shapes(root / 'shapes', n_train=24, n_dev=6, n_test=0)}"
    code, output = invoke("train", "--data", data, "--preset", "tiny", "--out", str(root / "run"),
                          "--set", "xe.epochs=2", "--set", "select.images=0", "--set", "encoder.finetune=false",
                          "--cache-dir", str(root / "cache" / "features"))
    assert code == 0, output
    return data, root / "run", root / "cache"


def test_the_captions_are_the_ones_training_scored(frozen_run, tmp_path):
    data, run, cache = frozen_run
    done = _script("dev_captions.py", run, "--data", data, "--out", tmp_path, "--beam", "1", "--max-length", "16",
                   cache=cache)  # as the tiny preset selects
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    dev = load_dataset(data).split("dev")
    assert set(report["captions"]) == {r.image_id for r in dev} and report["beam"] == 1
    ids = [r.image_id for r in dev]
    cider = 100 * CiderD(tokenised_references(dev)).score(ids, [report["captions"][i].split() for i in ids]).mean()
    assert cider == pytest.approx(read_checkpoint(run / "best.pt")["metrics"]["dev_cider"], abs=0.01)


@needs_scoring
def test_scored_captions_pair_with_compare_evals(frozen_run, tmp_path):
    data, run, cache = frozen_run
    assert _script("dev_captions.py", run, "--data", data, "--out", tmp_path / "captions", cache=cache).returncode == 0
    done = _script("score_captions.py", tmp_path / "captions" / "run.json", "--data", data, "--out", tmp_path / "eval",
                   cache=cache)
    assert done.returncode == 0, done.stderr
    assert "CIDEr-D" in done.stdout
    report = tmp_path / "eval" / "run.json"
    assert len(json.loads(report.read_text())["per_image_cider"]) == 6
    paired = _script("compare_evals.py", report, report, cache=cache)
    assert paired.returncode == 0 and "ΔCIDEr-D +0.00" in paired.stdout, paired.stdout + paired.stderr


def test_a_file_that_is_not_a_captions_report_is_one_line(tmp_path):
    bad = tmp_path / "eval.json"
    bad.write_text(json.dumps({"metrics": {}}))
    done = _script("score_captions.py", bad, "--data", "shapes", "--out", tmp_path, cache=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"error: {bad}: not a dev_captions.py report (KeyError: 'search'); write one with "
                                   "`python benchmarks/dev_captions.py`")


@pytest.mark.slow
def test_the_claims_batch_runs_an_arm_end_to_end(tmp_path):
    data = f"karpathy:{generate_shapes(tmp_path / 'shapes', n_train=16, n_dev=4, n_test=0)}"
    done = subprocess.run([str(BENCHMARKS / "claims_gpu.sh"), data, tmp_path / "out"], capture_output=True, text=True,
                          env={**os.environ, "EDGECAP_CACHE": str(tmp_path / "cache"), "PYTHON": sys.executable,
                               "ARMS": "spca-C", "EXTRA": "--set xe.epochs=1 --set select.images=0 "
                                                          "--set train.min_word_count=1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "spca-C: 1 epochs" in done.stdout
    assert len(json.loads((tmp_path / "out" / "captions" / "spca-C.json").read_text())["captions"]) == 4

    done = subprocess.run([str(BENCHMARKS / "claims_gpu.sh"), data, tmp_path / "out"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, "ARMS": "spca-X"})
    assert done.returncode == 2 and "unknown arm 'spca-X'" in done.stderr
