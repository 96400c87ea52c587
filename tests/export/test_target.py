"""``edgecap export --target``: a device's precisions chosen for it, recorded in the manifest with every trial, and
used by the commands that caption the export when no precision is given."""

import pytest

from edgecap.model_source import ModelSource
from edgecap.runtime.manifest import Manifest
from tests.helpers import invoke
from tests.needs import needs_scoring

SMALL_CALIBRATION = ("--calib-data", "shapes", "--calib-images", "48", "--calib-heldout", "24")


@needs_scoring
@pytest.mark.slow
def test_target_cpu_keeps_the_fastest_candidate_that_passes_parity(tiny_export, tmp_path):
    out = tmp_path / "cpu"
    code, output = invoke("export", str(tiny_export / "run"), "--out", str(out), "--target", "cpu",
                          *SMALL_CALIBRATION, "--target-photos", "40")
    assert code == 0, output
    assert "timing every candidate side by side" in output
    manifest = Manifest.read(out)
    target = manifest.target
    trials = {t["candidate"]: t for t in target["trials"]}
    assert list(trials) == ["int8 encoder and step, bias-corrected", "int8 step beside the fp32 encoder", "fp32"]
    assert trials["fp32"]["parity"] == "validated at export"
    assert all(t["photos"] > 0 and t["delta_cider_ci95"] for t in target["trials"] if t["precision"] == "int8")
    passing = [t for t in target["trials"] if t["parity"] in ("pass", "validated at export")]
    best = min(passing, key=lambda t: t["caption_ms_p50"])
    assert target["precision"] == best["precision"] and best["candidate"] in target["reason"]
    if best["precision"] == "int8":
        assert manifest.quantization.bias_correction == best["bias_correction"]
        assert manifest.quantization.scheme == "ort-cpu"
    assert not list(tmp_path.glob("*trial*"))  # the losing candidates are gone
    assert ModelSource.choose(out, None, None).precision == target["precision"]  # caption's default


@pytest.mark.slow
def test_target_gpu_chooses_by_rule_and_says_it_was_not_measured(tiny_export, tmp_path):
    out = tmp_path / "gpu"
    code, output = invoke("export", str(tiny_export / "run"), "--out", str(out), "--target", "gpu")
    assert code == 0, output
    manifest = Manifest.read(out)
    assert set(manifest.graphs) == {"fp32", "fp16"} and manifest.target["precision"] == "fp16"
    assert "no GPU measured it here" in manifest.target["reason"] and manifest.target["trials"] == []


@pytest.mark.parametrize(("args", "named"), [
    (["--target", "cpu", "--precision", "fp32,int8", *SMALL_CALIBRATION], "drop --precision"),
    (["--target", "cpu", "--int8-graphs", "step", "--calib-bias-correction", *SMALL_CALIBRATION],
     "drop --int8-graphs, --calib-bias-correction"),
    (["--target", "cpu"], "--target cpu builds and gates INT8 candidates: pass --calib-data"),
    (["--target", "tpu"], "--target tpu: expected one of cpu, gpu, jetson"),
])
def test_a_target_with_its_own_choices_is_refused_in_one_line(tmp_path, args, named):
    code, output = invoke("export", "--out", str(tmp_path / "x"), *args)  # refused before any model is read
    assert code == 2 and named in output and len(output.strip().splitlines()) == 1, output
