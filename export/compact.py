"""Lossless compact storage of exported graphs: fp32 weights whose values are exact fp16 numbers stored as fp16.

A checkpoint stored as fp16 (the shipped default) exports fp32 graphs whose weights all hold fp16 values, each in
four bytes where two would do. Each such weight is stored as fp16 and read through a ``Cast`` back to fp32: ONNX
Runtime folds the cast when it loads the graph, so every run computes with the very same fp32 values as before and
only the file shrinks. Weights that need fp32 (a fused batch norm's), small ones and quantization parameters stay as
they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap.runtime.manifest import Manifest

MIN_ELEMENTS = 4096  # smaller weights (biases, norms, scales) would save nothing worth a node
_QUANTIZATION_OPS = ("QuantizeLinear", "DequantizeLinear")  # their scales must stay initializers to be fused


def store_exact_fp16(path: Path) -> int:
    """Rewrite the ONNX graph at ``path`` with its fp16-exact fp32 weights stored as fp16; the bytes saved."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    pinned = {name for node in graph.node if node.op_type in _QUANTIZATION_OPS for name in node.input}
    pinned |= {value.name for value in graph.input}
    initializers, casts, saved = [], [], 0
    for tensor in graph.initializer:
        if (tensor.data_type != TensorProto.FLOAT or np.prod(tensor.dims, dtype=np.int64) < MIN_ELEMENTS
                or tensor.name in pinned):
            initializers.append(tensor)
            continue
        values = numpy_helper.to_array(tensor)
        half = values.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), values):
            initializers.append(tensor)
            continue
        stored = numpy_helper.from_array(half, f"{tensor.name}.fp16")
        initializers.append(stored)
        casts.append(helper.make_node("Cast", [stored.name], [tensor.name], name=f"{tensor.name}.to_fp32",
                                      to=TensorProto.FLOAT))
        saved += values.nbytes - half.nbytes
    if not casts:
        return 0
    nodes = [*casts, *graph.node]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return saved


def compact_graphs(directory: Path, manifest: Manifest) -> tuple[Manifest, int]:
    """Every graph file of an export stored compactly (``store_exact_fp16``); the manifest with the new files'
    sha256, and the bytes saved in all."""
    names = sorted({name for files in manifest.graphs.values() for name in files.values()})
    saved = sum(store_exact_fp16(directory / name) for name in names)
    return (manifest.write(directory) if saved else manifest), saved
