"""ONNX Runtime sessions run an INT8 graph's fp32 layers in fp32, as the export wrote them."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgecap.runtime.backends.ort import cpu_session  # noqa: E402

INPUT_SCALE, OUTPUT_SCALE = 0.01, 1e-5


def _fp32_conv_between_qdq(path, weight: np.ndarray) -> None:
    """x -> Q/DQ (uint8) -> Conv with float weights (a layer kept fp32) -> Q/DQ (int8) -> y."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "in_scale", "in_zero"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "in_scale", "in_zero"], ["x_dq"]),
             helper.make_node("Conv", ["x_dq", "weight"], ["conv"]),
             helper.make_node("QuantizeLinear", ["conv", "out_scale", "out_zero"], ["y_q"]),
             helper.make_node("DequantizeLinear", ["y_q", "out_scale", "out_zero"], ["y"])]
    constants = [numpy_helper.from_array(np.array(INPUT_SCALE, np.float32), "in_scale"),
                 numpy_helper.from_array(np.array(0, np.uint8), "in_zero"),
                 numpy_helper.from_array(np.array(OUTPUT_SCALE, np.float32), "out_scale"),
                 numpy_helper.from_array(np.array(0, np.int8), "out_zero"),
                 numpy_helper.from_array(weight, "weight")]
    graph = helper.make_graph(nodes, "fp32_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], constants)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def test_a_layer_kept_fp32_is_not_quantised_by_onnx_runtime(tmp_path):
    """Per-tensor INT8 of these weights would round the small output channel to zero (ONNX Runtime >= 1.21 does
    that at load time unless its WeightBiasQuantization pass is off); fp32 weights keep it within one output step."""
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(2, 3, 1, 1)).astype(np.float32)
    weight[1] *= 3e-4  # 127 steps of channel 0's range leave nothing of this channel
    pixels = rng.uniform(0, 2, size=(1, 3, 4, 4)).astype(np.float32)
    _fp32_conv_between_qdq(tmp_path / "graph.onnx", weight)

    y = cpu_session(tmp_path / "graph.onnx").run(None, {"x": pixels})[0]

    dequantised = np.clip(np.round(pixels / INPUT_SCALE), 0, 255) * INPUT_SCALE
    expected = np.einsum("oc,nchw->nohw", weight[:, :, 0, 0], dequantised)[0, 1]
    assert np.abs(y[0, 1] - expected).max() <= OUTPUT_SCALE
