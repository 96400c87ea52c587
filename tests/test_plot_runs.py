"""benchmarks/plot_runs.py: runs' metrics.jsonl drawn side by side, each run's best epoch found across its phases,
and one-line errors for runs that cannot be drawn."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="plot_runs.py draws with matplotlib (the plots extra)")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "plot_runs.py"


def _run_dir(root: Path, name: str, xe: list[float], scst: list[float] = ()) -> Path:
    """A run directory as `edgecap train` leaves it: one metrics.jsonl line per epoch, phases in order."""
    run = root / name
    run.mkdir()
    rows = [{"phase": "xe", "epoch": i + 1, "dev_cider": c, "train_loss": 3.0, "seconds": 240.0}
            for i, c in enumerate(xe)]
    rows += [{"phase": "scst", "epoch": i + 1, "dev_cider": c, "train_reward": 50.0, "seconds": 600.0}
             for i, c in enumerate(scst)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _plot(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_runs_are_drawn_and_each_best_epoch_is_found_across_phases(tmp_path):
    plain = _run_dir(tmp_path, "plain", [22.0, 40.7, 45.8, 50.0, 49.9])
    rl = _run_dir(tmp_path, "with-scst", [25.0, 41.0, 46.0], [48.0, 52.8, 52.7])
    out = tmp_path / "figs" / "curves.png"

    result = _plot(plain, rl / "metrics.jsonl", "--out", out, "--label", "none", "--label", "gate", "--ymin", "40")

    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    lines = result.stdout.splitlines()
    assert lines[0].startswith("none") and "5 xe epochs; best 50.00 at epoch 4 (xe); 4.0 min" in lines[0]
    assert lines[1].startswith("gate") and "3 xe, 3 scst epochs; best 52.80 at epoch 5 (scst); 7.0 min" in lines[1]


def test_runs_that_cannot_be_drawn_are_one_line_errors_naming_the_file(tmp_path):
    good = _run_dir(tmp_path, "good", [40.0, 45.0])
    empty = _run_dir(tmp_path, "empty", [])
    (tmp_path / "not-a-run").mkdir()
    cases = ((tmp_path / "missing", "missing: no such run directory", ()),
             (tmp_path / "not-a-run", "not-a-run/metrics.jsonl: not a readable", ()),
             (empty, "empty/metrics.jsonl: no epoch with a dev score", ()),
             (good, "--label given 1 times for 2 runs", ("--label", "only-one")))
    for run, message, extra in cases:
        result = _plot(good, run, "--out", tmp_path / "x.png", *extra)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and not (tmp_path / "x.png").exists()
