"""The ``edgecap.json`` manifest of an export directory (DESIGN.md §4), torch-free.

The exporter writes it and the runtime reads it; tensor names, shapes and roles
come from here, never from inspecting session inputs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgecap.errors import ModelError

FORMAT_VERSION = 1
MANIFEST_NAME = "edgecap.json"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: float32 / int64
    shape: tuple[str | int, ...]  # "N" for the dynamic rows, ints elsewhere
    role: str  # memory / state / output / input


@dataclass(frozen=True)
class Manifest:
    format_version: int
    model_id: str
    model_config: dict
    encoder_config: dict
    vocab: dict  # Vocab.to_json(): words and special ids
    preprocessing: dict  # Preprocessing.to_json()
    encoder_inputs: tuple[TensorSpec, ...]
    encoder_outputs: tuple[TensorSpec, ...]
    step_inputs: tuple[TensorSpec, ...]
    step_outputs: tuple[TensorSpec, ...]
    state_pairs: dict[str, str]  # state input name -> step output name that updates it
    topk: int  # k of topk_logprobs / topk_ids
    max_length: int  # longest caption the exporter validated
    opset: int
    graphs: dict[str, dict[str, str]]  # precision -> {"encoder": file, "step": file}
    source_checkpoint_sha256: str
    source_checkpoint: str | None = None  # absolute path of the checkpoint exported; None: the shipped default
    quantization: dict = field(default_factory=dict)  # int8: per-graph choice, calibration method, kept-fp32 layers
    reference_scores: dict = field(default_factory=dict)  # PyTorch scores at export time, when measured
    engines: dict = field(default_factory=dict)  # TensorRT plans: cache key -> EngineRecord JSON (runtime/engines.py)

    def write(self, directory: Path) -> Path:
        path = directory / MANIFEST_NAME
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, directory: Path) -> Manifest:
        path = directory / MANIFEST_NAME
        if not path.is_file():
            raise ModelError(f"{path}: not found; pass an export directory made by `edgecap export`")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ModelError(f"{path}: corrupt manifest (not JSON); re-run `edgecap export`") from None
        version = data.get("format_version") if isinstance(data, dict) else None
        if version != FORMAT_VERSION:
            raise ModelError(f"{path}: manifest format version {version}, this edgecap reads {FORMAT_VERSION}; "
                             "re-export with this version of edgecap")
        try:
            for key in ("encoder_inputs", "encoder_outputs", "step_inputs", "step_outputs"):
                data[key] = tuple(TensorSpec(t["name"], t["dtype"], tuple(t["shape"]), t["role"]) for t in data[key])
            return cls(**data)
        except (KeyError, TypeError) as err:
            raise ModelError(f"{path}: manifest is missing or has bad fields ({err}); "
                             "re-run `edgecap export`") from None

    def graph_files(self, directory: Path, precision: str) -> tuple[Path, Path]:
        """(encoder, step) ONNX files of one precision, checked to exist."""
        if precision not in self.graphs:
            raise ModelError(f"{directory}: no {precision} graphs (exported: {', '.join(self.graphs)}); "
                             f"re-run `edgecap export --precision {precision}`")
        files = (directory / self.graphs[precision]["encoder"], directory / self.graphs[precision]["step"])
        for file in files:
            if not file.is_file():
                raise ModelError(f"{file}: missing from the export directory; re-run `edgecap export`")
        return files

    def stored_precision(self, precision: str, graph: str) -> str:
        """The precision ``graph``'s file in the ``precision`` set is stored in: the set's own, except a graph that
        INT8 export left unquantised, which is the fp16 (or fp32) file."""
        file = self.graphs[precision][graph]
        return next((p for p in ("fp32", "fp16", "int8") if self.graphs.get(p, {}).get(graph) == file), precision)

    def int8_heldout_ids(self, dataset_name: str) -> frozenset[str]:
        """Ids of ``dataset_name``'s photos on which INT8 calibration chose the layers kept fp32; empty when it
        scored another dataset's photos (or predates recording them)."""
        q = self.quantization
        return frozenset(q.get("heldout_image_ids", ())) if q.get("calibration_data") == dataset_name else frozenset()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks: the digests manifests record for checkpoints and graphs."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
