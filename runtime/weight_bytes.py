"""Bytes of weights one run of a graph reads: with the memory bandwidth, the floor of a memory-bound step."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgecap.runtime.backends.ort import FP32_PRESERVING


def onnx_weight_bytes(path: Path) -> int | None:
    """Bytes of weights one run of an ONNX graph reads: its initializers and constant tensors, as stored.

    A table read only through ``Gather`` (a word embedding; through a ``Cast`` too, as compact storage writes it) is
    left out: a step reads N of its rows, not all.
    A weight read only through ``Cast`` counts at the cast's type: ONNX Runtime folds such constants when it
    loads the graph (an fp16 graph's Gemm weights that are kept in fp32 are read as fp32). None when ``onnx``
    (the export extra) is not installed: the runtime itself never needs it.
    """
    try:
        import onnx
        from onnx import helper
    except ImportError:
        return None
    model = onnx.load(str(path), load_external_data=False)  # the sizes are in the dims; the bytes need not load

    def size(tensor) -> int:
        return int(np.prod(tensor.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize

    uses: dict[str, set[tuple[str, int]]] = {}
    cast_to: dict[str, set[int]] = {}  # tensor name -> element types it is cast to
    cast_output: dict[str, str] = {}  # tensor name -> what a Cast of it is called
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            uses.setdefault(name, set()).add((node.op_type, index))
            if node.op_type == "Cast":
                cast_to.setdefault(name, set()).update(a.i for a in node.attribute if a.name == "to")
                cast_output[name] = node.output[0]

    def read_bytes(name: str, tensor) -> int:
        used = uses.get(name, set())
        if used == {("Gather", 0)}:
            return 0
        if used == {("Cast", 0)} and len(cast_to.get(name, ())) == 1:
            if uses.get(cast_output[name]) == {("Gather", 0)}:  # a compactly stored embedding
                return 0
            return size(tensor) // helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize * \
                helper.tensor_dtype_to_np_dtype(next(iter(cast_to[name]))).itemsize
        return size(tensor)

    total = sum(read_bytes(t.name, t) for t in model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            total += sum(read_bytes(node.output[0], a.t) for a in node.attribute if a.name == "value")
    return total


def ort_weight_bytes(path: Path, *, providers: Sequence[str] = ("CPUExecutionProvider",)) -> int | None:
    """:func:`onnx_weight_bytes` of the graph as ONNX Runtime runs it on ``providers``, after its load-time rewrites.

    They matter: the CPU provider has no fp16 Gemm, so it casts an fp16 graph's weights to fp32 once at load
    and every step then reads fp32. Falls back to the file as stored where the rewritten graph cannot be saved.
    """
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as folder:
        optimized = Path(folder) / "optimized.onnx"
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(optimized)
        options.log_severity_level = 3  # no warning that the saved graph is tied to this CPU: it is only measured
        try:
            ort.InferenceSession(str(path), options, providers=list(providers), **FP32_PRESERVING)
            return onnx_weight_bytes(optimized)
        except Exception:  # e.g. a compiling provider that cannot save its graph
            return onnx_weight_bytes(path)
