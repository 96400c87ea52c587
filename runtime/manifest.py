"""The ``edgecap.json`` manifest of an export directory (docs/design.md, the export contract), torch-free.

The exporter writes it and the runtime reads it; tensor names, shapes and roles
come from here, never from inspecting session inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path

from edgecap.errors import ModelError
from edgecap.preprocess import Preprocessing
from edgecap.vocab import Vocab

FORMAT_VERSION = 2  # 2: a typed INT8 report with the layers that run INT8 counted, and each graph file's sha256
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
    threshold_met: bool  # the verdict passed (before the rule: |delta_cider| <= threshold)
    layers_tried: int  # layers kept fp32 one by one after the all-INT8 pair did not pass
    bias_correction: bool
    delta_cider_before_bias_correction: float | None  # with bias correction: ΔCIDEr of the uncorrected graphs
    build_s: float  # seconds the INT8 stages took
    encoder: GraphInt8
    step: GraphInt8
    calibration_files: dict[str, str] = field(default_factory=dict)  # recorded feeds (calib/*.npz) -> sha256
    verdict: str = ""  # the parity gate's rule on the held-out photos: pass, fail or inconclusive ("": not judged)
    photos_to_decide: int | None = None  # inconclusive: about how many held-out photos would decide it
    delta_cider_ci95: tuple[float, float] | None = None  # the paired-bootstrap interval the verdict judged

    @property
    def heldout_images(self) -> int:
        return len(self.heldout_image_ids)

    def graph(self, name: str) -> GraphInt8:
        return {"encoder": self.encoder, "step": self.step}[name]

    @classmethod
    def from_json(cls, data: dict) -> Int8Report:
        graphs = {name: GraphInt8(**{k: tuple(v) if isinstance(v, list) else v for k, v in data[name].items()})
                  for name in ("encoder", "step")}
        ci95 = tuple(data["delta_cider_ci95"]) if data.get("delta_cider_ci95") else None
        return cls(**{**data, **graphs, "heldout_image_ids": tuple(data["heldout_image_ids"]),
                      "delta_cider_ci95": ci95})


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
    reference_scores: dict = field(default_factory=dict)  # PyTorch's scores as parity measured them, by data and
    # decoding: what `edgecap eval` of the export on a device should come close to
    engines: dict = field(default_factory=dict)  # TensorRT plans: cache key -> EngineRecord JSON (runtime/engines.py)
    files: dict[str, str] = field(default_factory=dict)  # every graph file -> its sha256, as written
    target: dict = field(default_factory=dict)  # export --target: the device, the precision chosen, why, each trial

    @property
    def default_precision(self) -> str:
        """What ``edgecap export --target`` chose for this export; fp32, which every export has, otherwise."""
        return self.target.get("precision", "fp32")

    def write(self, directory: Path, *, record_files: bool = True) -> Manifest:
        """Write ``edgecap.json`` atomically, recording the sha256 of every graph file it names (``record_files``:
        the writer made them; a reader adding a note leaves the recorded digests as they were); the manifest
        written."""
        names = sorted({name for files in self.graphs.values() for name in files.values()})
        written = replace(self, files={name: file_sha256(contained(directory, name, "graph")) for name in names}) \
            if record_files else self
        path = directory / MANIFEST_NAME
        temporary = path.with_name(f".{MANIFEST_NAME}.tmp")
        temporary.write_text(json.dumps(asdict(written), indent=2) + "\n")
        os.replace(temporary, path)
        return written

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
        if not isinstance(version, int) or isinstance(version, bool):
            raise ModelError(f"{path}: format_version is {version!r}, not a version number; re-run `edgecap export`")
        if version != FORMAT_VERSION:
            raise ModelError(f"{path}: manifest format version {version}, this edgecap reads {FORMAT_VERSION}; "
                             "re-export with this version of edgecap")
        wrong = _mistyped(data)
        if wrong:
            raise ModelError(f"{path}: manifest fields of the wrong type or missing ({', '.join(wrong)}); "
                             "re-run `edgecap export`")
        try:
            for key in ("encoder_inputs", "encoder_outputs", "step_inputs", "step_outputs"):
                data[key] = tuple(TensorSpec(t["name"], t["dtype"], tuple(t["shape"]), t["role"]) for t in data[key])
            data["quantization"] = Int8Report.from_json(data["quantization"]) if data.get("quantization") else None
            manifest = cls(**data)
        except (KeyError, TypeError, ValueError) as err:
            raise ModelError(f"{path}: manifest is missing or has bad fields ({err}); "
                             "re-run `edgecap export`") from None
        for files in manifest.graphs.values():  # a manifest names files of its own export only
            for name in files.values():
                contained(directory, name, "graph")
        for record in manifest.engines.values():
            contained(directory, str(record.get("file", "")), "engine")
        problems = manifest.problems()
        if problems:
            raise ModelError(f"{path}: the manifest does not hold together ({'; '.join(problems)}); "
                             "re-run `edgecap export`")
        return manifest

    def problems(self) -> list[str]:
        """What contradicts itself in the manifest: the vocabulary against the step's outputs, ``topk`` against its
        candidates, the encoder's input against the preprocessing, state without its update, graphs unrecorded."""
        outputs = {t.name: t for t in self.step_outputs}
        out = []
        for what, parse, data in (("vocabulary", Vocab.from_json, self.vocab),
                                  ("preprocessing", Preprocessing.from_json, self.preprocessing)):
            try:
                parse(data)
            except (KeyError, TypeError, ValueError) as err:
                out.append(f"its {what} cannot be read ({type(err).__name__}: {err})")
        if len(set(self.vocab.get("words", ()))) != len(self.vocab.get("words", ())):
            out.append("its vocabulary repeats a word")
        words = len(self.vocab.get("words", ()))
        logprobs = outputs.get("logprobs")
        if logprobs is None or tuple(logprobs.shape[1:]) != (words,):
            out.append(f"the vocabulary has {words} words but the step's logprobs are {logprobs and logprobs.shape}")
        for name in ("topk_logprobs", "topk_ids"):
            if name not in outputs or tuple(outputs[name].shape[1:]) != (self.topk,):
                out.append(f"topk is {self.topk} but {name} is {outputs[name].shape if name in outputs else 'missing'}")
        side = self.preprocessing.get("image_size")
        pixels = next((t for t in self.encoder_inputs if t.name == "pixels"), None)
        if pixels is None or tuple(pixels.shape[1:]) != (3, side, side):
            out.append(f"preprocessing resizes to {side} px but the encoder takes {pixels and pixels.shape}")
        states = {t.name for t in self.step_inputs if t.role == "state"}
        if states != set(self.state_pairs) or not set(self.state_pairs.values()) <= set(outputs):
            out.append(f"state {sorted(states)} is not updated by the outputs {sorted(self.state_pairs.values())}")
        unrecorded = sorted({f for files in self.graphs.values() for f in files.values()} - set(self.files))
        if unrecorded or any(set(files) != {"encoder", "step"} for files in self.graphs.values()):
            out.append(f"graph files without a recorded sha256 or a graph of each kind ({', '.join(unrecorded)})")
        return out

    def graph_files(self, directory: Path, precision: str) -> tuple[Path, Path]:
        """(encoder, step) ONNX files of one precision, checked to lie inside ``directory``, to exist and to be the
        files the manifest recorded (sha256)."""
        if precision not in self.graphs:
            raise ModelError(f"{directory}: no {precision} graphs (exported: {', '.join(self.graphs)}); "
                             f"re-run `edgecap export --precision {precision}`")
        files = tuple(contained(directory, self.graphs[precision][graph], "graph") for graph in ("encoder", "step"))
        for name, file in zip((self.graphs[precision][g] for g in ("encoder", "step")), files, strict=True):
            if not file.is_file():
                raise ModelError(f"{file}: missing from the export directory; re-run `edgecap export`")
            if file_sha256(file) != self.files.get(name):
                raise ModelError(f"{file}: not the graph this export wrote (its sha256 differs from the manifest's); "
                                 "re-run `edgecap export`")
        return files

    def stored_precision(self, precision: str, graph: str) -> str:
        """The precision ``graph``'s file in the ``precision`` set is stored in: the set's own, except a graph that
        INT8 export left unquantised, which is the fp16 (or fp32) file."""
        file = self.graphs[precision][graph]
        return next((p for p in ("fp32", "fp16", "int8") if self.graphs.get(p, {}).get(graph) == file), precision)

    @property
    def int8_refused(self) -> bool:
        """INT8 calibration ran, its set failed the gate's rule on the held-out photos, and was not written."""
        return self.quantization is not None and self.quantization.verdict == "fail" and "int8" not in self.graphs

    def int8_heldout_ids(self, dataset_name: str) -> frozenset[str]:
        """Ids of ``dataset_name``'s photos on which INT8 calibration chose the layers kept fp32; empty when it
        scored another dataset's photos (or predates recording them)."""
        q = self.quantization
        return frozenset(q.heldout_image_ids) if q is not None and q.calibration_data == dataset_name else frozenset()


def _mistyped(data: dict) -> list[str]:
    """The manifest's fields that are missing or not of their declared JSON type (the typed schema is ``Manifest``
    itself): every problem in one list, so one message names them all."""
    hints = typing.get_type_hints(Manifest)
    json_types = {int: int, str: str, dict: dict, tuple: list, Int8Report: dict, type(None): type(None)}
    out = []
    for f in fields(Manifest):
        declared = hints[f.name]
        allowed = tuple(json_types[typing.get_origin(t) or t] for t in (typing.get_args(declared)
                        if typing.get_origin(declared) in (typing.Union, types.UnionType) else (declared,)))
        if f.name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                out.append(f"{f.name} missing")
        elif not isinstance(data[f.name], allowed) or isinstance(data[f.name], bool) and bool not in allowed:
            out.append(f"{f.name} is {type(data[f.name]).__name__}")
    nested = {"graphs": lambda g: all(isinstance(v, dict) and all(isinstance(n, str) for n in v.values())
                                      for v in g.values()),
              "state_pairs": lambda s: all(isinstance(v, str) for v in s.values()),
              "files": lambda s: all(isinstance(v, str) for v in s.values()),
              "engines": lambda e: all(isinstance(v, dict) for v in e.values()),
              "vocab": lambda v: isinstance(v.get("words"), list) and all(isinstance(w, str) for w in v["words"])}
    out += [f"{name} holds values of the wrong type" for name, check in nested.items()
            if isinstance(data.get(name), dict) and not check(data[name])]
    out += [f"{name} holds a tensor that is not a name, dtype, shape and role" for name in
            ("encoder_inputs", "encoder_outputs", "step_inputs", "step_outputs") if isinstance(data.get(name), list)
            and not all(isinstance(t, dict) and {"name", "dtype", "shape", "role"} <= t.keys() for t in data[name])]
    return out


def contained(directory: Path, name: str, what: str) -> Path:
    """``directory / name``, refused in one line when it resolves (through ``..``, an absolute path or a symbolic
    link) outside ``directory``: a manifest names files of its own export and nothing else."""
    path = Path(directory) / name
    base = Path(directory).resolve()
    resolved = path.resolve()
    if resolved == base or not resolved.is_relative_to(base):
        raise ModelError(f"{Path(directory) / MANIFEST_NAME}: {what} {name!r} lies outside the export directory; "
                         "re-run `edgecap export` (a manifest names files of its own export only)")
    return path


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks: the digests manifests record for checkpoints and graphs."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
