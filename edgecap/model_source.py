"""What a ``--model`` or RUN path names, and what runs it: an export directory on ONNX Runtime or TensorRT (no
torch), a run directory or checkpoint on PyTorch, nothing for the shipped default. ``caption`` and ``eval`` both
start here, so they take the same paths and refuse the same mistakes."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgecap.errors import EdgecapError, ImageError

if TYPE_CHECKING:
    from edgecap.evaluation import EvalResult
    from edgecap.runtime.pipeline import Caption, Captioner
    from edgecap.runtime.search import SearchOptions

BACKENDS = ("torch", "ort", "openvino", "trt")  # torch: the PyTorch reference; the others run an export's graphs
DEVICES = ("cpu", "cuda", "tensorrt", "gpu", "npu", "auto")  # ONNX Runtime providers (cpu, cuda, tensorrt) and
# OpenVINO devices (cpu, gpu, npu, auto)


def _has_onnxruntime() -> bool:
    try:
        return importlib.util.find_spec("onnxruntime") is not None
    except ImportError:  # a finder that refuses the name outright
        return False


def target_precision(path: Path | None) -> str:
    """The precision ``export --target`` chose for the export at ``path``; fp32 for any other model."""
    if not is_export(path):
        return "fp32"
    from edgecap.runtime.manifest import Manifest

    return Manifest.read(Path(path)).default_precision


def is_export(path: Path | None) -> bool:
    from edgecap.runtime.manifest import MANIFEST_NAME

    return path is not None and (Path(path) / MANIFEST_NAME).is_file()


def describe(path: Path | None) -> str:
    """How a report names the model: the path, or the shipped default's file."""
    from edgecap.config import DEFAULT_EXPORT, DEFAULT_MODEL
    from edgecap.shipped import DEFAULT_ID, shipped_id

    if path is not None and Path(path) == DEFAULT_EXPORT:
        return f"the shipped default's export ({DEFAULT_EXPORT})"
    architecture = shipped_id(path)
    if path is not None and architecture not in (None, DEFAULT_ID):
        return f"the shipped {architecture} model ({path})"
    if path is not None:
        return str(path)

    return f"the shipped default ({DEFAULT_MODEL})"


def backend_for(path: Path | None, backend: str | None, precision: str) -> str:
    """What runs ``path`` when ``--backend`` may be left out: ort for an export directory, torch for a run, a
    checkpoint or the shipped default; a flag that only an export can honour is refused for torch."""
    export = is_export(path)
    backend = backend or ("ort" if export else "torch")
    if export and backend == "torch":
        raise EdgecapError(f"{path} is an export directory: run it with --backend ort, openvino or trt, or pass the "
                           "run it came from for torch")
    if backend == "torch" and precision != "fp32":
        raise EdgecapError(f"--precision {precision} picks an export's graphs; export the run first "
                           "(`edgecap export RUN --out DIR --precision ...`) and pass DIR")
    return backend


def open_export(path: Path | None, backend: str, precision: str, device: str) -> Captioner:
    """The torch-free captioner of an export directory, after saying in one line what this machine lacks."""
    from edgecap.runtime.pipeline import Captioner

    if backend == "trt":
        from edgecap.runtime.backends.trt_cuda import require_tensorrt

        require_tensorrt()  # before anything is read
    if path is None:
        raise EdgecapError(f"--backend {backend} needs an export directory (made by `edgecap export`)")
    return Captioner.from_dir(path, backend=backend, precision=precision, device=device)


@dataclass(frozen=True)
class ModelSource:
    """A model path with the backend and precision that run it."""

    path: Path | None  # None: the shipped default
    backend: str
    precision: str = "fp32"
    device: str = "cpu"

    @classmethod
    def choose(cls, path: Path | None, backend: str | None, precision: str | None,
               device: str = "cpu") -> ModelSource:
        """``precision`` None: what ``export --target`` chose for an export that records one, else fp32."""
        precision = precision or target_precision(path)
        return cls(path, backend_for(path, backend, precision), precision, device)

    @classmethod
    def fastest(cls, path: Path | None, backend: str | None, precision: str | None,
                device: str = "cpu") -> ModelSource:
        """As :meth:`choose`, except that no model means the shipped export on ONNX Runtime, at the precision its
        ``--target cpu`` chose (unless ``--backend torch`` asks for PyTorch, or onnxruntime is not installed)."""
        from edgecap.config import DEFAULT_EXPORT

        if path is None and backend in (None, "ort", "openvino") and is_export(DEFAULT_EXPORT) and _has_onnxruntime():
            return cls.choose(DEFAULT_EXPORT, backend or "ort", precision, device)
        return cls.choose(path, backend, precision, device)

    def load(self, options: SearchOptions):
        """The PyTorch model (a LoadedModel) or the export's Captioner, checked against ``options``."""
        if self.backend == "torch":
            from edgecap.checkpoint import load_model

            return load_model(self.path)
        from edgecap.runtime.pipeline import check_options

        captioner = open_export(self.path, self.backend, self.precision, self.device)
        check_options(captioner.manifest, options, self.path)
        return captioner

    def captioner(self, options: SearchOptions) -> Callable[[Sequence[Path]], list[Caption]]:
        """A function captioning a batch of image files, the model loaded once."""
        model = self.load(options)
        if self.backend == "torch":
            from edgecap.torch_backend import caption_images

            return lambda paths: caption_images(model, paths, options)
        return lambda paths: model.caption(paths, options)


def evaluate(source: ModelSource, data: str, split: str, options: SearchOptions, *, max_images: int = 0,
             say: Callable[[str], None] = print) -> EvalResult:
    """Caption a split with ``source`` and score it with pycocoevalcap; says first what it scores.

    The model, the decoding and the data are checked before the scoring package and Java are needed.
    """
    from edgecap.data import load_dataset
    from edgecap.report import decoding_text

    model = source.load(options)
    dataset = load_dataset(data)
    records = dataset.split(split)[: max_images or None]
    say(f"eval: {describe(source.path)} on {source.backend} {source.precision}, {dataset.name} {split}, "
        f"{len(records)} photos, {decoding_text(options)}")
    if source.precision == "int8":
        chosen = sum(r.image_id in model.manifest.int8_heldout_ids(dataset.name) for r in records)
        if chosen:
            say(f"note: {chosen} of these {len(records)} photos chose which INT8 layers stay fp32 (calibration's "
                "held-out photos); `edgecap parity --precision int8` leaves them out")
    from edgecap.evaluation import Evaluator, evaluate_captioner

    with Evaluator() as evaluator:
        if source.backend == "torch":
            from edgecap.torch_backend import evaluate_model

            return evaluate_model(model, records, options, evaluator=evaluator)
        return evaluate_captioner(model, records, options, evaluator=evaluator, backend=source.backend,
                                  precision=source.precision)


def caption_files(source: ModelSource, paths: Sequence[Path], options: SearchOptions, *,
                  attention: Path | None = None) -> Iterator[tuple[Caption | ImageError, Path | None]]:
    """Each file's caption (or its ImageError) in order, with the PNG of its attention maps written to
    ``attention/STEM.png`` when a folder is given (None otherwise)."""
    from edgecap.report import attention_paths, attention_png, require_plotting

    if attention:
        require_plotting()  # before the model loads, not after the first caption
    maps = attention_paths(paths, attention) if attention else [None] * len(paths)
    for result, target in zip(caption_each(paths, source.captioner(options)), maps, strict=True):
        if target is None or isinstance(result, ImageError):
            yield result, None
            continue
        from edgecap.preprocess import read_rgb

        yield result, attention_png(result, read_rgb(result.image), target)


def caption_each(paths: Sequence[Path], caption_batch: Callable[[Sequence[Path]], list[Caption]], *,
                 batch_size: int = 16) -> Iterator[Caption | ImageError]:
    """Captions of ``paths`` in order, ``batch_size`` at a time; an unreadable file yields its ImageError in its place.

    A batch holding an unreadable file is captioned again one file at a time, so one bad photo among many costs the
    others nothing but a second decode.
    """
    for start in range(0, len(paths), batch_size):
        batch = paths[start:start + batch_size]
        try:
            yield from caption_batch(batch)
        except ImageError:
            for path in batch:
                try:
                    yield from caption_batch([path])
                except ImageError as err:
                    yield err
