"""export/compact.py: fp16-exact fp32 weights stored as fp16 behind a Cast, and nothing else touched."""
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
