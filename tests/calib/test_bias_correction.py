"""Bias correction takes the mean INT8 error out of a layer's output channels, and the export records it."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

CHANNELS_IN, CHANNELS_OUT = 16, 4


def _biased_rounding_graph(path):
    """x -> 1x1 Conv -> Relu -> 1x1 Conv -> y. Each output channel of the first conv has one weight of 1.0 and
    fifteen of 0.0104, which per-channel INT8 (step 1/127) rounds down by a quarter step each: with positive
    inputs every channel's mean drops, the error bias correction exists for."""
    first = np.full((CHANNELS_OUT, CHANNELS_IN, 1, 1), 0.0104, np.float32)
    first[:, 0] = 1.0
    second = np.eye(CHANNELS_OUT, dtype=np.float32)[:, :, None, None]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="first"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="second")]
    zeros = np.zeros(CHANNELS_OUT, np.float32)
    constants = [numpy_helper.from_array(first, "w1"), numpy_helper.from_array(zeros, "b1"),
                 numpy_helper.from_array(second, "w2"), numpy_helper.from_array(zeros, "b2")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", CHANNELS_IN, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", CHANNELS_OUT, 6, 6])
    graph = helper.make_graph(nodes, "biased", [x], [y], constants)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _mean_channel_error(fp32_path, int8_path, feeds) -> float:
    from edgecap.runtime.backends.ort import cpu_session

    diffs = [cpu_session(int8_path).run(None, f)[0] - cpu_session(fp32_path).run(None, f)[0] for f in feeds]
    return float(np.abs(np.concatenate(diffs).mean(axis=(0, 2, 3))).mean())


def test_correction_removes_the_mean_error_of_int8_rounding(tmp_path):
    from edgecap.calib.bias_correction import biased_layers, correct_biases
    from edgecap.calib.quantize import QdqGraph
    from edgecap.calib.ranges import compute_ranges

    source = _biased_rounding_graph(tmp_path / "fp32.onnx")
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.uniform(0.5, 1.5, (8, CHANNELS_IN, 6, 6)).astype(np.float32)} for _ in range(4)]
    assert biased_layers(onnx.load(str(source))) == [("first", "b1"), ("second", "b2")]
    graph = QdqGraph("toy", source, tmp_path / "int8.onnx", compute_ranges(source, feeds, method="max"))

    before = _mean_channel_error(source, graph.write(), feeds)
    corrected = correct_biases(graph, feeds, tmp_path / "corrected.onnx", progress=False)
    after = _mean_channel_error(source, corrected.write(), feeds)

    assert corrected.source == tmp_path / "corrected.onnx" and graph.source == source  # the fp32 graph is untouched
    assert before > 0.02  # about 15 x a quarter of 1/127 per unit of input
    assert after < 0.25 * before


@pytest.mark.slow
def test_export_with_bias_correction_records_it_and_drifts_less(tiny_export, int8_export, tmp_path):
    """The same calibration draw as ``int8_export`` (every layer INT8), corrected: the encoder's outputs keep closer
    to fp32 on average per channel, and the manifest and summary say the graphs were corrected."""
    from edgecap.calib.feeds import load_encoder_feeds
    from edgecap.runtime.manifest import Manifest
    from tests.helpers import invoke

    out = tmp_path / "exp"
    code, output = invoke("export", str(tiny_export / "run"), "--out", str(out), "--precision", "fp32,int8",
                          "--calib-data", "shapes", "--calib-images", "48", "--calib-heldout", "24",
                          "--calib-max-delta", "100", "--calib-bias-correction")
    assert code == 0, output
    assert "int8 (tensorrt, max, bias-corrected): ΔCIDEr" in output
    q = Manifest.read(out).quantization
    assert q.bias_correction is True and q.delta_cider_before_bias_correction is not None
    assert Manifest.read(int8_export).quantization.bias_correction is False

    feeds = load_encoder_feeds(out / "calib" / "encoder.npz")
    plain = _encoder_drift(int8_export, feeds)
    assert _encoder_drift(out, feeds) < plain


def _encoder_drift(directory, feeds) -> float:
    """Mean over the encoder's float outputs of |mean per last-axis channel of (INT8 - fp32)|."""
    from edgecap.runtime.backends.ort import cpu_session

    fp32, int8 = cpu_session(directory / "encoder.onnx"), cpu_session(directory / "encoder.int8.onnx")
    drifts = []
    for index in range(len(fp32.get_outputs())):
        diff = np.concatenate([int8.run(None, f)[index] - fp32.run(None, f)[index] for f in feeds])
        drifts.append(np.abs(diff.reshape(-1, diff.shape[-1]).mean(axis=0)).mean())
    return float(np.mean(drifts))
