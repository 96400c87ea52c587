"""``edgecap export --trt``: strongly typed TensorRT engines from the precision graphs of an export directory.

Precision lives in the ONNX file (docs/design.md): the fp16 graph is mixed precision, the int8 graph explicit Q/DQ,
and every network is created STRONGLY_TYPED, so TensorRT builds the types the graph declares (10.3 on Jetson
accepts this; 11 builds nothing else). Each engine has one optimisation profile over the rows N of every
N-shaped input (``edgecap.runtime.engines.profile_rows``). Plans are cached in ``engines/`` under a key of GPU,
compute capability, TensorRT version, precision, profile and source-graph sha256 and recorded in the manifest;
a plan whose key still matches is reused, one whose key changed on this machine is rebuilt. TensorRT's timing
cache (``engines/timing.cache``) is kept so rebuilds choose the same tactics quickly. Needs no torch: a Jetson
builds engines from an export directory made elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from edgecap.errors import ModelError
from edgecap.export.trt_compat import check_for_tensorrt
from edgecap.runtime.backends.trt_cuda import current_device, require_tensorrt
from edgecap.runtime.engines import (
    ENGINE_DIR,
    GRAPHS,
    TIMING_CACHE,
    EngineOptions,
    EngineRecord,
    engine_key,
    profile_rows,
    profile_shapes,
)
from edgecap.runtime.manifest import Manifest, contained, file_sha256


@dataclass(frozen=True)
class BuiltEngine:
    record: EngineRecord
    reused: bool  # True: a cached plan with the same key was kept
    seconds: float  # build time (0 when reused)


def build_engines(directory: Path, manifest: Manifest, precisions: Sequence[str],
                  options: EngineOptions | None = None) -> tuple[Manifest, list[BuiltEngine]]:
    """Build (or reuse) the encoder and step engines of each precision; returns the manifest written with them.

    The graphs are checked for TensorRT first (no GPU needed for that), then TensorRT and the GPU are required.
    """
    directory = Path(directory)
    options = options or EngineOptions()
    if 2 * options.beam > manifest.topk:
        raise ModelError(f"{directory}: the step graph returns {manifest.topk} candidates, beam {options.beam} "
                         f"needs {2 * options.beam}; pass --beam {manifest.topk // 2} or re-export with "
                         f"--beam {options.beam}")
    check_for_tensorrt(directory, manifest, precisions)
    trt, cudart = require_tensorrt()
    device = current_device(trt, cudart)
    (directory / ENGINE_DIR).mkdir(exist_ok=True)
    timing = directory / TIMING_CACHE
    cache = timing.read_bytes() if timing.is_file() else b""
    logger = trt.Logger(trt.Logger.WARNING)
    engines = dict(manifest.engines)
    built = []
    for precision in precisions:
        for graph, source in zip(GRAPHS, manifest.graph_files(directory, precision), strict=True):
            rows = profile_rows(graph, options)
            sha = file_sha256(source)
            key = engine_key(device, precision, graph, rows, sha)
            record = EngineRecord(graph=graph, precision=precision, file=f"{ENGINE_DIR}/{graph}.{precision}.{key}.plan",
                                  source=source.name, source_sha256=sha, gpu=device.gpu,
                                  compute_capability=device.compute_capability, tensorrt=device.tensorrt,
                                  profile=rows)
            if key in engines and (directory / record.file).is_file():
                built.append(BuiltEngine(record, reused=True, seconds=0.0))
                continue
            for stale in [k for k, r in engines.items() if _same_slot(EngineRecord.from_json(r), record)]:
                # this machine's older build, and only a file of this export
                contained(directory, engines.pop(stale)["file"], "engine").unlink(missing_ok=True)
            specs = manifest.encoder_inputs if graph == "encoder" else manifest.step_inputs
            start = time.perf_counter()
            shapes = profile_shapes(specs, rows)
            plan, cache = _build(trt, logger, source, shapes, cache)
            record = replace(record, plan_sha256=hashlib.sha256(plan).hexdigest(),
                             int8_layers=_checked_int8(trt, logger, plan, shapes, manifest, precision, graph, source))
            _write_atomic(directory / record.file, plan)
            engines[key] = record.to_json()
            built.append(BuiltEngine(record, reused=False, seconds=time.perf_counter() - start))
    _write_atomic(timing, cache)
    return replace(manifest, engines=engines).write(directory), built


def _same_slot(old: EngineRecord, new: EngineRecord) -> bool:
    """Same graph, precision and machine: the new plan replaces the old one (other machines' plans stay)."""
    return (old.graph, old.precision, old.device) == (new.graph, new.precision, new.device)


def _build(trt, logger, source: Path, shapes: dict, timing_cache: bytes) -> tuple[bytes, bytes]:
    """Parse ``source`` into a strongly typed network and build it with one profile.

    Returns the plan and the timing cache after the build, which now also holds this graph's layer timings.
    """
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(source)):
        errors = "; ".join(str(parser.get_error(i)).splitlines()[0] for i in range(parser.num_errors))
        raise ModelError(f"{source}: TensorRT {trt.__version__} cannot parse this graph ({errors[:300]}); "
                         "re-run `edgecap export` with this version of edgecap")
    config = builder.create_builder_config()
    config.clear_flag(trt.BuilderFlag.TF32)  # an fp32 tensor of the graph means fp32, not TF32 tensor-core math
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # the inspector then says each layer's precision
    _attach_timing_cache(config, timing_cache)
    inputs = {network.get_input(i).name for i in range(network.num_inputs)}
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in shapes.items():
        if name in inputs:  # an input no layer reads is not a network input
            profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise ModelError(f"{source}: TensorRT {trt.__version__} could not build an engine from it (its log above "
                         "says why); check the graph with `polygraphy inspect model` and re-run `edgecap export`")
    return bytes(plan), bytes(config.get_timing_cache().serialize())


def engine_int8_layers(trt, logger, plan: bytes, shapes: dict) -> int:
    """How many of a plan's Conv/Gemm/MatMul layers run INT8, read through TensorRT's engine inspector.

    The inspector gives tensor formats only once every input shape is set on an execution context, so the profile's
    opt shapes are set first.
    """
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    context = engine.create_execution_context()
    inputs = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)
              if engine.get_tensor_mode(engine.get_tensor_name(i)) == trt.TensorIOMode.INPUT}
    for name, (_, opt, _) in shapes.items():
        if name in inputs:
            context.set_input_shape(name, opt)
    inspector = engine.create_engine_inspector()
    inspector.execution_context = context
    layers = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON)).get("Layers", [])
    return sum(_runs_int8(layer) for layer in layers)


def _runs_int8(layer) -> bool:
    if not isinstance(layer, dict) or not any(k in str(layer.get("LayerType", "")).lower()
                                              for k in ("conv", "gemm", "matrix", "matmul", "fullyconnected")):
        return False
    tensors = [*layer.get("Inputs", []), *layer.get("Outputs", [])]
    return any("int8" in str(t.get("Format/Datatype", "")).lower() for t in tensors if isinstance(t, dict))


def _checked_int8(trt, logger, plan: bytes, shapes: dict, manifest: Manifest, precision: str, graph: str,
                  source: Path) -> int | None:
    """An INT8 graph's engine must run at least the layers its Q/DQ graph made INT8 in INT8, or it is not called INT8
    (TensorRT may silently run a Q/DQ graph's layers in float); None for other precisions."""
    if manifest.stored_precision(precision, graph) != "int8":
        return None
    ran = engine_int8_layers(trt, logger, plan, shapes)
    exported = manifest.quantization.graph(graph).int8_layers if manifest.quantization else 0
    if ran < exported:
        raise ModelError(f"{source}: TensorRT {trt.__version__} runs {ran} of its {exported} INT8 layers in INT8, so "
                         "this is not an INT8 engine; check the graph with `polygraphy inspect model` or export the "
                         "step alone in INT8 (--int8-graphs step)")
    return ran


def _attach_timing_cache(config, data: bytes) -> None:
    """Load the saved timing cache; one from another GPU or TensorRT version is dropped for an empty one."""
    cache = config.create_timing_cache(data) if data else None
    if cache is None or not config.set_timing_cache(cache, False):
        config.set_timing_cache(config.create_timing_cache(b""), False)


def _write_atomic(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)
