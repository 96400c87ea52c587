"""Floating-point work of one run of an ONNX graph: with the measured GEMM peak, the floor of a compute-bound encoder.

Only the layers that dominate a convolutional encoder and a decoder step are counted (Conv, MatMul and Gemm, as
2 x multiply-adds); elementwise work, pooling and activations are left out, so the floor derived from this count is
a lower bound, never an overestimate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap import spec


def graph_flops(path: Path, *, rows: int = 1) -> int | None:
    """2 x multiply-adds of the Conv, MatMul and Gemm nodes of an ONNX graph run on ``rows`` rows (the dynamic axis N).

    Shapes come from ONNX shape inference with N fixed; None when ``onnx`` (the export extra) is not installed or a
    counted node's shape cannot be inferred.
    """
    try:
        import onnx
    except ImportError:
        return None
    model = onnx.load(str(path), load_external_data=False)
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == spec.BATCH_AXIS:
                dim.dim_value = rows
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    shapes = {v.name: tuple(d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim)
              for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    shapes.update({t.name: tuple(t.dims) for t in inferred.graph.initializer})
    macs = 0
    for node in inferred.graph.node:
        if node.op_type not in ("Conv", "MatMul", "Gemm"):
            continue
        a, b, out = shapes.get(node.input[0]), shapes.get(node.input[1]), shapes.get(node.output[0])
        if a is None or b is None or out is None or -1 in (*a, *b, *out):
            return None
        if node.op_type == "Conv":  # out (N, Cout, H, W) from weight (Cout, Cin / groups, kh, kw)
            macs += int(np.prod(out, dtype=np.int64)) * int(np.prod(b[1:], dtype=np.int64))
        elif node.op_type == "MatMul":  # out (..., M, N) with inner dimension K = a[-1]
            macs += int(np.prod(out, dtype=np.int64)) * a[-1]
        else:
            trans_a = any(x.name == "transA" and x.i for x in node.attribute)
            macs += int(np.prod(out, dtype=np.int64)) * (a[0] if trans_a else a[-1])
    return 2 * macs
