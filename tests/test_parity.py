"""`edgecap parity` on a tiny export: the fp32 graphs pass the gate, a graph with one corrupted weight fails it."""

import json
import shutil

import numpy as np
import pytest

from edgecap.data import load_dataset
from edgecap.runtime.manifest import Manifest
from tests.helpers import invoke
from tests.needs import needs_scoring
from tests.without_torch import run_without


def parity(export_dir, *args):
    return invoke("parity", str(export_dir), "--data", "shapes", "--split", "test", "--max-images", "24", *args)


def _gate(delta, ci, identical=1.0, n=200, precision="int8"):
    from edgecap.verdict import THRESHOLDS, gate

    return gate(delta, ci, identical, n, THRESHOLDS[precision])


@pytest.mark.parametrize(("delta", "ci", "precision", "outcome"), [
    (+1.67, (-6.38, +11.45), "int8", "inconclusive"),  # better captions on 24 photos: never a failure
    (-0.71, (-2.12, +0.00), "fp16", "inconclusive"),  # 50 photos cannot tell
    (-0.25, (-0.64, +0.09), "fp16", "inconclusive"),
    (-0.25, (-0.45, -0.05), "fp16", "pass"),
    (+0.22, (-0.54, +0.99), "int8", "pass"),
    (-1.65, (-3.35, -0.10), "int8", "inconclusive"),
    (-2.10, (-3.30, -1.20), "int8", "fail"),
    (+4.00, (+2.00, +6.00), "int8", "pass"),  # an improvement beyond the margin passes
])
def test_the_gate_is_a_non_inferiority_rule_on_the_interval(delta, ci, precision, outcome):
    assert _gate(delta, ci, precision=precision).outcome == outcome


def test_an_inconclusive_verdict_says_how_many_photos_would_decide_it():
    verdict = _gate(-0.71, (-2.12, 0.00), n=50, precision="fp16")
    # below the margin: the upper half-width (0.71) must shrink under the distance to -0.5 (0.21)
    assert abs(verdict.photos_to_decide - 50 * (0.71 / 0.21) ** 2) <= 1 and "50 photos are too few" in \
        verdict.reasons[0]
    assert _gate(-0.5, (-0.9, -0.1), n=50, precision="fp16").photos_to_decide > 50


def test_too_few_identical_captions_fail_whatever_the_interval():
    verdict = _gate(0.0, (0.0, 0.0), identical=0.9, precision="fp16")
    assert verdict.outcome == "fail" and "identical captions 90.0% < 95%" in verdict.reasons[0]


@needs_scoring
def test_the_gate_decides_as_photos_accumulate_on_constructed_scores():
    from edgecap.verdict import paired_bootstrap_ci

    rng = np.random.default_rng(0)
    outcomes = {}
    for n in (30, 3000):
        reference = rng.uniform(0, 2, n)
        for name, shift in (("equal", 0.0), ("worse", -0.04)):  # CIDEr's raw scale: -0.04 is -4 points
            candidate = reference + shift + rng.normal(0, 0.3, n)
            low, high = paired_bootstrap_ci(reference, candidate)
            delta = 100 * float(np.mean(candidate - reference))
            outcomes[name, n] = _gate(delta, (100 * low, 100 * high), n=n).outcome
    assert outcomes["equal", 30] == outcomes["worse", 30] == "inconclusive"
    assert (outcomes["equal", 3000], outcomes["worse", 3000]) == ("pass", "fail")


def test_the_teacher_forced_check_imports_without_the_scoring_package():
    """The TensorRT backend's host logic is checked with it on machines that may lack pycocoevalcap."""
    run_without("pycocoevalcap", "from edgecap.parity import teacher_forced")


@needs_scoring
@pytest.mark.slow
def test_fp32_export_passes_parity_with_the_design_fields(tiny_export, tmp_path):
    code, output = parity(tiny_export / "exp", "--json", str(tmp_path / "p.json"), "--markdown", str(tmp_path / "p.md"))
    assert code == 0, output
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["passed"] is True and report["n_images"] == 24
    assert report["graphs"] == {"encoder": "encoder.onnx", "step": "step.onnx"}
    assert report["identical_rate"] >= 0.99 and abs(report["delta_cider"]) <= 0.1
    low, high = report["delta_cider_ci95"]
    assert low <= report["delta_cider"] <= high
    assert {"Bleu_4", "METEOR", "ROUGE_L", "CIDEr"} <= set(report["reference"]) & set(report["candidate"])
    steps = report["teacher_forced_steps"]
    assert steps[0]["rows"] == 24 and all(s["max_abs_delta_logprob"] < 1e-3 for s in steps)
    assert (tiny_export / "exp" / "reports" / "parity-ort-fp32.json").is_file()
    assert "PASS" in (tmp_path / "p.md").read_text() and "step `step.onnx`" in (tmp_path / "p.md").read_text()
    # PyTorch's scores stay with the export, for a device's own `edgecap eval` to compare against
    assert Manifest.read(tiny_export / "exp").reference_scores["shapes test, 24 photos, beam 3"] == report["reference"]


@needs_scoring
@pytest.mark.slow
def test_both_sides_decode_with_the_requested_ranking_and_blocking(tiny_export, tmp_path):
    code, output = parity(tiny_export / "exp", "--length-penalty", "1", "--block-trigrams",
                          "--json", str(tmp_path / "p.json"))
    assert code == 0, output
    report = json.loads((tmp_path / "p.json").read_text())
    assert (report["length_penalty"], report["block_trigrams"]) == (1.0, True) and report["identical_rate"] >= 0.99
    assert "beam 3, length penalty 1, trigram blocking" in output


@needs_scoring
@pytest.mark.slow
def test_greedy_export_captions_like_greedy_pytorch(tiny_export, tmp_path):
    code, output = parity(tiny_export / "exp", "--beam", "1", "--json", str(tmp_path / "p.json"))
    assert code == 0, output
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["beam"] == 1 and report["identical_rate"] >= 0.99


@needs_scoring
@pytest.mark.slow
def test_one_corrupted_weight_fails_the_gate(tiny_export, tmp_path):
    import onnx
    from onnx import numpy_helper

    broken = tmp_path / "exp"
    shutil.copytree(tiny_export / "exp", broken)
    manifest = Manifest.read(broken)
    vocab_size = len(manifest.vocab["words"])
    step = onnx.load(str(broken / "step.onnx"))
    # The output layer's bias: one number, the preference for one word, pushed up by 8 nats.
    bias = next(t for t in step.graph.initializer if list(t.dims) == [vocab_size])
    values = numpy_helper.to_array(bias).copy()
    values[int(np.argsort(values)[len(values) // 2])] += 8.0
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    onnx.save(step, str(broken / "step.onnx"))
    Manifest.read(broken).write(broken)  # a damaged graph the manifest vouches for: only parity can catch it
    code, output = parity(broken, "--json", str(tmp_path / "p.json"))
    assert code == 1, output
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["passed"] is False and report["verdict"] == "fail" and report["identical_rate"] < 0.99
    assert report["reasons"] and "non-inferiority" in report["rule"]
    assert max(s["max_abs_delta_logprob"] for s in report["teacher_forced_steps"]) > 1.0


@needs_scoring
@pytest.mark.slow
def test_parity_refuses_a_reference_that_is_not_the_exported_checkpoint(tiny_export, tmp_path):
    other = tmp_path / "other.pt"
    other.write_bytes((tiny_export / "run" / "best.pt").read_bytes() + b"\0")
    code, output = parity(tiny_export / "exp", "--reference", str(other))
    assert code == 2 and "sha256 differs" in output and "\n" not in output.strip()


@needs_scoring
@pytest.mark.slow
def test_int8_gate_leaves_out_the_photos_calibration_chose_layers_on_and_eval_says_so(int8_export, tmp_path):
    heldout = set(Manifest.read(int8_export).quantization.heldout_image_ids)
    dev = load_dataset("shapes").split("dev")[:60]
    chosen = sum(r.image_id in heldout for r in dev)
    assert 0 < chosen < 60
    for precision, left_out in (("int8", chosen), ("fp32", 0)):
        code, output = invoke("parity", str(int8_export), "--data", "shapes", "--split", "dev", "--max-images", "60",
                              "--precision", precision, "--json", str(tmp_path / f"{precision}.json"))
        report = json.loads((tmp_path / f"{precision}.json").read_text())
        assert report["calibration_photos_left_out"] == left_out, output
        counts = Manifest.read(int8_export).quantization
        assert report["int8_layers"] == ({g: {"int8": counts.graph(g).int8_layers, "fp32": 0,
                                              "qdq_nodes": counts.graph(g).qdq_nodes} for g in ("encoder", "step")}
                                         if precision == "int8" else {})
        assert report["n_images"] == 60 - left_out
        assert ("left out:" in output) == bool(left_out)
    code, output = invoke("eval", str(int8_export), "--data", "shapes", "--split", "dev", "--max-images", "60",
                          "--precision", "int8")
    assert code == 0 and f"note: {chosen} of these 60 photos chose which INT8 layers stay fp32" in output, output
