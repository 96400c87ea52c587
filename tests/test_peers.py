"""The peers a user would pick instead of an edgecap export, run through the same search: PyTorch compiled by
inductor, and OpenVINO on the export's own ONNX graphs. Their captions must be the ones the export gives, and the
bench must set them side by side with their floors."""

import json

import numpy as np
import pytest

from edgecap.runtime.manifest import Manifest
from edgecap.runtime.pipeline import Captioner
from edgecap.runtime.search import SearchOptions
from tests.helpers import invoke

OPTIONS = SearchOptions(beam_size=2, max_length=8)


def test_openvino_captions_what_onnx_runtime_captions(tiny_export):
    pytest.importorskip("openvino", reason="the OpenVINO backend needs openvino (pip install edgecap[openvino])")
    from edgecap.runtime.backends.openvino import OpenvinoBackend

    exp = tiny_export / "exp"
    manifest = Manifest.read(exp)
    size = manifest.preprocessing["image_size"]
    pixels = np.random.default_rng(0).random((4, 3, size, size), dtype=np.float32)
    ort = Captioner.from_dir(exp).search(pixels, OPTIONS)
    openvino = Captioner(OpenvinoBackend(exp, manifest), manifest, exp).search(pixels, OPTIONS)
    assert [h.tokens for h in openvino] == [h.tokens for h in ort]
    np.testing.assert_allclose([h.logprob for h in openvino], [h.logprob for h in ort], atol=1e-4)


def test_an_openvino_device_this_machine_lacks_is_one_line(tiny_export):
    pytest.importorskip("openvino", reason="the OpenVINO backend needs openvino (pip install edgecap[openvino])")
    code, output = invoke("caption", "edgecap/assets/samples/dog.jpg", "--model", str(tiny_export / "exp"),
                          "--backend", "openvino", "--device", "npu")
    assert code == 2 and "OpenVINO has no NPU device here" in output and "Traceback" not in output, output


@pytest.mark.slow
def test_torch_compile_captions_what_eager_captions(tiny_export):
    import torch

    from edgecap.checkpoint import load_model
    from edgecap.runtime.decoding import decode
    from edgecap.torch_backend import TorchBackend, compiled

    loaded = load_model(tiny_export / "run")
    size = loaded.prep.image_size
    pixels = np.random.default_rng(0).random((2, 3, size, size), dtype=np.float32)
    eager = decode(TorchBackend(loaded.model, OPTIONS.k).encode(pixels), 2, OPTIONS, loaded.vocab)
    fast = decode(TorchBackend(compiled(load_model(tiny_export / "run").model), OPTIONS.k).encode(pixels), 2,
                  OPTIONS, loaded.vocab)
    assert [f[0].tokens for f in fast] == [e[0].tokens for e in eager]
    assert torch.allclose(torch.tensor([f[0].logprob for f in fast]), torch.tensor([e[0].logprob for e in eager]),
                          atol=1e-4)


@pytest.mark.slow
def test_bench_sets_the_peers_side_by_side_with_their_floors(tiny_export, tmp_path):
    exp, json_file = tiny_export / "exp", tmp_path / "bench.json"
    code, output = invoke("bench", str(exp), "--backend", "torch,ort,openvino", "--beam", "2", "--runs", "2",
                          "--warmup", "0", "--json", str(json_file))
    assert code == 0, output
    report = json.loads(json_file.read_text())
    backends = [r["backend"] for r in report["results"]]
    has_openvino = "openvino" in backends
    assert backends == ["torch", "ort"] + (["openvino"] if has_openvino else [])
    if not has_openvino:
        assert "openvino: skipped (OpenVINO is not installed" in output
    assert "Peers, side by side" in output and "Floors:" in output
    floors = report["floors"]
    assert floors["gemm_peak_gflops"] > 0 and floors["encoder_gflops_per_image"] > 0
    for row in report["results"]:
        assert row["startup_s"] > 0 and row["encoder_floor_ms"] > 0 and row["step_floor_ms"] > 0
