"""The ``edgecap.json`` manifest of an export directory (docs/design.md, the export contract), torch-free.

The exporter writes it and the runtime reads it; tensor names, shapes and roles
come from here, never from inspecting session inputs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgecap.errors import ModelError

FORMAT_VERSION = 2  # 2: a typed INT8 report with the layers that run INT8 counted
MANIFEST_NAME = "edgecap.json"
PRECISIONS = ("fp32", "fp16", "int8")  # one graph file per graph and precision


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: float32 / int64
    shape: tuple[str | int, ...]  # "N" for the dynamic rows, ints elsewhere
    role: str  # memory / state / output / input


@dataclass(frozen=True)
class GraphInt8:
    """One graph of an INT8 export: which file the int8 set uses and, when it is quantised, what runs INT8."""

    file: str  # the graph's file in the int8 set
    quantized: bool  # False: the fp16 (or fp32) file stands in, at the precision it is stored in
    layers: int = 0  # weighted layers (Conv, Gemm, MatMul) in the file
    int8_layers: int = 0  # of them, those whose weights are INT8 (read through a DequantizeLinear)
    qdq_nodes: int = 0  # QuantizeLinear + DequantizeLinear nodes in the file
    kept_fp32: tuple[str, ...] = ()  # layers the sensitivity search kept fp32, in the order it kept them
    discrete_choice_fp32: tuple[str, ...] = ()  # layers whose outputs only rank a discrete choice: never INT8
    activation_matmuls_fp32: tuple[str, ...] = ()  # MatMuls of two activations (attention): never INT8
    op_types: tuple[str, ...] = ()  # op types quantised (empty: every type onnxruntime knows)
    ort_cpu_fp32_ms: float | None = None  # one run on ONNX Runtime CPU, one thread (encoder: 1 image, step: 3 rows)
    ort_cpu_int8_ms: float | None = None

    @property
    def ort_cpu_speedup(self) -> float | None:
        """fp32 time / INT8 time: above 1, the INT8 graph is faster."""
        fast, slow = self.ort_cpu_int8_ms, self.ort_cpu_fp32_ms
        return slow / fast if fast and slow else None


@dataclass(frozen=True)
class Int8Report:
    """What INT8 calibration of an export did and measured (CIDEr-D on the 0-100 scale)."""

    scheme: str  # tensorrt or ort-cpu
    method: str  # range selection: max, entropy or percentile
    calibration_data: str  # the dataset's name; parity leaves out its held-out photos only on the same dataset
    calibration_images: int
    heldout_split: str
    heldout_image_ids: tuple[str, ...]  # the photos ΔCIDEr was measured on, which chose the layers kept fp32
    step_rows: int  # recorded step rows the step's ranges came from
    fp32_cider: float  # of the fp32 graphs on the held-out photos
    int8_cider: float  # of the int8 set as written
    delta_cider: float  # int8 - fp32, held-out mean
    delta_cider_se: float  # its standard error over the photos
    all_int8_delta_cider: float  # before any layer was kept fp32
    threshold: float  # --calib-max-delta
    threshold_met: bool
    layers_tried: int  # layers kept fp32 one by one after the all-INT8 pair missed the threshold
    bias_correction: bool
    delta_cider_before_bias_correction: float | None  # with bias correction: ΔCIDEr of the uncorrected graphs
    build_s: float  # seconds the INT8 stages took
    encoder: GraphInt8
    step: GraphInt8

    @property
    def heldout_images(self) -> int:
        return len(self.heldout_image_ids)

    def graph(self, name: str) -> GraphInt8:
        return {"encoder": self.encoder, "step": self.step}[name]

    @classmethod
    def from_json(cls, data: dict) -> Int8Report:
        graphs = {name: GraphInt8(**{k: tuple(v) if isinstance(v, list) else v for k, v in data[name].items()})
                  for name in ("encoder", "step")}
        return cls(**{**data, **graphs, "heldout_image_ids": tuple(data["heldout_image_ids"])})


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
    quantization: Int8Report | None = None  # what INT8 calibration did and measured, when there are int8 graphs
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
            data["quantization"] = Int8Report.from_json(data["quantization"]) if data.get("quantization") else None
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
        return frozenset(q.heldout_image_ids) if q is not None and q.calibration_data == dataset_name else frozenset()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks: the digests manifests record for checkpoints and graphs."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
