"""benchmarks/compare_evals.py: two eval reports of the same photos, paired; what the interval says, and one-line
errors for reports that cannot be paired."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_evals.py"
PHOTOS = [f"photo{i}" for i in range(400)]


def _report(path: Path, scores: np.ndarray, beam: int = 3, photos: list[str] = PHOTOS,
            captions: list[str] = ("a dog",)) -> Path:
    """An eval report as `edgecap eval --json` writes it: per-photo CIDEr-D on pycocoevalcap's raw scale."""
    report = {"metrics": {"CIDEr": float(scores.mean())}, "beam": beam, "length_penalty": 0.0,
              "block_trigrams": False, "captions": {p: captions[i % len(captions)] for i, p in enumerate(photos)},
              "per_image_cider": dict(zip(photos, map(float, scores), strict=True))}
    path.write_text(json.dumps(report))
    return path


def _compare(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


@pytest.fixture
def scores():
    rng = np.random.default_rng(0)
    base = rng.gamma(2.0, 0.3, len(PHOTOS))  # per-photo CIDEr-D is skewed and spread wide, as on Flickr8k
    return base, rng.normal(0, 0.2, len(PHOTOS))


def test_a_clear_gain_a_clear_loss_and_noise_are_told_apart(tmp_path, scores):
    base, noise = scores
    baseline = _report(tmp_path / "base.json", base)
    better = _report(tmp_path / "better.json", base + 0.08 + noise)
    same = _report(tmp_path / "same.json", base + noise - noise.mean())

    result = _compare(baseline, better, "--json", tmp_path / "out.json")
    assert result.returncode == 0, result.stderr
    assert "candidate ahead" in result.stdout
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["photos"] == len(PHOTOS) and 0 < written["delta_cider_ci95"][0] < 8 < written["delta_cider_ci95"][1]
    assert "candidate behind" in _compare(better, baseline).stdout
    assert "within noise" in _compare(baseline, same).stdout


def test_reports_that_cannot_be_paired_are_one_line_errors_naming_the_file(tmp_path, scores):
    base, _ = scores
    baseline = _report(tmp_path / "base.json", base)
    other_beam = _report(tmp_path / "beam1.json", base, beam=1)
    other_photos = _report(tmp_path / "other.json", base, photos=[f"x{i}" for i in range(len(PHOTOS))])
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"metrics": {}, "captions": {}}))
    for candidate, message in ((other_beam, "other beam"), (other_photos, "not in both"),
                               (old, "holds no per-photo CIDEr-D"), (tmp_path / "missing.json", "not a readable")):
        result = _compare(baseline, candidate)
        assert result.returncode == 2 and message in result.stderr and str(candidate) in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_captions_shape_is_compared_on_the_candidate_s_most_common_ending(tmp_path, scores):
    base, _ = scores
    baseline = _report(tmp_path / "base.json", base, captions=["a dog runs on the grass", "a man walks down the street",
                                                               "two children play in the water", "a dog jumps high"])
    candidate = _report(tmp_path / "cand.json", base, captions=["a dog on the street", "a man on the street"])
    result = _compare(baseline, candidate, "--json", tmp_path / "out.json")
    assert result.returncode == 0, result.stderr
    assert "baseline 5.5 words, 100 of 400 end 'street'; candidate 5.0 words, 400 of 400 end 'street'" in result.stdout
    assert json.loads((tmp_path / "out.json").read_text())["caption_shape"]["ending"] == "street"
