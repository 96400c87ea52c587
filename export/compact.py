"""Lossless compact storage of exported graphs: fp32 weights whose values are exact fp16 numbers stored as fp16.

A checkpoint stored as fp16 (the shipped default) exports fp32 graphs whose weights all hold fp16 values, each in
four bytes where two would do. Each such weight is stored as fp16 and read through a ``Cast`` back to fp32: ONNX
Runtime folds the cast when it loads the graph, so every run computes with the very same fp32 values as before and
only the file shrinks. A convolution the exporter folded a batch norm into holds its fp16 weight times one fp32
factor per output channel; given the model's own weights, it is stored as those two, multiplied back (``Mul``) when
the graph loads, which gives the same fp32 values bit for bit. Small weights and quantization parameters stay as
they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from edgecap.runtime.manifest import Manifest

MIN_ELEMENTS = 4096  # smaller weights (biases, norms, scales) would save nothing worth a node
_QUANTIZATION_OPS = ("QuantizeLinear", "DequantizeLinear")  # their scales must stay initializers to be fused


def channel_factors(folded: np.ndarray, weight: np.ndarray) -> np.ndarray | None:
    """fp32 factors s, one per output channel (shape (C, 1, ...)), with fp32(weight * s) == folded bit for bit, for
    an fp16-exact ``weight``; None when there are none (another layout, or not a rescaled copy of it)."""
    if folded.shape != weight.shape or folded.ndim < 2 or not _fp16_exact(weight):
        return None
    rows, values = folded.reshape(len(folded), -1), weight.reshape(len(weight), -1)
    largest = np.abs(values).argmax(axis=1)
    pivot = values[np.arange(len(values)), largest].astype(np.float64)
    dead = pivot == 0  # an all-zero channel (training pruned it) fits any factor of the right sign
    ratio = rows[np.arange(len(rows)), largest] / np.where(dead, 1.0, pivot)
    estimate = np.where(dead, 1.0, ratio).astype(np.float32)
    candidates, up, down = [estimate, -estimate], estimate, estimate
    for _ in range(2):  # the exporter's factor is within an ulp or two of the largest value's ratio
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        candidates += [up, down]
    chosen = np.full(len(rows), np.nan, np.float32)
    for candidate in candidates:  # bit for bit, signed zeros included
        product = (values * candidate[:, None]).view(np.uint32)
        fits = np.all(product == rows.view(np.uint32), axis=1) & np.isnan(chosen)
        chosen[fits] = candidate[fits]
    if np.isnan(chosen).any():
        return None
    return chosen.reshape((len(folded),) + (1,) * (folded.ndim - 1))


def _fp16_exact(values: np.ndarray) -> bool:
    return bool(np.array_equal(values.astype(np.float16).astype(np.float32), values))


def store_exact_fp16(path: Path, weights: Mapping[str, np.ndarray] | None = None) -> int:
    """Rewrite the ONNX graph at ``path`` with its fp16-exact fp32 weights stored as fp16; the bytes saved.

    ``weights``: the exported model's own fp32 weights by graph name, so a weight the graph holds rescaled per
    output channel (``channel_factors``) is stored as that fp16 weight and its factors."""
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
        factors = None
        if not _fp16_exact(values):
            source = (weights or {}).get(tensor.name)
            factors = None if source is None else channel_factors(values, source)
            if factors is None:
                initializers.append(tensor)
                continue
            values = source
        half = values.astype(np.float16)
        stored = numpy_helper.from_array(half, f"{tensor.name}.fp16")
        initializers.append(stored)
        unscaled = tensor.name if factors is None else f"{tensor.name}.unscaled"
        casts.append(helper.make_node("Cast", [stored.name], [unscaled], name=f"{tensor.name}.to_fp32",
                                      to=TensorProto.FLOAT))
        if factors is not None:
            initializers.append(numpy_helper.from_array(factors, f"{tensor.name}.factors"))
            casts.append(helper.make_node("Mul", [unscaled, f"{tensor.name}.factors"], [tensor.name],
                                          name=f"{tensor.name}.rescale"))
        saved += values.nbytes - half.nbytes - (0 if factors is None else factors.nbytes)
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


def compact_graphs(directory: Path, manifest: Manifest,
                   weights: Mapping[str, np.ndarray] | None = None) -> tuple[Manifest, int]:
    """Every graph file of an export stored compactly (``store_exact_fp16``, given the model's ``weights``); the
    manifest with the new files' sha256, and the bytes saved in all."""
    names = sorted({name for files in manifest.graphs.values() for name in files.values()})
    saved = sum(store_exact_fp16(directory / name, weights) for name in names)
    return (manifest.write(directory) if saved else manifest), saved
