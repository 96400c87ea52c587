"""The flags several ``edgecap`` commands share, and their parsing into the library's options (one place, so a
flag means the same in every command). Choices come from the registries that define them."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from edgecap.calib.options import METHODS, SCHEMES, Int8Options
from edgecap.config import PRESETS
from edgecap.data.records import SPLITS
from edgecap.errors import EdgecapError
from edgecap.model_source import BACKENDS, DEVICES
from edgecap.models import MODELS
from edgecap.runtime.engines import EngineOptions
from edgecap.runtime.manifest import PRECISIONS
from edgecap.runtime.triton_repository import GRAPH_BACKENDS
from edgecap.shipped import model_path

if TYPE_CHECKING:
    from edgecap.runtime.search import SearchOptions


def choices(name: str, values) -> type[Enum]:
    return Enum(name, {value: value for value in values}, type=str)


ModelId, PresetName, Split = choices("ModelId", MODELS), choices("PresetName", PRESETS), choices("Split", SPLITS)
Backend, Device, Precision = choices("Backend", BACKENDS), choices("Device", DEVICES), choices("Prec", PRECISIONS)
CalibMethod, Int8Scheme = choices("CalibMethod", METHODS), choices("Int8Scheme", SCHEMES)
TritonGraphs = choices("TritonGraphs", GRAPH_BACKENDS)
TRITON_ORT = TritonGraphs["onnxruntime"]
INT8, ENGINES = Int8Options(data=""), EngineOptions()

def parse_list(value: str, allowed, option: str) -> tuple[str, ...]:
    """A comma-separated option such as ``fp32,int8``, checked against the allowed values."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    known = [getattr(member, "value", member) for member in allowed]
    if not items or any(item not in known for item in items):
        raise EdgecapError(f"{option} {value!r}: expected a comma-separated list of {', '.join(known)}")
    return tuple(dict.fromkeys(items))


def parse_ints(value: str, option: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers such as ``1,4``."""
    try:
        items = [int(item) for item in value.split(",") if item.strip()]
    except ValueError:
        items = []
    if not items or min(items) < 1:
        raise EdgecapError(f"{option} {value!r}: expected a comma-separated list of positive integers, e.g. 1,4")
    return tuple(dict.fromkeys(items))


Data = Annotated[str, typer.Option(help="Dataset spec: flickr8k:DIR, folder:DIR, karpathy:FILE.json[:ROOT], "
                                        "coco:DIR_OR_JSON[:ROOT], shapes")]
_MODEL_HELP = ("Run directory, checkpoint, export directory, or a shipped architecture: sat (the default), spca, "
               "stackcap, glied, a2 (those this install ships: docs/models.md)")
ModelPath = Annotated[Path | None, typer.Option("--model", help=_MODEL_HELP, callback=model_path)]
RunOrExport = Annotated[Path | None, typer.Argument(help=_MODEL_HELP, callback=model_path, show_default=False)]
ExportDir = Annotated[Path, typer.Argument(help="Export directory made by `edgecap export`")]
ChosenBackend = Annotated[Backend | None, typer.Option(help="torch for a run or checkpoint; ort (default), openvino "
                                                            "or trt for an export directory, which needs no torch")]
ExportPrecision = Annotated[Precision | None, typer.Option(
    help="Graph precision of an export directory (default: what its --target chose, else fp32)")]
OrtDevice = Annotated[Device, typer.Option(help="ONNX Runtime provider (ort: cpu, cuda, tensorrt) or OpenVINO "
                                                 "device (openvino: cpu, gpu, npu, auto)")]
Beam = Annotated[int, typer.Option(help="Beam size (1 = greedy)", min=1)]
LengthPenalty = Annotated[float, typer.Option(help="Rank finished captions by log-prob / length**ALPHA "
                                                   "(0: the raw sum, which favours short captions)", min=0.0)]
BlockTrigrams = Annotated[bool, typer.Option("--block-trigrams", help="Never repeat a trigram within a caption")]
MaxImages = Annotated[int, typer.Option(help="Only the first N photos of the split (0: all)", min=0)]
SearchItems = Annotated[list[str] | None, typer.Option(
    "--search", help="More decoding, FIELD=VALUE, repeatable: n_best=3, sample=true, top_p=0.9, temperature=0.7, "
                     "seed=1, patience=2, ban_words=man+woman, learned_endings=true, ... (docs/parity-and-bench.md)")]
JsonOut = Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here")]
MarkdownOut = Annotated[Path | None, typer.Option("--markdown", help="Also write the Markdown report here")]


def search_flags(beam: int, length_penalty: float, block_trigrams: bool, items: list[str] | None) -> SearchOptions:
    """The decoding flags and ``--search FIELD=VALUE`` items as options; a bad item is one line, not a traceback."""
    from edgecap.runtime.search import SearchOptions

    try:
        return SearchOptions(beam_size=beam, length_penalty=length_penalty,
                             block_trigrams=block_trigrams).overridden(items or [])
    except (TypeError, ValueError) as err:
        raise EdgecapError(f"--search: {err}") from None


def one_model(run: Path | None, model: Path | None) -> Path | None:
    """The model named by a RUN argument or by ``--model``, which mean the same; both at once is refused."""
    if run is not None and model is not None:
        raise EdgecapError(f"two models given ({run} and --model {model}): pass one, as RUN or as --model")
    return run if run is not None else model


def choice_value(choice: Enum | None) -> str | None:
    return None if choice is None else choice.value
