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
    assert report["passed"] is False and report["identical_rate"] < 0.99 and report["failures"]
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
        assert report["n_images"] == 60 - left_out
        assert ("left out:" in output) == bool(left_out)
    code, output = invoke("eval", str(int8_export), "--data", "shapes", "--split", "dev", "--max-images", "60",
                          "--precision", "int8")
    assert code == 0 and f"note: {chosen} of these 60 photos chose which INT8 layers stay fp32" in output, output
