"""Bias correction: take out of each layer's bias the mean error that INT8 adds to its output channels.

Rounding weights and activations to INT8 does not only add noise. Per output channel the error has a mean, and
in a deep network the means pile up layer after layer (Nagel et al. 2019, "Data-Free Quantization Through Weight
Equalization and Bias Correction", §4.2; here the mean is measured on calibration feeds, not derived from
batch-norm statistics). Layers are corrected in graph order. Each is measured in the Q/DQ graph that already carries
the corrections before it, so a layer also takes out the drift its inputs bring, and a layer kept fp32 corrects only
that drift. The Q/DQ graph is then written from the corrected fp32 graph, with the ranges calibrated on the original.
It costs no speed: the graph runs exactly the INT8 kernels it ran before.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgecap.calib.quantize import QdqGraph
from edgecap.runtime.backends.ort import cpu_session

CHANNEL_AXIS = 1  # of a Conv's (N, C, ...) and a Gemm's (N, M) output: the axis a bias adds along


def biased_layers(model) -> list[tuple[str, str]]:
    """(node name, bias initializer) of every Conv and Gemm with a constant bias vector, in graph order."""
    initializers = {t.name: t for t in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type in ("Conv", "Gemm") and len(node.input) > 2 and node.input[2] in initializers:
            if len(initializers[node.input[2]].dims) == 1:  # a Gemm's C may broadcast as a matrix: not a bias
                layers.append((node.name, node.input[2]))
    return layers


def _channel_means(model, outputs: dict[str, str],
                   feeds: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """For each key of ``outputs`` (a tensor name): that tensor's mean per channel over ``feeds``, run by
    ``model`` (an onnx ModelProto, which gains those tensors as outputs)."""
    import onnx

    exposed = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None)
                              for tensor in outputs.values() if tensor not in exposed)
    with tempfile.TemporaryDirectory(prefix="edgecap-bias-") as tmp:
        onnx.save(model, str(Path(tmp) / "exposed.onnx"))
        session = cpu_session(Path(tmp) / "exposed.onnx")
        names = [o.name for o in session.get_outputs()]
        sums: dict[str, np.ndarray] = {}
        rows = {key: 0 for key in outputs}
        for feed in feeds:
            values = dict(zip(names, session.run(None, feed), strict=True))
            for key, tensor in outputs.items():
                value = np.moveaxis(values[tensor], CHANNEL_AXIS, -1)
                flat = value.reshape(-1, value.shape[-1]).astype(np.float64)
                sums[key] = sums.get(key, 0.0) + flat.sum(axis=0)
                rows[key] += len(flat)
    return {key: sums[key] / rows[key] for key in outputs}


def correct_biases(graph: QdqGraph, feeds: Sequence[dict[str, np.ndarray]], corrected: Path, *,
                   exclude: Sequence[str] = (), progress: bool = True) -> QdqGraph:
    """``graph`` with its source replaced by a bias-corrected copy written to ``corrected``.

    ``exclude``: the layers the Q/DQ graph keeps fp32 (besides ``graph.always_fp32``), as it will be written.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(graph.source))
    layers = biased_layers(model)
    by_node = {node.name: node for node in model.graph.node}
    reference = _channel_means(onnx.load(str(graph.source)), {name: by_node[name].output[0] for name, _ in layers},
                               feeds)
    biases = {t.name: t for t in model.graph.initializer}
    with tempfile.TemporaryDirectory(prefix="edgecap-bias-") as tmp:
        trial = replace(graph, source=Path(tmp) / "source.onnx", target=Path(tmp) / "qdq.onnx")
        for name, bias in tqdm(layers, desc=f"correcting {graph.name} biases", unit="layer",
                                     disable=not progress):
            onnx.save(model, str(trial.source))
            trial.write(exclude)
            # The quantizer may rename a layer's output (a folded Clip's name moves onto it), never the node.
            qdq = onnx.load(str(trial.target))
            output = next(n.output[0] for n in qdq.graph.node if n.name == name)
            drift = _channel_means(qdq, {name: output}, feeds)[name] - reference[name]
            values = numpy_helper.to_array(biases[bias])
            biases[bias].CopyFrom(numpy_helper.from_array((values - drift).astype(values.dtype), bias))
    onnx.save(model, str(corrected))
    return replace(graph, source=corrected)
