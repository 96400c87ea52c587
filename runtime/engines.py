"""TensorRT engine bookkeeping with neither tensorrt nor torch: profiles, cache keys, manifest records.

An engine is tied to the GPU model, its compute capability and the TensorRT version that built it,
and to the ONNX file and the optimisation profile it was built from. ``edgecap export --trt`` records each plan in
the manifest's ``engines`` under a key hashed from all of these; the runtime loads only a record that matches this
machine and the graph file as it is now, and refuses any other with one line that says what differs. Everything
here is plain data, so CI checks it on a machine without a GPU.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from edgecap import spec
from edgecap.errors import ModelError
from edgecap.runtime.manifest import TensorSpec, contained, file_sha256

GRAPHS = ("encoder", "step")
ENGINE_DIR = "engines"  # plans and the timing cache, inside the export directory
TIMING_CACHE = f"{ENGINE_DIR}/timing.cache"  # TensorRT's layer timings, reused so rebuilds pick the same tactics


@dataclass(frozen=True)
class EngineOptions:
    """The decoding the engines are built for: their one optimisation profile over the rows N."""

    max_batch: int = 32  # most images one caption call sends (parity sends 25, caption 16)
    opt_batch: int = 1  # images per call the kernels are tuned for
    beam: int = 3  # largest beam: the step runs images x beam rows

    def __post_init__(self):
        for name in ("max_batch", "opt_batch", "beam"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelError(f"TensorRT {name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.opt_batch > self.max_batch:
            raise ModelError(f"TensorRT opt-batch {self.opt_batch} exceeds max-batch {self.max_batch}; "
                             "pass --opt-batch <= --max-batch")


@dataclass(frozen=True)
class Profile:
    """Rows N an engine accepts (min, max) and is tuned for (opt)."""

    min: int
    opt: int
    max: int


def profile_rows(graph: str, options: EngineOptions) -> Profile:
    """The encoder sees images (it runs before the beam is tiled); the step sees images x beam rows."""
    if graph not in GRAPHS:
        raise ValueError(f"graph {graph!r}: expected one of {', '.join(GRAPHS)}")
    beam = 1 if graph == "encoder" else options.beam
    return Profile(1, options.opt_batch * beam, options.max_batch * beam)


def profile_shapes(specs: Sequence[TensorSpec], rows: Profile) -> dict[str, tuple[tuple[int, ...], ...]]:
    """(min, opt, max) shape of every input with the dynamic axis N; static inputs (the ``step`` scalar) need none.

    Shapes come from the manifest's TensorSpecs, so the profile covers exactly the inputs export declared.
    """
    shapes = {}
    for tensor in specs:
        if spec.BATCH_AXIS not in tensor.shape:
            continue
        if tensor.shape[0] != spec.BATCH_AXIS or spec.BATCH_AXIS in tensor.shape[1:]:
            raise ModelError(f"input {tensor.name} has shape {tensor.shape}: the contract allows N on axis 0 only; "
                             "re-run `edgecap export`")
        rest = tuple(int(d) for d in tensor.shape[1:])
        shapes[tensor.name] = tuple((n, *rest) for n in (rows.min, rows.opt, rows.max))
    return shapes


@dataclass(frozen=True)
class DeviceInfo:
    """What a plan is tied to on the machine that runs it."""

    gpu: str  # cudaDeviceProp.name, e.g. "NVIDIA H100 80GB HBM3" or "Orin"
    compute_capability: str  # "8.7"
    tensorrt: str  # tensorrt.__version__


@dataclass(frozen=True)
class EngineRecord:
    """One plan in the manifest's ``engines`` (key -> this record as JSON)."""

    graph: str  # "encoder" / "step"
    precision: str  # fp32 / fp16 / int8: which ONNX file it was built from
    file: str  # the plan, relative to the export directory
    source: str  # the ONNX file, relative to the export directory
    source_sha256: str
    gpu: str
    compute_capability: str
    tensorrt: str
    profile: Profile
    plan_sha256: str = ""  # the plan as built: a plan replaced since is refused
    int8_layers: int | None = None  # INT8 graphs: the engine's Conv/Gemm/MatMul layers TensorRT runs in INT8

    @property
    def device(self) -> DeviceInfo:
        return DeviceInfo(self.gpu, self.compute_capability, self.tensorrt)

    @property
    def key(self) -> str:
        return engine_key(self.device, self.precision, self.graph, self.profile, self.source_sha256)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> EngineRecord:
        return cls(**{**data, "profile": Profile(**data["profile"])})


def engine_key(device: DeviceInfo, precision: str, graph: str, rows: Profile, source_sha256: str) -> str:
    """16 hex digits naming a plan: any change of GPU, compute capability, TensorRT, precision, graph, profile or
    source graph gives another key, so a cached plan is reused only where it is valid."""
    parts = [asdict(device), precision, graph, asdict(rows), source_sha256]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def rebuild_hint(directory: Path, precision: str) -> str:
    return f"run `edgecap export {directory} --trt --precision {precision}` on this machine"


def differences(record: EngineRecord, device: DeviceInfo, source_sha256: str) -> list[str]:
    """What stops ``record`` from running here, in words; empty when it matches."""
    out = []
    if record.gpu != device.gpu:
        out.append(f"GPU {record.gpu!r} (this machine: {device.gpu!r})")
    if record.compute_capability != device.compute_capability:
        out.append(f"compute capability {record.compute_capability} (this machine: {device.compute_capability})")
    if record.tensorrt != device.tensorrt:
        out.append(f"TensorRT {record.tensorrt} (this machine: {device.tensorrt})")
    if record.source_sha256 != source_sha256:
        out.append(f"{record.source} as it was before (it changed since: sha256 {record.source_sha256[:12]}... "
                   f"now {source_sha256[:12]}...)")
    return out


def find_engine(engines: Mapping[str, Mapping], *, directory: Path, graph: str, precision: str, device: DeviceInfo,
                source_sha256: str) -> EngineRecord:
    """The recorded plan of ``graph`` in ``precision`` that runs on ``device``; else one ModelError line saying
    what differs (from the closest record: same GPU and TensorRT first) and how to fix it."""
    records = [EngineRecord.from_json(r) for r in engines.values()]
    records = [r for r in records if (r.graph, r.precision) == (graph, precision)]
    if not records:
        raise ModelError(f"{directory}: no {precision} TensorRT engines recorded in its manifest; "
                         f"{rebuild_hint(directory, precision)}")
    ranked = sorted(records, key=lambda r: len(differences(r, device, source_sha256)))
    best = ranked[0]
    problems = differences(best, device, source_sha256)
    if problems:
        raise ModelError(f"{directory / best.file}: built for {', '.join(problems)}; "
                         f"{rebuild_hint(directory, precision)}")
    plan = contained(directory, best.file, "engine")
    if not plan.is_file():
        raise ModelError(f"{directory / best.file}: missing from the export directory; "
                         f"{rebuild_hint(directory, precision)}")
    if best.plan_sha256 and file_sha256(plan) != best.plan_sha256:
        raise ModelError(f"{plan}: not the plan this export built (sha256 differs); "
                         f"{rebuild_hint(directory, precision)}")
    return best

