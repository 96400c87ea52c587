"""A Triton Inference Server model repository from an export directory, for deployers who run their own
``tritonserver`` (Jetson images and NGC containers ship it).

Three models: ``edgecap_encoder`` and ``edgecap_step`` are the export's graphs of one precision, run by Triton's
``onnxruntime`` backend (on the CPU, on CUDA, or through its TensorRT execution accelerator; or ``python``: ONNX
Runtime inside Triton's Python backend, for a server that has no other backend); ``edgecap`` is a Python-backend
model that takes encoded image bytes and runs edgecap's own beam search, calling the two graph models through
Triton's business-logic scripting (BLS). Each model's inputs and outputs are the manifest's, so Triton checks every
request against the export's contract. Triton has no scalar tensors in a model without a batch axis, so the step
graph's position is a one-value vector here (the graph reshapes it), the only change made to a graph.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from edgecap import spec
from edgecap.errors import ModelError
from edgecap.runtime.manifest import MANIFEST_NAME, Manifest, TensorSpec

GRAPH_BACKENDS = {"onnxruntime": "KIND_CPU", "onnxruntime-cuda": "KIND_GPU", "onnxruntime-tensorrt": "KIND_GPU",
                  "python": "KIND_CPU"}  # how the graph models run -> where their instances live
CAPTION_MODEL = "edgecap"
TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "int64": "TYPE_INT64", "int32": "TYPE_INT32",
                "bool": "TYPE_BOOL"}
_PYTHON_MODEL = ('"""edgecap in Triton\'s Python backend (edgecap.runtime.triton_models); needs edgecap[runtime]."""\n'
                 "from edgecap.runtime.triton_models import {cls} as TritonPythonModel  # noqa: F401\n")


def _tensor(spec_: TensorSpec) -> str:
    """One input or output entry: the manifest's dtype and shape, the row axis dynamic (-1), a scalar one value."""
    dims = [-1 if isinstance(d, str) else d for d in spec_.shape] or [1]
    return f'  {{ name: "{spec_.name}" data_type: {TRITON_TYPES[spec_.dtype]} dims: [ {", ".join(map(str, dims))} ] }}'


def graph_config(name: str, graphs: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], *,
                 precision: str) -> str:
    """config.pbtxt of one graph model; batching is the caption model's (every tensor has its own row axis)."""
    lines = [f'name: "{name}"', f'backend: "{"python" if graphs == "python" else "onnxruntime"}"', "max_batch_size: 0",
             "input [", ",\n".join(map(_tensor, inputs)), "]", "output [", ",\n".join(map(_tensor, outputs)), "]",
             f"instance_group [ {{ kind: {GRAPH_BACKENDS[graphs]} count: 1 }} ]"]
    if graphs == "onnxruntime-tensorrt":
        mode = "FP16" if precision == "fp16" else "FP32"  # an INT8 graph's Q/DQ nodes say where TensorRT runs INT8
        lines.append("optimization { execution_accelerators { gpu_execution_accelerator: [ { name: \"tensorrt\" "
                     f'parameters {{ key: "precision_mode" value: "{mode}" }} }} ] }} }}')
    return "\n".join(lines + [""])


def caption_config(encoder: str, step: str, *, max_batch: int, max_delay_ms: float) -> str:
    """config.pbtxt of the caption model: IMAGE (the encoded file's bytes) and optional OPTIONS (a JSON object of
    decoding options) in; CAPTION, LOGPROB and ALTERNATIVES (a JSON list) out. Triton's dynamic batcher hands the
    model up to ``max_batch`` requests at a time, which it encodes and searches together."""
    return "\n".join([
        f'name: "{CAPTION_MODEL}"', 'backend: "python"', f"max_batch_size: {max_batch}",
        "input [",
        '  { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] },',
        '  { name: "OPTIONS" data_type: TYPE_STRING dims: [ 1 ] optional: true }',
        "]", "output [",
        '  { name: "CAPTION" data_type: TYPE_STRING dims: [ 1 ] },',
        '  { name: "LOGPROB" data_type: TYPE_FP32 dims: [ 1 ] },',
        '  { name: "ALTERNATIVES" data_type: TYPE_STRING dims: [ 1 ] }',
        "]",
        f"dynamic_batching {{ max_queue_delay_microseconds: {round(max_delay_ms * 1000)} }}",
        "instance_group [ { kind: KIND_CPU count: 1 } ]",
        "parameters [",
        f'  {{ key: "encoder_model" value: {{ string_value: "{encoder}" }} }},',
        f'  {{ key: "step_model" value: {{ string_value: "{step}" }} }}',
        "]", ""])


def position_as_vector(source: Path, target: Path) -> None:
    """Copy the step graph with its scalar ``step`` input taken as a one-value vector and reshaped to a scalar
    before anything reads it (the ``onnx`` package, from the export extra)."""
    import onnx

    model = onnx.load(str(source))
    graph = model.graph
    scalar = f"{spec.STEP}.scalar"
    for node in graph.node:
        node.input[:] = [scalar if name == spec.STEP else name for name in node.input]
    position = next(i for i in graph.input if i.name == spec.STEP)
    position.type.tensor_type.shape.dim.add().dim_value = 1
    graph.initializer.append(onnx.helper.make_tensor(f"{scalar}.shape", onnx.TensorProto.INT64, [0], []))
    graph.node.insert(0, onnx.helper.make_node("Reshape", [spec.STEP, f"{scalar}.shape"], [scalar]))
    onnx.checker.check_model(model)
    onnx.save(model, str(target))


def write_repository(export_dir: Path, out: Path, *, precision: str | None = None, graphs: str = "onnxruntime",
                     max_batch: int = 32, max_delay_ms: float = 5.0) -> Path:
    """Write the three models' folders under ``out`` (made if needed; existing edgecap models there are replaced)
    and return ``out``. ``precision`` None: what the export's ``--target`` chose."""
    if graphs not in GRAPH_BACKENDS:
        raise ModelError(f"--triton-graphs {graphs!r}: use one of {', '.join(GRAPH_BACKENDS)}")
    manifest = Manifest.read(export_dir)
    precision = precision or manifest.default_precision
    encoder_file, step_file = manifest.graph_files(export_dir, precision)
    names = {"encoder": f"{CAPTION_MODEL}_encoder", "step": f"{CAPTION_MODEL}_step"}
    specs = {"encoder": (manifest.encoder_inputs, manifest.encoder_outputs),
             "step": (manifest.step_inputs, manifest.step_outputs)}
    for graph, name in names.items():
        version = _fresh_model_dir(out / name)
        if graph == "encoder":
            shutil.copyfile(encoder_file, version / "model.onnx")
        else:
            position_as_vector(step_file, version / "model.onnx")
        if graphs == "python":
            (version / "model.py").write_text(_PYTHON_MODEL.format(cls="GraphModel"))
        (out / name / "config.pbtxt").write_text(graph_config(name, graphs, *specs[graph], precision=precision))
    version = _fresh_model_dir(out / CAPTION_MODEL)
    (version / "model.py").write_text(_PYTHON_MODEL.format(cls="CaptionModel"))
    shutil.copyfile(export_dir / MANIFEST_NAME, version / MANIFEST_NAME)
    (out / CAPTION_MODEL / "config.pbtxt").write_text(
        caption_config(names["encoder"], names["step"], max_batch=max_batch, max_delay_ms=max_delay_ms))
    return out


def _fresh_model_dir(model: Path) -> Path:
    """``model/1``, emptied: a re-written repository holds no file of an earlier precision or backend."""
    if model.exists():
        shutil.rmtree(model)
    version = model / "1"
    version.mkdir(parents=True)
    return version
