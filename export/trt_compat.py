"""Will TensorRT build this ONNX graph as typed? Checked on the file, with onnx alone (no GPU, no TensorRT).

A strongly typed build takes precision from the graph (docs/design.md), so what TensorRT refuses or silently
mis-builds is visible in the file: an INT8 graph must be explicit, symmetric Q/DQ (zero point 0, int8), with
per-channel weight scales on each layer's output-channel axis, no DequantizeLinear of INT32 (a quantised bias),
opset >= 13; every graph keeps the manifest's fp32 inputs and outputs, so the runtime's buffers fit. ``edgecap
export --trt`` runs this before building, and CI runs it on every exported graph.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from edgecap.errors import BackendUnavailableError, ModelError
from edgecap.runtime.backends.trt_cuda import INSTALL_HINT
from edgecap.runtime.engines import GRAPHS
from edgecap.runtime.manifest import Manifest

MIN_OPSET = 13  # per-axis QuantizeLinear / DequantizeLinear
HALF_TYPES = {10: "float16", 16: "bfloat16"}  # onnx.TensorProto.FLOAT16, BFLOAT16
INT8, INT32 = 3, 6  # onnx.TensorProto element types
QDQ = ("QuantizeLinear", "DequantizeLinear")
SHOWN = 4  # problems spelled out in the one-line error; the rest are counted


def _constants(graph) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attribute.t)
    return values


def _attribute(node, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _output_channel_axis(layer, weight_rank: int) -> int:
    """The weight axis that indexes a layer's output channels: where per-channel scales belong."""
    if layer.op_type == "Conv":
        return 0  # (C_out, C_in / groups, k...)
    if layer.op_type == "ConvTranspose":
        return 1  # (C_in, C_out / groups, k...)
    if layer.op_type == "Gemm":
        return 0 if _attribute(layer, "transB", 0) else 1
    return weight_rank - 1  # MatMul: (..., K, N)


def io_problems(model, name: str) -> list[str]:
    """Graph inputs and outputs in half precision: the runtime feeds and reads fp32 (keep_io_types)."""
    return [f"{name}: {kind} {v.name} is {HALF_TYPES[v.type.tensor_type.elem_type]}, TensorRT would build "
            f"{HALF_TYPES[v.type.tensor_type.elem_type]} I/O; re-export it with fp32 inputs and outputs"
            for kind, values in (("input", model.graph.input), ("output", model.graph.output)) for v in values
            if v.type.tensor_type.elem_type in HALF_TYPES]


def opset_problems(model, name: str) -> list[str]:
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return [] if opset >= MIN_OPSET else [f"{name}: opset {opset}, TensorRT's Q/DQ needs >= {MIN_OPSET}; "
                                          "re-run `edgecap export`"]


def qdq_problems(model, name: str) -> list[str]:
    """Why an INT8 graph is not the explicit, symmetric, per-channel Q/DQ that TensorRT builds."""
    graph = model.graph
    values = _constants(graph)
    fix = "re-export with --int8-scheme tensorrt"
    nodes = [n for n in graph.node if n.op_type in QDQ]
    if not any(n.op_type == "QuantizeLinear" for n in nodes) or not any(n.op_type == "DequantizeLinear"
                                                                        for n in nodes):
        return [f"{name}: no QuantizeLinear/DequantizeLinear pairs, so not an explicitly quantised INT8 graph; "
                "re-run `edgecap export --precision int8`"]
    out = []
    for node in nodes:
        label = f"{name}: {node.op_type} {node.name or node.output[0]!r}"
        scale = values.get(node.input[1])
        if scale is None:
            out.append(f"{label} has a computed scale; TensorRT needs a constant one; {fix}")
        elif not (np.isfinite(scale).all() and (scale > 0).all()):
            out.append(f"{label} has a zero, negative or non-finite scale; re-run the INT8 calibration")
        if len(node.input) > 2 and node.input[2]:
            zero = values.get(node.input[2])
            if zero is None:
                out.append(f"{label} has a computed zero point; TensorRT needs a constant 0; {fix}")
            elif zero.dtype != np.int8 or zero.any():
                out.append(f"{label} has zero point {zero.ravel()[:3].tolist()} ({zero.dtype}); TensorRT needs "
                           f"int8 zero points of 0 (symmetric); {fix}")
        elif node.op_type == "QuantizeLinear" and _attribute(node, "output_dtype", 0) not in (0, INT8):
            out.append(f"{label} quantises to a type other than int8; {fix}")
        elif node.op_type == "QuantizeLinear" and _attribute(node, "output_dtype", 0) == 0:
            out.append(f"{label} has no zero point, so it quantises to uint8; TensorRT needs int8; {fix}")
        if node.op_type == "DequantizeLinear" and node.input[0] in values and values[node.input[0]].dtype == np.int32:
            out.append(f"{label} dequantises INT32 (a quantised bias), which TensorRT refuses; {fix}")
    out += _weight_problems(graph, values, name, fix)
    return out


def _weight_problems(graph, values: dict[str, np.ndarray], name: str, fix: str) -> list[str]:
    """Every weight of a quantised layer: one scale per output channel, along the output-channel axis."""
    dequantized = {n.output[0]: n for n in graph.node
                   if n.op_type == "DequantizeLinear" and n.input[0] in values and values[n.input[0]].ndim >= 2}
    layers = [n for n in graph.node if n.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul")
              and len(n.input) > 1 and n.input[1] in dequantized]
    if not layers:
        return [f"{name}: no Conv/Gemm/MatMul reads quantised weights, so INT8 buys nothing; "
                "re-run `edgecap export --precision int8`"]
    out = []
    for layer in layers:
        dq = dequantized[layer.input[1]]
        weight, scale = values[dq.input[0]], values.get(dq.input[1])
        if scale is None:
            continue  # reported with the node
        axis = _attribute(dq, "axis", 1) % weight.ndim
        wanted = _output_channel_axis(layer, weight.ndim)
        label = f"{name}: {layer.op_type} {layer.name!r}"
        if scale.ndim != 1 or len(scale) != weight.shape[wanted]:
            out.append(f"{label} has weight scales of shape {scale.shape}, not one per output channel "
                       f"({weight.shape[wanted]}); {fix}")
        elif axis != wanted:
            out.append(f"{label} has per-channel weight scales on axis {axis}, not its output-channel axis "
                       f"{wanted}; {fix}")
    return out


def graph_problems(path: Path, precision: str) -> list[str]:
    """Everything in one graph file that stops TensorRT from building it as ``precision``; [] when none."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    problems = io_problems(model, path.name) + opset_problems(model, path.name)
    if precision == "fp16" and not any(t.data_type in HALF_TYPES for t in model.graph.initializer):
        problems.append(f"{path.name}: no float16 weights, so not a mixed-precision graph; "
                        "re-run `edgecap export --precision fp16`")
    if precision == "int8":
        problems += qdq_problems(model, path.name)
    return problems


def check_for_tensorrt(directory: Path, manifest: Manifest, precisions: Iterable[str]) -> None:
    """Raise one ModelError line listing what TensorRT would refuse in the graphs of ``precisions`` (a
    BackendUnavailableError where onnx, which reads them, is not installed)."""
    try:
        import onnx  # noqa: F401  (the check reads the graph files with it)
    except ModuleNotFoundError:  # the trt extra brings it; naming the export extra would send the user there first
        raise BackendUnavailableError(f"checking graphs for TensorRT needs onnx; {INSTALL_HINT}") from None
    problems = [p for precision in precisions
                for graph, path in zip(GRAPHS, manifest.graph_files(directory, precision), strict=True)
                for p in graph_problems(path, manifest.stored_precision(precision, graph))]
    if problems:
        more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        raise ModelError(f"{directory}: not buildable by TensorRT as typed: {'; '.join(problems[:SHOWN])}{more}")
