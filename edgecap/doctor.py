"""``edgecap doctor [EXPORT]``: what this machine can run, and whether an export's files are the ones it wrote.

The host's fingerprint (CPU and its INT8-relevant instruction sets, GPUs with driver and compute capability, JetPack,
library versions, the ONNX Runtime providers a session really gets), then for an export directory: every backend x
precision marked runnable or not with the one-line reason, each graph and calibration file checked against the
sha256 the manifest recorded, and each cached TensorRT engine usable here or stale. Torch-free: a device without torch
asks it too (the torch row then says so).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from edgecap.errors import EdgecapError
from edgecap.runtime.machine import machine_info
from edgecap.runtime.manifest import Manifest, contained, file_sha256


@dataclass(frozen=True)
class Check:
    subject: str  # "ort int8", "encoder.int8.onnx", "engines/step.fp16.KEY.plan"
    ok: bool
    detail: str  # why not, or what it is


@dataclass(frozen=True)
class Diagnosis:
    machine: dict
    tensorrt: str  # its version, or why it cannot run here
    export: str | None = None
    runnable: list[Check] = field(default_factory=list)  # backend x precision
    files: list[Check] = field(default_factory=list)  # graphs and calibration feeds against their recorded sha256
    engines: list[Check] = field(default_factory=list)  # cached TensorRT plans

    @property
    def healthy(self) -> bool:
        """The export's files are intact and at least one backend runs it (always true without an export)."""
        return all(c.ok for c in self.files) and (self.export is None or any(c.ok for c in self.runnable))


def _tensorrt() -> tuple[object | None, str]:
    from edgecap.runtime.backends.trt_cuda import current_device, require_tensorrt

    try:
        trt, cudart = require_tensorrt()
        return current_device(trt, cudart), f"TensorRT {trt.__version__}"
    except EdgecapError as err:
        return None, str(err)


def _ort_row(directory: Path, manifest: Manifest, precision: str, device: str) -> Check:
    from edgecap.runtime.backends.ort import OrtBackend

    try:
        backend = OrtBackend(directory, manifest, precision=precision, device=device)
        return Check(f"ort {precision} ({device})", True, f"providers {', '.join(backend.step.get_providers())}")
    except EdgecapError as err:
        return Check(f"ort {precision} ({device})", False, str(err))


def _openvino_rows(directory: Path, manifest: Manifest) -> list[Check]:
    """One row per precision on OpenVINO's CPU device, or one row saying it is not installed (it is optional)."""
    if importlib.util.find_spec("openvino") is None:
        return [Check("openvino", False, "OpenVINO is not installed (optional: pip install 'edgecap[openvino]')")]
    from edgecap.runtime.backends.openvino import OpenvinoBackend

    rows = []
    for precision in manifest.graphs:
        try:
            OpenvinoBackend(directory, manifest, precision=precision)
            rows.append(Check(f"openvino {precision} (CPU)", True, "compiled on OpenVINO's CPU device"))
        except EdgecapError as err:
            rows.append(Check(f"openvino {precision} (CPU)", False, str(err)))
    return rows


def _torch_row(manifest: Manifest) -> Check:
    from edgecap.config import DEFAULT_MODEL

    try:
        installed = importlib.util.find_spec("torch") is not None
    except ImportError:  # a finder that refuses the name outright
        installed = False
    if not installed:
        return Check("torch fp32", False, "torch is not installed (pip install 'edgecap[train]')")
    source = Path(manifest.source_checkpoint) if manifest.source_checkpoint else DEFAULT_MODEL
    if not source.is_file():
        return Check("torch fp32", False, f"{source}: the checkpoint the export came from is not on this machine")
    if file_sha256(source) != manifest.source_checkpoint_sha256:
        return Check("torch fp32", False, f"{source}: not the checkpoint the export came from (sha256 differs)")
    return Check("torch fp32", True, f"the reference checkpoint {source}")


def _trt_rows(directory: Path, manifest: Manifest, device, reason: str) -> list[Check]:
    from edgecap.runtime.engines import find_engine

    rows = []
    for precision in manifest.graphs:
        if device is None:
            rows.append(Check(f"trt {precision}", False, reason))
            continue
        try:
            for graph, source in zip(("encoder", "step"), manifest.graph_files(directory, precision), strict=True):
                find_engine(manifest.engines, directory=directory, graph=graph, precision=precision, device=device,
                            source_sha256=file_sha256(source))
            rows.append(Check(f"trt {precision}", True, "engines built for this GPU and TensorRT"))
        except EdgecapError as err:
            rows.append(Check(f"trt {precision}", False, str(err)))
    return rows


def _file_checks(directory: Path, manifest: Manifest) -> list[Check]:
    recorded = dict(manifest.files)
    calibration = manifest.quantization.calibration_files if manifest.quantization is not None else {}
    recorded |= calibration
    checks = []
    for name, sha in sorted(recorded.items()):
        try:
            path = contained(directory, name, "file")
        except EdgecapError as err:
            checks.append(Check(name, False, str(err)))
            continue
        if not path.is_file() and name in calibration:  # the shipped export leaves its calibration feeds out
            checks.append(Check(name, True, "not here: only re-quantising reads it, captioning does not"))
        elif not path.is_file():
            checks.append(Check(name, False, "missing"))
        else:
            same = file_sha256(path) == sha
            checks.append(Check(name, same, "sha256 as recorded" if same else "changed since export (sha256 differs)"))
    return checks


def _engine_checks(directory: Path, manifest: Manifest, device) -> list[Check]:
    from edgecap.runtime.engines import EngineRecord, differences

    checks = []
    for record in (EngineRecord.from_json(r) for r in manifest.engines.values()):
        source = directory / record.source
        if not (directory / record.file).is_file():
            checks.append(Check(record.file, False, "missing"))
        elif device is None:
            checks.append(Check(record.file, False, f"built for {record.gpu}, TensorRT {record.tensorrt}; "
                                                    "no TensorRT here to run it"))
        else:
            problems = differences(record, device, file_sha256(source) if source.is_file() else "")
            checks.append(Check(record.file, not problems, "usable here" if not problems else
                                f"stale: built for {', '.join(problems)}"))
    return checks


def diagnose(export_dir: Path | None = None, *, devices: tuple[str, ...] = ("cpu", "cuda", "tensorrt")) -> Diagnosis:
    """The machine, and what it can do with ``export_dir`` when one is given."""
    device, tensorrt = _tensorrt()
    machine = machine_info()
    if export_dir is None:
        return Diagnosis(machine, tensorrt)
    directory = Path(export_dir)
    manifest = Manifest.read(directory)
    providers = _available_devices(devices)
    runnable = [_torch_row(manifest)]
    runnable += [_ort_row(directory, manifest, precision, d) for precision in manifest.graphs for d in providers]
    runnable += _openvino_rows(directory, manifest)
    runnable += _trt_rows(directory, manifest, device, tensorrt)
    return Diagnosis(machine, tensorrt, str(directory), runnable, _file_checks(directory, manifest),
                     _engine_checks(directory, manifest, device))


def _available_devices(devices: tuple[str, ...]) -> list[str]:
    """The ONNX Runtime devices this build offers; whether a session really gets one is each row's check."""
    from edgecap.runtime.backends.ort import PROVIDERS, import_onnxruntime

    available = import_onnxruntime().get_available_providers()
    return [d for d in devices if PROVIDERS[d] in available]
