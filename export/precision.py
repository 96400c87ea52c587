"""Reduced-precision copies of the exported graphs: precision lives in the ONNX file (docs/design.md).

fp16 uses the converter shipped with onnxruntime (onnxconverter-common's was seen
to emit an invalid LSTM step) with fp32 inputs and outputs. What
accuracy needs stays fp32: softmax, log-softmax, top-k, reductions, and the
elementwise ops that carry an LSTM's cell state from one step to the next, where
fp16 rounding would accumulate over a caption.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from edgecap.runtime.manifest import Manifest

FP32_OPS = ("Softmax", "LogSoftmax", "TopK", "ReduceMean", "ReduceSum", "ReduceMax")
CELL_OPS = ("Add", "Mul", "Sigmoid", "Tanh")  # the cell update c' = f*c + i*g and its gates
CELL_DEPTH = 2  # producers walked back from a cell-state output: the Add and the two Muls feeding it


def cell_state_nodes(model, outputs: Iterable[str], depth: int = CELL_DEPTH) -> list[str]:
    """Names of the elementwise nodes within ``depth`` producers of the given graph outputs."""
    producer = {out: node for node in model.graph.node for out in node.output}
    keep, frontier = [], list(outputs)
    for _ in range(depth):
        nodes = [producer[name] for name in frontier if name in producer and producer[name].op_type in CELL_OPS]
        keep += [node.name for node in nodes if node.name not in keep]
        frontier = [name for node in nodes for name in node.input]
    return keep


def write_fp16(source: Path, target: Path, *, fp32_outputs: Iterable[str] = ()) -> None:
    """Write a mixed-precision copy of ``source`` with fp32 I/O; ``fp32_outputs`` keep their producers fp32."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    model = OnnxModel(onnx.load(str(source)))
    source_inputs = copy.deepcopy(list(model.model.graph.input))
    keep = cell_state_nodes(model.model, fp32_outputs)
    model.convert_float_to_float16(keep_io_types=True, op_block_list=list(FP32_OPS), node_block_list=keep)
    model.topological_sort()  # the converter appends its input casts after their consumers
    restore_pruned_inputs(source_inputs, model.model.graph)
    onnx.checker.check_model(model.model)
    onnx.save(model.model, str(target))


def restore_pruned_inputs(source_inputs: Iterable, converted_graph) -> None:
    """Put back, in their original order, the graph inputs a converter dropped because no node reads them.

    The runtime feeds every precision the same named tensors (GLIED's step takes ``memory.attribute_ids``
    without reading it: the ids are memory for the encoder's outputs, their keys/values are what the step
    uses), so a precision's graph must keep the fp32 graph's inputs even when one is unused.
    """
    kept = {value.name: value for value in converted_graph.input}
    inputs = [kept.get(value.name, value) for value in source_inputs]
    del converted_graph.input[:]
    converted_graph.input.extend(inputs)


def add_fp16(directory: Path, manifest: Manifest) -> Manifest:
    """Write ``encoder.fp16.onnx`` and ``step.fp16.onnx`` beside the fp32 graphs; the manifest that lists them."""
    files = {}
    for graph, source in zip(("encoder", "step"), manifest.graph_files(directory, "fp32"), strict=True):
        target = directory / f"{graph}.fp16.onnx"
        cell_outputs = [manifest.state_pairs[n] for n in manifest.state_pairs if n.startswith("state.c")]
        write_fp16(source, target, fp32_outputs=cell_outputs if graph == "step" else ())
        files[graph] = target.name
    return replace(manifest, graphs={**manifest.graphs, "fp16": files}).write(directory)
