"""Explicit Q/DQ INT8 graphs from an fp32 graph and its calibrated ranges, by ``onnxruntime.quantization``.

The ``tensorrt`` scheme writes what TensorRT's strongly typed builds accept: QuantizeLinear /
DequantizeLinear pairs in QInt8 with zero point 0 (symmetric activations and weights), per-channel weight scales,
and biases left in float, because TensorRT refuses a DequantizeLinear on INT32 and folds the bias into the layer
itself. onnxruntime's CPU provider still fuses such a graph into QLinearConv / QLinearMatMul, with the
limits measured in :mod:`edgecap.calib.build`.

The ``ort-cpu`` scheme writes asymmetric QUInt8 activations instead: ReLU6/Clip folds into the quantized range
and x86 kernels run uint8 activations natively, which is what makes INT8 pay on ONNX Runtime CPU. TensorRT
rejects it (non-zero zero points), so it is for CPU deployment only.

Ranges are computed once (:mod:`edgecap.calib.ranges`) and reused by every call, so the sensitivity search can
quantise with many exclusion sets cheaply.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SCHEMES = ("tensorrt", "ort-cpu")
LAYER_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")  # ops with weights: the "layers" sensitivity ranks


def quantizable_layers(model: Path, op_types: Sequence[str] | None = None) -> list[str]:
    """Names of the weighted nodes (constant second input) that quantising with ``op_types`` touches, in order."""
    import onnx

    return _layers(onnx.load(str(model), load_external_data=False).graph, op_types)


def _layers(graph, op_types: Sequence[str] | None) -> list[str]:
    constants = _constants(graph)
    wanted = set(LAYER_OPS) & set(op_types) if op_types else set(LAYER_OPS)
    return [n.name for n in graph.node if n.op_type in wanted and len(n.input) > 1 and n.input[1] in constants]


def _constants(graph) -> set[str]:
    return {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}


def activation_matmuls(model: Path) -> list[str]:
    """MatMul nodes with no constant input: attention's q·Kᵀ and α·V, and products with a tied, transposed table.

    Post-training INT8 of these puts attention logits and weights through one per-tensor scale, which can rank
    keys wrongly wherever logits span a wide range, and the layer search cannot repair it because it ranks
    weighted layers only. So they stay fp32 (TensorRT runs them in fp16/fp32): a safe default whose cost in
    accuracy and speed is recorded in docs/experiments.md.
    """
    import onnx

    return _activation_matmuls(onnx.load(str(model), load_external_data=False).graph)


def _activation_matmuls(graph) -> list[str]:
    constants = _constants(graph)
    return [n.name for n in graph.node if n.op_type == "MatMul" and not any(i in constants for i in n.input)]


def discrete_choice_layers(model: Path, op_types: Sequence[str] | None = None) -> list[str]:
    """Weighted nodes whose outputs reach the graph's outputs only through integer tensors (TopK/ArgMax indices).

    Such a layer only ranks candidates for a discrete choice, GLIED's MIL head choosing the attribute words for
    one: INT8 noise flips near-ties in that ranking and the wrong word changes every later step, while
    quantising the layer saves little (one small MLP per image). So these stay fp32 before any search.
    """
    import onnx

    return _discrete_choice_layers(onnx.shape_inference.infer_shapes(onnx.load(str(model), load_external_data=False))
                                   .graph, op_types)


def _discrete_choice_layers(graph, op_types: Sequence[str] | None) -> list[str]:
    import onnx

    integer = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.INT8, onnx.TensorProto.UINT8,
               onnx.TensorProto.BOOL}
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.output, *graph.input]}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    float_outputs = {o.name for o in graph.output if o.type.tensor_type.elem_type not in integer}

    def reaches_float_output(node) -> bool:
        todo, seen = list(node.output), set()
        while todo:
            tensor = todo.pop()
            if tensor in seen or types.get(tensor) in integer:  # unknown types count as float: keep quantising
                continue
            if tensor in float_outputs:
                return True
            seen.add(tensor)
            todo += [out for consumer in consumers.get(tensor, []) for out in consumer.output]
        return False

    candidates = set(_layers(graph, op_types))
    return [n.name for n in graph.node if n.name in candidates and not reaches_float_output(n)]


def always_fp32_rules(model: Path, op_types: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Both rules' nodes, named as the manifest records them, from one load and shape inference of ``model``."""
    import onnx

    graph = onnx.shape_inference.infer_shapes(onnx.load(str(model), load_external_data=False)).graph
    return {"discrete_choice_fp32": _discrete_choice_layers(graph, op_types),
            "activation_matmuls_fp32": _activation_matmuls(graph)}


def write_qdq(source: Path, target: Path, ranges, *, exclude: Sequence[str] = (),
              op_types: Sequence[str] | None = None, scheme: str = "tensorrt") -> None:
    """Write the Q/DQ INT8 copy of ``source`` to ``target``; nodes named in ``exclude`` stay fp32.

    ``ranges`` is the ``TensorsData`` computed on ``source``; ``op_types`` limits which op types are quantised
    (None: every type onnxruntime knows).
    """
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static, save_tensors_data

    if scheme not in SCHEMES:
        raise ValueError(f"INT8 scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    symmetric = scheme == "tensorrt"
    extra = {"ActivationSymmetric": symmetric, "WeightSymmetric": True, "QuantizeBias": not symmetric}
    quant_logger = logging.getLogger()
    level = quant_logger.level
    with tempfile.TemporaryDirectory(prefix="edgecap-qdq-") as tmp:
        cache = Path(tmp) / "ranges.json"
        save_tensors_data(ranges, cache)  # quantize_static reads ranges only through its cache file
        quant_logger.setLevel(logging.ERROR)  # it warns about pre-processing the graphs edgecap already optimised
        try:
            quantize_static(str(source), str(target), None, quant_format=QuantFormat.QDQ, per_channel=True,
                            reduce_range=False, activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
                            weight_type=QuantType.QInt8, op_types_to_quantize=list(op_types) if op_types else None,
                            nodes_to_exclude=list(exclude), calibrate_method=ranges.calibration_method,
                            calibration_cache_path=cache, extra_options=extra)
        finally:
            quant_logger.setLevel(level)
    onnx.checker.check_model(str(target))


@dataclass(frozen=True)
class QdqGraph:
    """One graph's INT8 recipe: fp32 source, calibrated ranges and options; written again per exclusion set."""

    name: str  # "encoder" / "step"
    source: Path  # the fp32 graph the ranges were computed on
    target: Path  # where the Q/DQ graph is written
    ranges: object  # onnxruntime.quantization.TensorsData of ``source``
    op_types: tuple[str, ...] | None = None  # op types to quantise; None: every type onnxruntime knows
    scheme: str = "tensorrt"  # one of SCHEMES
    rules: dict[str, list[str]] = field(default_factory=dict)  # ``always_fp32_rules``: nodes never quantised

    @property
    def always_fp32(self) -> list[str]:
        return [node for nodes in self.rules.values() for node in nodes]

    def write(self, exclude: Sequence[str] = ()) -> Path:
        """Write ``target`` with ``always_fp32`` and the nodes in ``exclude`` kept fp32; returns ``target``."""
        write_qdq(self.source, self.target, self.ranges, exclude=[*self.always_fp32, *exclude],
                  op_types=self.op_types, scheme=self.scheme)
        return self.target

    def layers(self) -> list[str]:
        """The weighted nodes this recipe quantises: the candidates for staying fp32."""
        return [n for n in quantizable_layers(self.source, self.op_types) if n not in self.always_fp32]


def layer_counts(model: Path) -> tuple[int, int, int]:
    """(weighted layers, of them those whose weights are INT8, QuantizeLinear + DequantizeLinear nodes) of a graph.

    A layer runs INT8 when its weight reaches it through a DequantizeLinear of a constant: what TensorRT and ONNX
    Runtime fuse into an INT8 kernel. An export that wrote Q/DQ nodes but left every weight float shows 0 here.
    """
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    constants = _constants(graph)
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in constants}
    weighted = [n for n in graph.node if n.op_type in LAYER_OPS and len(n.input) > 1
                and (n.input[1] in constants or n.input[1] in dequantized)]
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in graph.node)
    return len(weighted), sum(n.input[1] in dequantized for n in weighted), qdq
