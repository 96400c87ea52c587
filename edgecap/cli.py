"""The ``edgecap`` command line: one thin typer command per stage, each calling a library function."""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from edgecap.errors import EdgecapError, ImageError

if TYPE_CHECKING:
    from edgecap.runtime.pipeline import Captioner
    from edgecap.runtime.search import SearchOptions

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Image captioning from PyTorch training to fast, verified inference.")


class ModelId(str, Enum):
    sat = "sat"
    spca = "spca"
    stackcap = "stackcap"
    a2 = "a2"
    glied = "glied"


class PresetName(str, Enum):
    tiny = "tiny"
    base = "base"


class Backend(str, Enum):
    torch = "torch"
    ort = "ort"
    trt = "trt"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"
    tensorrt = "tensorrt"


class Precision(str, Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    int8 = "int8"


class CalibMethod(str, Enum):
    max = "max"
    entropy = "entropy"
    percentile = "percentile"


class Graph(str, Enum):
    encoder = "encoder"
    step = "step"


class Split(str, Enum):
    train = "train"
    dev = "dev"
    test = "test"


class Int8Scheme(str, Enum):
    tensorrt = "tensorrt"
    ort_cpu = "ort-cpu"


def parse_list(value: str, allowed: type[Enum], option: str) -> list[str]:
    """A comma-separated option such as ``fp32,int8``, checked against the allowed values."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    known = [member.value for member in allowed]
    bad = [item for item in items if item not in known]
    if bad or not items:
        raise EdgecapError(f"{option} {value!r}: expected a comma-separated list of {', '.join(known)}")
    return list(dict.fromkeys(items))


ModelDir = Annotated[Path | None, typer.Option("--model", help="Run directory, checkpoint or export directory "
                                                           "(default: shipped model)")]
Beam = Annotated[int, typer.Option(help="Beam size (1 = greedy)", min=1)]
LengthPenalty = Annotated[float, typer.Option(help="Rank finished captions by log-prob / length**ALPHA "
                                                   "(0: the raw sum, which favours short captions)", min=0.0)]
BlockTrigrams = Annotated[bool, typer.Option("--block-trigrams", help="Never repeat a trigram within a caption")]


def _search_options(beam: int, length_penalty: float, block_trigrams: bool) -> SearchOptions:
    """The beam search settings eval, caption and parity share."""
    from edgecap.runtime.search import SearchOptions

    return SearchOptions(beam_size=beam, length_penalty=length_penalty, block_trigrams=block_trigrams)


@app.command()
def train(
    model: Annotated[ModelId, typer.Option(help="Architecture to train")] = ModelId.sat,
    data: Annotated[str, typer.Option(help="Dataset spec: flickr8k:DIR, karpathy:FILE.json[:ROOT], coco:DIR, shapes")]
    = "shapes",
    out: Annotated[Path, typer.Option(help="Run directory")] = Path("runs/sat"),
    preset: Annotated[PresetName, typer.Option(help="Configuration size")] = PresetName.base,
    max_steps: Annotated[int, typer.Option(help="Stop cross-entropy after N optimiser steps (0: no limit)")] = 0,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its config.json; --set, --scst-epochs "
                                              "and --max-steps may change how long it goes on")] = False,
    finetune_encoder: Annotated[bool, typer.Option(help="Train the encoder too (GPU; see train.encoder_lr)")] = False,
    scst_epochs: Annotated[int | None, typer.Option(help="Self-critical epochs after cross-entropy")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override SECTION.FIELD=VALUE (train/model/encoder)")]
    = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Feature cache folder (default $EDGECAP_CACHE)")] = None,
    nproc: Annotated[int, typer.Option(help="Data-parallel processes on this machine, one GPU each (CPU: gloo); "
                                            "they split each global batch of train.batch_size, and --max-steps "
                                            "counts global steps")] = 1,
) -> None:
    """Train a captioner: cross-entropy, then self-critical CIDEr-D training."""
    from edgecap.training.loop import train as run_training
    from edgecap.training.runs import resolve_run

    overrides = list(set_ or [])
    overrides += [f"train.max_steps={max_steps}"] if max_steps else []
    overrides += ["encoder.finetune=true"] if finetune_encoder else []
    overrides += [f"train.scst_epochs={scst_epochs}"] if scst_epochs is not None else []
    spec = None if resume else resolve_run(model.value, data, preset.value, overrides)
    result = run_training(run_dir=out, spec=spec, resume=resume, changes=overrides if resume else (),
                          cache_dir=cache_dir, nproc=nproc)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one summary rather than one per rank
        typer.echo(f"best dev CIDEr-D {result['best_dev_cider']:.2f} after {result['steps']} steps; "
                   f"model: {out / 'best.pt'}")


def _open_export(directory: Path | None, backend: Backend, precision: Precision, device: Device) -> Captioner:
    """The torch-free captioner of an export directory, after saying in one line what this machine lacks."""
    from edgecap.runtime.pipeline import Captioner

    if backend is Backend.trt:
        from edgecap.runtime.backends.trt_cuda import require_tensorrt

        require_tensorrt()  # before anything is read
    if directory is None:
        raise EdgecapError(f"--backend {backend.value} needs an export directory (made by `edgecap export`)")
    return Captioner.from_dir(directory, backend=backend.value, precision=precision.value, device=device.value)


def _is_export(path: Path | None) -> bool:
    from edgecap.runtime.manifest import MANIFEST_NAME

    return path is not None and (path / MANIFEST_NAME).is_file()


def _backend_for(model: Path | None, backend: Backend | None, precision: Precision) -> Backend:
    """What runs ``model`` when ``--backend`` may be left out: ort for an export directory, torch for a run, a
    checkpoint or the shipped default; a flag that only an export can honour is refused for torch."""
    export = _is_export(model)
    backend = backend or (Backend.ort if export else Backend.torch)
    if export and backend is Backend.torch:
        raise EdgecapError(f"{model} is an export directory: run it with --backend ort or trt, or pass the run "
                           "it came from for torch")
    if backend is Backend.torch and precision is not Precision.fp32:
        raise EdgecapError(f"--precision {precision.value} picks an export's graphs; export the run first "
                           "(`edgecap export RUN --out DIR --precision ...`) and pass DIR")
    return backend


@app.command("eval")
def evaluate(
    data: Annotated[str, typer.Option(help="Dataset spec: flickr8k:DIR, karpathy:FILE.json[:ROOT], coco:DIR, shapes")],
    run: Annotated[Path | None, typer.Argument(help="Run directory, checkpoint or export directory "
                                                    "(default: shipped model)")] = None,
    split: Annotated[str, typer.Option(help="Split to score")] = "dev",
    backend: Annotated[Backend | None, typer.Option(help="torch for a run or checkpoint; ort (default) or trt for "
                                                         "an export directory, which needs no torch")] = None,
    precision: Annotated[Precision, typer.Option(help="Graph precision (export directory)")] = Precision.fp32,
    device: Annotated[Device, typer.Option(help="ONNX Runtime execution provider (ort backend)")] = Device.cpu,
    beam: Beam = 3,
    length_penalty: LengthPenalty = 0.0,
    block_trigrams: BlockTrigrams = False,
    max_images: Annotated[int, typer.Option(help="Score only the first N images (0: all)")] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write metrics and captions as JSON")] = None,
) -> None:
    """Score a model's beam-search captions with BLEU, METEOR, ROUGE-L and CIDEr-D."""
    from edgecap.data import load_dataset
    from edgecap.report import eval_json, eval_table, write_json

    options = _search_options(beam, length_penalty, block_trigrams)
    backend = _backend_for(run, backend, precision)
    captioner = _open_export(run, backend, precision, device) if backend is not Backend.torch else None
    if captioner is not None:
        from edgecap.runtime.pipeline import check_options

        check_options(captioner.manifest, options, run)  # before the data is read and Java starts
    dataset = load_dataset(data)
    records = dataset.split(split)
    records = records[:max_images] if max_images else records
    if captioner is not None and precision is Precision.int8:
        heldout = captioner.manifest.int8_heldout_ids(dataset.name)
        chosen = sum(r.image_id in heldout for r in records)
        if chosen:
            typer.echo(f"note: {chosen} of these {len(records)} photos chose which INT8 layers stay fp32 "
                       "(calibration's held-out photos); `edgecap parity --precision int8` leaves them out")
    from edgecap.evaluation import Evaluator, evaluate_captioner  # after the arguments: it needs pycocoevalcap

    with Evaluator() as evaluator:
        if captioner is not None:
            result = evaluate_captioner(captioner, records, options, evaluator=evaluator,
                                        backend=backend.value, precision=precision.value)
        else:
            from edgecap.checkpoint import load_model
            from edgecap.torch_backend import evaluate_model

            result = evaluate_model(load_model(run), records, options, evaluator=evaluator)
    typer.echo(eval_table(result))
    for metric, reason in result.scores.skipped.items():
        typer.echo(f"{metric} skipped: {reason}")
    if json_out:
        write_json(eval_json(result), json_out)


@app.command()
def caption(
    images: Annotated[list[Path], typer.Argument(help="Image files, or folders of them")],
    model: ModelDir = None,
    backend: Annotated[Backend | None, typer.Option(help="torch for a run or checkpoint; ort (default) or trt for "
                                                         "an export directory, which needs no torch")] = None,
    precision: Annotated[Precision, typer.Option(help="Graph precision (ort and trt backends)")] = Precision.fp32,
    device: Annotated[Device, typer.Option(help="ONNX Runtime execution provider (ort backend)")] = Device.cpu,
    beam: Beam = 3,
    length_penalty: LengthPenalty = 0.0,
    block_trigrams: BlockTrigrams = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object per image")] = False,
    attention: Annotated[Path | None, typer.Option(help="Write attention maps as PNG (one file per image)")] = None,
) -> None:
    """Print one caption per image as it is ready (torch: a checkpoint; ort, trt: an export directory, no torch).

    An unreadable image gets its one-line error on stderr and the others their captions; the exit status is 2
    if any image failed.
    """
    from edgecap.preprocess import image_files, read_rgb
    from edgecap.report import attention_png, caption_json, require_plotting

    options = _search_options(beam, length_penalty, block_trigrams)
    if attention:
        require_plotting()
    backend = _backend_for(model, backend, precision)
    paths = image_files(images)
    if backend in (Backend.ort, Backend.trt):
        caption_batch = partial(_open_export(model, backend, precision, device).caption, options=options)
    else:
        from edgecap.checkpoint import load_model
        from edgecap.torch_backend import caption_images

        caption_batch = partial(caption_images, load_model(model), options=options)
    failed = 0
    for i, result in enumerate(_caption_each(paths, caption_batch)):
        if isinstance(result, ImageError):
            typer.echo(f"error: {result}", err=True)
            failed += 1
            continue
        typer.echo(json.dumps(caption_json(result)) if json_output else f"{result.image}: {result.text}")
        if attention:
            target = attention if len(paths) == 1 else attention.with_stem(f"{attention.stem}-{i}")
            attention_png(result, read_rgb(result.image), target)
    if failed:
        raise typer.Exit(2)


def _caption_each(paths: list[Path], caption_batch, batch_size: int = 16):
    """Captions of ``paths`` in order, 16 at a time; an unreadable file yields its ImageError in its place.

    A batch holding an unreadable file is captioned again one file at a time, so one bad photo among many
    costs the others nothing but a second decode.
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


@app.command("export")
def export_model(
    run: Annotated[Path | None, typer.Argument(help="Run directory or checkpoint (default: shipped model)")] = None,
    out: Annotated[Path, typer.Option(help="Export directory")] = Path("exports/default"),
    beam: Annotated[int, typer.Option(help="Largest beam the runtime will use (step returns 2*beam candidates)",
                                      min=1)] = 3,
    precision: Annotated[str, typer.Option(help="Graphs to write, comma-separated: fp32,fp16,int8")] = "fp32",
    calib_data: Annotated[str | None, typer.Option(help="INT8: dataset spec; its train split gives the ranges")]
    = None,
    calib_images: Annotated[int, typer.Option(help="INT8: photos for the ranges", min=1)] = 200,
    calib_heldout: Annotated[int, typer.Option(help="INT8: other photos scoring ΔCIDEr per fp32 layer", min=1)] = 300,
    calib_heldout_split: Annotated[Split, typer.Option(help="INT8: split the held-out photos come from (parity "
                                                           "--precision int8 leaves them out)")] = Split.dev,
    calib_method: Annotated[CalibMethod, typer.Option(help="INT8: range selection")] = CalibMethod.max,
    calib_max_delta: Annotated[float, typer.Option(help="INT8: |ΔCIDEr| allowed before layers are kept fp32")] = 1.0,
    int8_scheme: Annotated[Int8Scheme, typer.Option(help="INT8: tensorrt (symmetric, what TensorRT builds) or "
                                                         "ort-cpu (uint8 activations, fast on x86 ONNX Runtime)")]
    = Int8Scheme.tensorrt,
    int8_graphs: Annotated[str, typer.Option(help="INT8: graphs to quantise, comma-separated: encoder,step; one "
                                                  "left out runs fp16 (fp32 if not exported) in the int8 set")]
    = "encoder,step",
    calib_bias_correction: Annotated[bool, typer.Option(
        "--calib-bias-correction", help="INT8: take the mean INT8 error of each layer's outputs out of its bias "
                                        "(slower export; less drift through deep encoders)")] = False,
    trt: Annotated[bool, typer.Option("--trt", help="Also build TensorRT engines of these precisions (NVIDIA GPU); "
                                                    "with an export directory as RUN: engines only, no torch")]
    = False,
    max_batch: Annotated[int, typer.Option(help="TensorRT: most images per caption call", min=1)] = 32,
    opt_batch: Annotated[int, typer.Option(help="TensorRT: images per call the engines are tuned for", min=1)] = 1,
) -> None:
    """Export the encoder and single-step decoder to ONNX, validated against PyTorch; --trt builds engines."""
    precisions = parse_list(precision, Precision, "--precision")
    quantize = parse_list(int8_graphs, Graph, "--int8-graphs")
    if trt:
        from edgecap.runtime.backends.trt_cuda import require_tensorrt
        from edgecap.runtime.engines import EngineOptions
        from edgecap.runtime.manifest import MANIFEST_NAME, Manifest

        engine_options = EngineOptions(max_batch=max_batch, opt_batch=opt_batch, beam=beam)
        if run is not None and (run / MANIFEST_NAME).is_file():  # graphs made elsewhere, e.g. for a Jetson
            _build_trt(run, Manifest.read(run), precisions, engine_options)
            return
        require_tensorrt()  # say what this machine lacks before a long export
    from edgecap.checkpoint import load_model
    from edgecap.export.onnx import export_onnx
    from edgecap.export.precision import add_fp16
    from edgecap.preprocess import SAMPLE_IMAGES, load_images

    calibration = None
    if "int8" in precisions:
        if calib_data is None:
            raise EdgecapError("--precision int8 needs --calib-data SPEC (real photos to calibrate on), "
                               "e.g. --calib-data flickr8k:DIR")
        from edgecap.calib.build import require_calibration_splits
        from edgecap.data import load_dataset

        calibration = load_dataset(calib_data)
        require_calibration_splits(calibration, calib_heldout_split.value)  # before a long export, not after
    loaded = load_model(run)
    pixels = load_images(sorted(SAMPLE_IMAGES.glob("*.jpg")), loaded.prep)
    manifest = export_onnx(loaded, out, real_pixels=pixels, k=2 * beam)
    if "fp16" in precisions:
        manifest = add_fp16(out, manifest)
    if calibration is not None:
        from edgecap.calib.build import add_int8

        manifest = add_int8(out, manifest, calibration, method=calib_method.value, scheme=int8_scheme.value,
                            calibration_images=calib_images, heldout_images=calib_heldout,
                            heldout_split=calib_heldout_split.value,
                            threshold=calib_max_delta, quantize=quantize, bias_correction=calib_bias_correction)
        for line in _int8_summary(manifest.quantization, out):
            typer.echo(line)
    typer.echo(f"exported {manifest.model_id} to {out} ({', '.join(manifest.graphs)})")
    if trt:
        _build_trt(out, manifest, precisions, engine_options)


def _int8_summary(q: dict, directory: Path) -> list[str]:
    """What calibration measured, per graph; a warning naming the next options when it missed its threshold, and a
    note when its estimate is too noisy to say whether it met it."""
    from edgecap.runtime.engines import GRAPHS

    graphs = []
    for graph in GRAPHS:
        g = q[graph]
        graphs.append(f"{graph} {g['ort_cpu_speedup']:.2f}x ORT CPU, {len(g['kept_fp32'])} layers kept fp32"
                      if g["quantized"] else f"{graph} not quantised ({g['file']})")
    corrected = ", bias-corrected" if q.get("bias_correction") else ""  # manifests before the option lack it
    lines = [f"int8 ({q['scheme']}, {q['method']}{corrected}): ΔCIDEr {q['delta_cider']:+.2f} "
             f"± {q['delta_cider_se']:.2f} on {q['heldout_images']} held-out {q['heldout_split']} photos; "
             f"{'; '.join(graphs)}"]
    half_width = 1.96 * q["delta_cider_se"]  # of the normal 95% interval: the manifest keeps the mean and its SE
    if not q["threshold_met"]:
        hints = ["more --calib-images"]
        if q["method"] == "max":
            hints.append("--calib-method entropy (it passed Stack-Captioning's gate where max failed)")
        if q["encoder"]["quantized"] and q["step"]["quantized"]:
            hints.append("--int8-graphs step (an INT8 step beside the fp16 encoder; "
                         "benchmarks/int8_by_graph.py shows which graph costs the captions)")
        and_biases = " and biases corrected" if q.get("bias_correction") else ""
        lines.append(f"warning: int8 |ΔCIDEr| is above --calib-max-delta {q['threshold']} even with "
                     f"{q['layers_tried']} layers kept fp32{and_biases}; expect `edgecap parity --precision int8` "
                     f"to fail. Try {', or '.join(hints)}.")
    elif half_width > q["threshold"]:
        lines.append(f"note: the 95% interval of that ΔCIDEr (± {half_width:.2f}) is wider than "
                     f"--calib-max-delta {q['threshold']}, so {q['heldout_images']} held-out photos cannot tell a "
                     f"passing INT8 export from a failing one; gate it with `edgecap parity {directory} --data SPEC "
                     "--precision int8`, on photos calibration never scored.")
    return lines


def _build_trt(directory: Path, manifest, precisions: list[str], options) -> None:
    from edgecap.export.trt import build_engines

    for engine in build_engines(directory, manifest, precisions, options)[1]:
        record, rows = engine.record, engine.record.profile
        how = "cached" if engine.reused else f"built in {engine.seconds:.0f} s"
        typer.echo(f"TensorRT {record.precision} {record.graph}: {directory / record.file} ({how}; rows "
                   f"{rows.min}-{rows.max}, tuned for {rows.opt})")


@app.command()
def parity(
    export_dir: Annotated[Path, typer.Argument(help="Export directory made by `edgecap export`")],
    data: Annotated[str, typer.Option(help="Dataset spec: flickr8k:DIR, karpathy:FILE.json[:ROOT], coco:DIR, shapes")],
    split: Annotated[str, typer.Option(help="Held-out split to compare on")] = "dev",
    backend: Annotated[str, typer.Option(help="Candidate backend: ort or trt")] = "ort",
    precision: Annotated[Precision, typer.Option(help="Candidate graph precision")] = Precision.fp32,
    beam: Beam = 3,
    length_penalty: LengthPenalty = 0.0,
    block_trigrams: BlockTrigrams = False,
    max_images: Annotated[int, typer.Option(help="Compare only the first N images (0: all)")] = 0,
    reference: Annotated[Path | None, typer.Option(help="Checkpoint the export came from (default: as recorded)")]
    = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here")] = None,
    markdown_out: Annotated[Path | None, typer.Option("--markdown", help="Also write the Markdown report here")] = None,
) -> None:
    """Gate an export: same beam search, PyTorch vs the exported graphs; exit 1 when a threshold fails."""
    from edgecap.data import load_dataset

    if backend not in ("ort", "trt"):
        raise EdgecapError(f"--backend {backend}: parity compares PyTorch with 'ort' or 'trt'")
    if backend == "trt":
        from edgecap.runtime.backends.trt_cuda import require_tensorrt

        require_tensorrt()  # before the reference model and the data are loaded
    dataset = load_dataset(data)
    records = dataset.split(split)
    records = records[:max_images] if max_images else records
    from edgecap.evaluation import Evaluator  # after the arguments and the data: scoring needs pycocoevalcap
    from edgecap.parity import run_parity
    from edgecap.report import parity_json, parity_markdown, write_json, write_text

    with Evaluator(spice=False) as evaluator:
        result = run_parity(export_dir, records, split=split, backend=backend, precision=precision.value,
                            options=_search_options(beam, length_penalty, block_trigrams),
                            reference_path=reference, evaluator=evaluator, data_name=dataset.name)
    report, text = parity_json(result), parity_markdown(result)
    typer.echo(text)
    stem = export_dir / "reports" / f"parity-{backend}-{precision.value}"
    for path in (stem.with_suffix(".json"), json_out):
        if path:
            write_json(report, path)
    for path in (stem.with_suffix(".md"), markdown_out):
        if path:
            write_text(text, path)
    if not result.passed:
        raise typer.Exit(1)


def parse_ints(value: str, option: str) -> list[int]:
    """A comma-separated list of positive integers such as ``1,4``."""
    try:
        items = [int(item) for item in value.split(",") if item.strip()]
    except ValueError:
        items = []
    if not items or min(items) < 1:
        raise EdgecapError(f"{option} {value!r}: expected a comma-separated list of positive integers, e.g. 1,4")
    return list(dict.fromkeys(items))


@app.command()
def bench(
    export_dir: Annotated[Path | None, typer.Argument(help="Export directory made by `edgecap export`")] = None,
    backend: Annotated[str, typer.Option(help="Backends, comma-separated: torch,ort,trt")] = "torch,ort",
    precision: Annotated[str, typer.Option(help="Graph precisions, comma-separated: fp32,fp16,int8")] = "fp32",
    batch: Annotated[str, typer.Option(help="Images per caption call, comma-separated")] = "1",
    beam: Annotated[str, typer.Option(help="Beam sizes, comma-separated")] = "3",
    runs: Annotated[int, typer.Option(help="Timed runs per configuration", min=1)] = 50,
    warmup: Annotated[int, typer.Option(help="Untimed runs per configuration before timing", min=0)] = 5,
    threads: Annotated[int, typer.Option(help="Intra-op threads, torch and ONNX Runtime alike", min=1)] = 1,
    images: Annotated[Path | None, typer.Option(help="Folder of photos (default: the shipped samples)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here")] = None,
    markdown_out: Annotated[Path | None, typer.Option("--markdown", help="Also write the Markdown report here")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG chart of the timings")] = None,
) -> None:
    """Time encoder, step and whole caption per backend/precision/batch/beam, side by side with PyTorch eager."""
    from edgecap.benchmarking import BenchPlan, run_bench
    from edgecap.report import bench_json, bench_markdown, bench_plot, require_plotting, write_json, write_text

    if export_dir is None:
        raise EdgecapError("bench needs EXPORT_DIR, an export directory made by `edgecap export`")
    if plot:
        require_plotting()
    plan = BenchPlan(backends=tuple(parse_list(backend, Backend, "--backend")),
                     precisions=tuple(parse_list(precision, Precision, "--precision")),
                     batches=tuple(parse_ints(batch, "--batch")), beams=tuple(parse_ints(beam, "--beam")),
                     runs=runs, warmup=warmup, threads=threads, images=images)
    report = run_bench(export_dir, plan)
    data, text = bench_json(report), bench_markdown(report)
    typer.echo(text)
    for path in (export_dir / "reports" / "bench.json", json_out):
        if path:
            write_json(data, path)
    for path in (export_dir / "reports" / "bench.md", markdown_out):
        if path:
            write_text(text, path)
    if plot:
        bench_plot(report, plot)


# The optional packages a command imports when it needs them, and the extra that installs each.
EXTRA_OF_PACKAGE = {"torch": "train", "matplotlib": "plots", "onnx": "export", "onnxscript": "export",
                    "onnxruntime": "runtime"}


def missing_package_message(err: ModuleNotFoundError) -> str | None:
    """One line naming the extra that installs a missing optional package; None for any other missing module."""
    package = (err.name or "").partition(".")[0]
    extra = EXTRA_OF_PACKAGE.get(package)
    if extra is None:
        return None
    message = f"this command needs {package}, which is not installed: pip install 'edgecap[{extra}]'"
    if package == "torch":
        message += ("; without it, an export directory (made by `edgecap export` where torch is) still runs: "
                    "`edgecap caption IMG --model DIR`, `edgecap eval DIR`, `edgecap bench DIR --backend ort`")
    return message


def main() -> None:
    """Entry point: user errors, and an optional package this install lacks, become one line on stderr and exit
    status 2 (``--debug`` keeps the traceback)."""
    debug = "--debug" in sys.argv
    if debug:
        sys.argv.remove("--debug")
    try:
        app()
    except EdgecapError as err:
        if debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except ModuleNotFoundError as err:
        message = missing_package_message(err)
        if debug or message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
