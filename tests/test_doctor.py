"""``edgecap doctor``: the machine's fingerprint, and for an export what runs here and whether its files are intact."""

import json
import shutil

import pytest

from tests.helpers import invoke, run_cli_without


def test_the_machine_alone_is_described_with_the_instruction_sets_int8_needs():
    code, output = invoke("doctor", "--json")
    assert code == 0, output
    report = json.loads(output)
    assert report["machine"]["cpu"] and isinstance(report["machine"]["cpu_features"], list)
    assert report["export"] is None and report["healthy"] is True and report["tensorrt"]


@pytest.mark.slow
def test_an_export_lists_every_backend_and_precision_with_its_reason(tiny_export):
    code, output = invoke("doctor", str(tiny_export / "exp"), "--json")
    assert code == 0, output
    report = json.loads(output)
    rows = {row["subject"]: row for row in report["runnable"]}
    assert rows["ort fp32 (cpu)"]["ok"] and rows["ort fp16 (cpu)"]["ok"] and rows["torch fp32"]["ok"]
    assert {"trt fp32", "trt fp16"} <= rows.keys()
    assert rows.keys() & {"openvino", "openvino fp32 (CPU)"}  # a row per precision, or one saying it is not installed
    if not rows["trt fp32"]["ok"]:
        assert "TensorRT" in rows["trt fp32"]["detail"]  # the one-line reason, as the trt backend gives it
    assert {f["subject"] for f in report["files"]} == {"encoder.onnx", "step.onnx", "encoder.fp16.onnx",
                                                      "step.fp16.onnx"}
    assert all(f["ok"] for f in report["files"])


@pytest.mark.slow
def test_a_changed_graph_makes_the_export_unhealthy(tiny_export, tmp_path):
    directory = shutil.copytree(tiny_export / "exp", tmp_path / "exp")
    shutil.copy(directory / "step.fp16.onnx", directory / "step.onnx")
    code, output = invoke("doctor", str(directory))
    assert code == 1 and "no  step.onnx: changed since export (sha256 differs)" in output, output
    assert "no  ort fp32 (cpu): " in output and "NOT healthy" in output


@pytest.mark.slow
def test_doctor_runs_without_torch_and_says_what_that_costs(tiny_export):
    output = run_cli_without("torch", ["doctor", str(tiny_export / "exp")])
    assert "no  torch fp32: torch is not installed" in output and "ok  ort fp32 (cpu)" in output
    assert output.strip().splitlines()[-1] in ("healthy", "exit 0")


@pytest.mark.slow
def test_an_export_without_its_calibration_feeds_is_healthy(int8_export, tmp_path):
    """The shipped export leaves its calibration feeds out: they only serve re-quantising, not captioning."""
    shipped = tmp_path / "shipped"
    shutil.copytree(int8_export, shipped, ignore=shutil.ignore_patterns("calib"))
    code, output = invoke("doctor", str(shipped))
    assert code == 0 and output.strip().splitlines()[-1] == "healthy", output
    assert "not here: only re-quantising reads it" in output
