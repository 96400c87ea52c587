"""export/compact.py: fp16-exact fp32 weights stored as fp16 behind a Cast (a folded convolution's with its channel
factors), and nothing else touched."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="compact storage rewrites ONNX graphs (the export extra)")
ort = pytest.importorskip("onnxruntime", reason="the rewritten graph is run by ONNX Runtime (the runtime extra)")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgecap.export.compact import MIN_ELEMENTS, store_exact_fp16  # noqa: E402

ROWS, WIDTH = 64, 128  # 8,192 values per weight: above MIN_ELEMENTS


def _graph(path):
    """y = DQ(q) @ (x @ exact) + (x @ inexact) + bias: one weight of each kind compact storage must tell apart."""
    rng = np.random.default_rng(0)
    exact = rng.standard_normal((ROWS, WIDTH)).astype(np.float16).astype(np.float32)
    inexact = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    bias = rng.standard_normal(WIDTH).astype(np.float16).astype(np.float32)  # small: stays as it is
    quantized = rng.integers(-127, 127, (WIDTH, MIN_ELEMENTS)).astype(np.int8)
    scale = np.full(MIN_ELEMENTS, 2.0 ** -7, np.float32)  # fp16-exact and large, yet a Q/DQ parameter: stays
    nodes = [helper.make_node("MatMul", ["x", "exact"], ["a"]), helper.make_node("MatMul", ["x", "inexact"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Add", ["c", "bias"], ["d"]),
             helper.make_node("DequantizeLinear", ["quantized", "scale"], ["w"], axis=1),
             helper.make_node("MatMul", ["d", "w"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", ROWS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", MIN_ELEMENTS])],
        [numpy_helper.from_array(v, n) for n, v in (("exact", exact), ("inexact", inexact), ("bias", bias),
                                                      ("quantized", quantized), ("scale", scale))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))


def _run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_only_the_fp16_exact_weight_is_stored_as_fp16_and_the_outputs_stay_bit_identical(tmp_path):
    path = tmp_path / "g.onnx"
    _graph(path)
    x = np.random.default_rng(1).standard_normal((5, ROWS)).astype(np.float32)
    before, size = _run(path, x), path.stat().st_size

    saved = store_exact_fp16(path)

    assert saved == ROWS * WIDTH * 2 and size - path.stat().st_size > 0.99 * saved  # less the Cast node's bytes
    model = onnx.load(str(path))
    stored = {t.name: t.data_type for t in model.graph.initializer}
    assert stored == {"exact.fp16": TensorProto.FLOAT16, "inexact": TensorProto.FLOAT, "bias": TensorProto.FLOAT,
                      "quantized": TensorProto.INT8, "scale": TensorProto.FLOAT}
    assert [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node][0] == \
        ("Cast", ["exact.fp16"], ["exact"])
    assert np.array_equal(_run(path, x), before)
    assert store_exact_fp16(path) == 0  # a compact graph has nothing left to store


def test_a_weight_below_the_size_floor_stays_fp32(tmp_path):
    path = tmp_path / "small.onnx"
    weight = np.ones((2, MIN_ELEMENTS // 2 - 1), np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", weight.shape[1]])],
                              [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    assert store_exact_fp16(path) == 0
    assert onnx.load(str(path)).graph.initializer[0].data_type == TensorProto.FLOAT


def _folded_conv(path, channels=16, width=32):
    """y = Conv(x, folded): an fp16 weight times one fp32 factor per output channel, one channel pruned to zero, as
    an exporter leaves a convolution it folded a batch norm into."""
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((channels, width, 3, 3)).astype(np.float16).astype(np.float32)
    weight[3] = 0.0
    gamma, variance = rng.uniform(0.5, 2, channels), rng.uniform(0.01, 1, channels)
    factors = (gamma.astype(np.float32) / np.sqrt(variance.astype(np.float32) + np.float32(1e-3)))
    folded = weight * factors[:, None, None, None]
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, 8, 8])],
                              [numpy_helper.from_array(folded, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return weight


def test_a_folded_convolution_is_stored_as_its_fp16_weight_and_channel_factors_bit_identically(tmp_path):
    path = tmp_path / "conv.onnx"
    weight = _folded_conv(path)
    x = np.random.default_rng(3).standard_normal((2, 32, 8, 8)).astype(np.float32)
    before = _run(path, x)
    assert store_exact_fp16(path) == 0  # without the model's weights, nothing here is fp16-exact

    saved = store_exact_fp16(path, {"w": weight})

    assert saved == weight.size * 2 - 16 * 4
    stored = {t.name: t.data_type for t in onnx.load(str(path)).graph.initializer}
    assert stored == {"w.fp16": TensorProto.FLOAT16, "w.factors": TensorProto.FLOAT}
    assert _run(path, x).tobytes() == before.tobytes()


def test_a_weight_that_is_no_rescaled_copy_of_the_models_stays_fp32(tmp_path):
    path = tmp_path / "conv.onnx"
    weight = _folded_conv(path)
    other = weight.copy()
    other[0, 0, 0, 0] = np.float16(other[0, 0, 0, 0] + 0.5)  # one value off: no factor reproduces that channel
    assert store_exact_fp16(path, {"w": other}) == 0
    assert store_exact_fp16(path, {"w": weight.transpose(1, 0, 2, 3).copy()}) == 0  # another layout
