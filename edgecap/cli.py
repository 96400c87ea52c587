"""The ``edgecap`` command line: one thin typer command per stage; each parses its flags and calls the library.

Choices (models, presets, backends, precisions, calibration methods, schemes, graphs) come from the registries
that define them, so a new model or scheme appears here without an edit. Heavy packages are imported inside the
commands that need them, so ``edgecap caption`` runs on an install with the runtime alone.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from edgecap.calib.options import GRAPHS, Int8Options
from edgecap.cli_options import (
    ENGINES,
    INT8,
    TRITON_ORT,
    Beam,
    BlockTrigrams,
    CalibMethod,
    ChosenBackend,
    Data,
    Device,
    ExportDir,
    ExportPrecision,
    Int8Scheme,
    JsonOut,
    LengthPenalty,
    MarkdownOut,
    MaxImages,
    ModelId,
    ModelPath,
    OrtDevice,
    Precision,
    PresetName,
    RunOrExport,
    SearchItems,
    Split,
    TritonGraphs,
    choice_value,
    one_model,
    parse_ints,
    parse_list,
    search_flags,
)
from edgecap.errors import EdgecapError, ImageError
from edgecap.runtime.engines import EngineOptions
from edgecap.runtime.manifest import PRECISIONS
from edgecap.shipped import model_path

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Image captioning from PyTorch training to fast, verified inference. Bad input gets one line "
                       "naming the file and the fix (exit 2); add --debug to any command for the traceback.")


@app.command()
def train(
    model: Annotated[ModelId | None, typer.Option(help="Architecture (default: the preset's, else sat)")] = None,
    data: Data = "shapes",
    out: Annotated[Path, typer.Option(help="Run directory")] = Path("runs/sat"),
    preset: Annotated[PresetName, typer.Option(help="A size for any model (tiny, base) or a measured recipe for one "
                                                    "(see docs/training.md)")] = PresetName.base,
    max_steps: Annotated[int, typer.Option(help="Stop cross-entropy after N optimiser steps (0: no limit)", min=0)] = 0,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its config.json; --set xe.epochs, "
                                              "--scst-epochs and --max-steps may make it go on longer")] = False,
    finetune_encoder: Annotated[bool, typer.Option(help="Train the encoder too (GPU; see optim.encoder_lr)")] = False,
    scst_epochs: Annotated[int | None, typer.Option(help="Self-critical epochs after cross-entropy", min=0)] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override SECTION.FIELD=VALUE; sections: encoder, model, optim, xe, scst, hard, select, "
                      "train")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Feature cache folder (default $EDGECAP_CACHE/features)")]
    = None,
    nproc: Annotated[int, typer.Option(help="Data-parallel processes on this machine, one GPU each (CPU: gloo); "
                                            "they split every global batch")] = 1,
) -> None:
    """Train a captioner: cross-entropy, then self-critical CIDEr-D training."""
    from edgecap.training.loop import train as run_training
    from edgecap.training.runs import resolve_run

    overrides = [*(set_ or []), *([f"xe.max_steps={max_steps}"] if max_steps else []),
                 *(["encoder.finetune=true"] if finetune_encoder else []),
                 *([f"scst.epochs={scst_epochs}"] if scst_epochs is not None else [])]
    spec = None if resume else resolve_run(choice_value(model), data, preset.value, overrides)
    result = run_training(run_dir=out, spec=spec, resume=resume, changes=overrides if resume else (),
                          cache_dir=cache_dir, nproc=nproc)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one summary rather than one per rank
        typer.echo(f"{result['steps']} steps trained; best dev CIDEr-D {result['best_dev_cider']:.2f}, "
                   f"model: {out / 'best.pt'}")


@app.command("eval")
def evaluate(
    data: Data, run: RunOrExport = None, model: ModelPath = None,
    split: Annotated[str, typer.Option(help="Split to score")] = "dev", backend: ChosenBackend = None,
    precision: ExportPrecision = None, device: OrtDevice = Device.cpu,
    beam: Beam = 3, length_penalty: LengthPenalty = 0.0, block_trigrams: BlockTrigrams = False,
    search: SearchItems = None, max_images: MaxImages = 0, json_out: Annotated[Path | None, typer.Option(
        "--json", help="Write the metrics and captions as JSON")] = None,
) -> None:
    """Score a model's captions with BLEU, METEOR, ROUGE-L and CIDEr-D (an export directory needs no torch)."""
    from edgecap.model_source import ModelSource
    from edgecap.model_source import evaluate as run_eval
    from edgecap.report import eval_json, eval_table, write_json

    source = ModelSource.choose(one_model(run, model), choice_value(backend), choice_value(precision), device.value)
    result = run_eval(source, data, split, search_flags(beam, length_penalty, block_trigrams, search),
                      max_images=max_images, say=typer.echo)
    typer.echo(eval_table(result))
    if json_out:
        write_json(eval_json(result), json_out)
        typer.echo(f"report: {json_out}")


@app.command()
def caption(
    images: Annotated[list[str], typer.Argument(help="Image files or folders of them; or one video file, stream URL "
                                                     "(rtsp://, http://...) or camera (/dev/video0)")],
    model: ModelPath = None, backend: ChosenBackend = None, precision: ExportPrecision = None,
    device: OrtDevice = Device.cpu, beam: Beam = 3, length_penalty: LengthPenalty = 0.0,
    block_trigrams: BlockTrigrams = False, search: SearchItems = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object per image")] = False,
    attention: Annotated[Path | None, typer.Option(help="Write each photo's attention maps to DIR/PHOTO.png")] = None,
    every: Annotated[float | None, typer.Option(help="Video: caption a frame every SECONDS (default 1)", min=0.001)]
    = None,
    change_threshold: Annotated[float, typer.Option(help="Video: skip a frame whose difference from the last "
                                                         "captioned one (0-1) is below this", min=0, max=1)] = 0.0,
    srt: Annotated[Path | None, typer.Option(help="Video: also write the captions as SubRip subtitles here")] = None,
    jsonl: Annotated[Path | None, typer.Option(help="Video: also write one JSON object per caption here")] = None,
) -> None:
    """Print each photo's caption as it is ready; an unreadable one gets a one-line error, the others their captions.
    A video, stream or camera gets timestamped captions as it plays.

    The exit status is 2 if any photo could not be read, or the video broke off.
    """
    from edgecap.model_source import ModelSource, caption_files
    from edgecap.preprocess import image_files
    from edgecap.report import caption_json, caption_line
    from edgecap.video import is_video

    source = ModelSource.fastest(model, choice_value(backend), choice_value(precision), device.value)
    options = search_flags(beam, length_penalty, block_trigrams, search)
    if every is not None or any(is_video(i) for i in images):
        if len(images) != 1:
            raise EdgecapError(f"a video is captioned on its own; got {len(images)} inputs: pass one video or stream")
        from edgecap.streams import caption_stream

        raise typer.Exit(caption_stream(source, images[0], options, every or 1.0, change_threshold=change_threshold,
                                        srt=srt, jsonl=jsonl, say=typer.echo, warn=partial(typer.echo, err=True)))
    failed = 0
    for result, maps in caption_files(source, image_files([Path(i) for i in images]), options, attention=attention):
        if isinstance(result, ImageError):
            failed += 1
            typer.echo(f"error: {result}", err=True)
        else:
            typer.echo(json.dumps(caption_json(result, maps)) if json_output else caption_line(result, maps))
    if failed:
        raise typer.Exit(2)


@app.command("export")
def export_model(
    run: Annotated[Path | None, typer.Argument(help="Run directory, checkpoint or shipped architecture (default: the "
                                                    "shipped model); an export directory with --trt: engines only, no "
                                                    "torch", callback=model_path, show_default=False)] = None,
    model: ModelPath = None,
    out: Annotated[Path, typer.Option(help="Export directory")] = Path("exports/default"),
    beam: Annotated[int, typer.Option(help="Largest beam the runtime will use", min=1)] = 3,
    target: Annotated[str | None, typer.Option(help="Pick precisions, INT8 scheme and graphs for a device: cpu "
                                                    "(builds, gates and times candidates, keeps the fastest passing), "
                                                    "gpu or jetson (by rule, for TensorRT)")] = None,
    target_photos: Annotated[int, typer.Option(help="--target cpu: held-out photos each INT8 candidate is gated on "
                                                    "(0: every one calibration did not choose)", min=0)] = 0,
    precision: Annotated[str | None, typer.Option(help="Graphs to write, comma-separated: fp32,fp16,int8 "
                                                       "(default fp32)")] = None,
    calib_data: Annotated[str | None, typer.Option(help="INT8: dataset spec; its train split gives the ranges")]
    = None,
    calib_images: Annotated[int, typer.Option(help="INT8: photos for the ranges", min=1)] = INT8.images,
    calib_heldout: Annotated[int, typer.Option(help="INT8: other photos ΔCIDEr is measured on", min=1)] = INT8.heldout,
    calib_heldout_split: Annotated[Split, typer.Option(help="INT8: split of the held-out photos (parity --precision "
                                                            "int8 leaves them out)")] = Split.dev,
    calib_method: Annotated[CalibMethod, typer.Option(help="INT8: range selection")] = CalibMethod.max,
    calib_max_delta: Annotated[float, typer.Option(help="INT8: the ΔCIDEr margin; layers stay fp32 until its 95% "
                                                        "interval clears -MARGIN")] = INT8.max_delta,
    int8_scheme: Annotated[Int8Scheme | None, typer.Option(help="INT8: tensorrt (symmetric, what TensorRT builds; "
                                                                "default) or ort-cpu (uint8, fast on x86)")] = None,
    int8_graphs: Annotated[str | None, typer.Option(help="INT8: graphs to quantise: encoder,step (default); one left "
                                                         "out runs fp16 (else fp32) in the int8 set")] = None,
    calib_bias_correction: Annotated[bool, typer.Option("--calib-bias-correction", help="INT8: take each layer's mean "
                                                        "INT8 error out of its bias (slower export)")] = False,
    trt: Annotated[bool, typer.Option("--trt", help="Also build TensorRT engines (NVIDIA GPU)")] = False,
    max_batch: Annotated[int, typer.Option(help="TensorRT: most images per caption call", min=1)] = ENGINES.max_batch,
    opt_batch: Annotated[int, typer.Option(help="TensorRT: images per call the engines are tuned for", min=1)]
    = ENGINES.opt_batch,
    triton: Annotated[Path | None, typer.Option(help="Also write a Triton model repository here (serving.md)")] = None,
    triton_graphs: Annotated[TritonGraphs, typer.Option(help="--triton: what runs the graphs")] = TRITON_ORT,
) -> None:
    """Export the encoder and single-step decoder to ONNX, validated against PyTorch (--trt: engines, --triton)."""
    from edgecap.export.pipeline import ExportOptions, export_run
    from edgecap.model_source import is_export
    from edgecap.report import export_lines

    run = one_model(run, model)
    int8 = Int8Options(calib_data, calib_images, calib_heldout, calib_heldout_split.value, calib_method.value,
                       calib_max_delta, choice_value(int8_scheme) or "tensorrt",
                       parse_list(int8_graphs or ",".join(GRAPHS), GRAPHS, "--int8-graphs"), calib_bias_correction,
                       beam=beam) if calib_data else None
    precisions, int8 = export_precisions(precision, target, int8, {
        "--precision": precision, "--int8-scheme": int8_scheme, "--int8-graphs": int8_graphs,
        "--calib-bias-correction": calib_bias_correction or None})
    engines = EngineOptions(max_batch=max_batch, opt_batch=opt_batch, beam=beam) if trt else None
    if is_export(run) and (trt or triton):  # graphs made elsewhere, e.g. on an x86 host for a Jetson
        return add_to_export(run, precisions, engines, triton, triton_graphs.value)
    options = ExportOptions(precisions, beam, int8 if "int8" in precisions else None, engines, target=target,
                            target_photos=target_photos)
    manifest = export_run(run, out, options, say=typer.echo)
    typer.echo("\n".join(export_lines(manifest, out)))
    if manifest.int8_refused:
        raise typer.Exit(1)
    add_to_export(out, precisions, None, triton, triton_graphs.value)


def add_to_export(export_dir: Path, precisions: tuple[str, ...], engines: EngineOptions | None, triton: Path | None,
                  triton_graphs: str) -> None:
    """What --trt and --triton add to an export directory: TensorRT engines built on this GPU, a Triton repository."""
    if engines is not None:
        from edgecap.export.pipeline import add_engines

        add_engines(export_dir, precisions, engines, say=typer.echo)
    if triton is not None:
        from edgecap.runtime.triton_repository import write_repository

        write_repository(export_dir, triton, graphs=triton_graphs)
        typer.echo(f"triton repository: {triton} (models edgecap, edgecap_encoder, edgecap_step; serve it with "
                   f"`tritonserver --model-repository {triton.resolve()}`)")


def export_precisions(precision: str | None, target: str | None, int8: Int8Options | None,
                      given: dict) -> tuple[tuple[str, ...], Int8Options | None]:
    """The graphs to write and the INT8 options: ``--precision`` as given, or what ``--target`` picks (which refuses
    the ``given`` flags it decides itself)."""
    if target is None:
        return parse_list(precision or "fp32", PRECISIONS, "--precision"), int8
    from edgecap.export.target import target_options

    return target_options(target, int8, given)


@app.command()
def parity(
    export_dir: ExportDir, data: Data, split: Annotated[str, typer.Option(help="Held-out split to compare on")] = "dev",
    backend: Annotated[str, typer.Option(help="Candidate backend: ort, openvino or trt")] = "ort",
    precision: Annotated[Precision, typer.Option(help="Candidate graph precision")] = Precision.fp32,
    beam: Beam = 3, length_penalty: LengthPenalty = 0.0, block_trigrams: BlockTrigrams = False,
    search: SearchItems = None, max_images: MaxImages = 0,
    reference: Annotated[Path | None, typer.Option(help="Checkpoint the export came from (default: as recorded)")]
    = None,
    json_out: JsonOut = None, markdown_out: MarkdownOut = None,
) -> None:
    """Gate an export: the same beam search on PyTorch and on the exported graphs; exit 1 when a threshold fails."""
    from edgecap.parity import check_export

    if backend not in ("ort", "openvino", "trt"):
        raise EdgecapError(f"--backend {backend}: parity compares PyTorch with 'ort', 'openvino' or 'trt'")
    result = check_export(export_dir, data, split, backend=backend, precision=precision.value,
                          options=search_flags(beam, length_penalty, block_trigrams, search), reference_path=reference,
                          max_images=max_images, json_out=json_out, markdown_out=markdown_out, say=typer.echo)
    if not result.passed:  # 1: the export fails its gate; 3: too few photos to tell
        raise typer.Exit(1 if result.verdict.outcome == "fail" else 3)


@app.command()
def bench(
    export_dir: ExportDir,
    backend: Annotated[str, typer.Option(help="Backends, comma-separated: torch, torch-compile, ort, openvino, "
                                              "trt")] = "torch,ort",
    precision: Annotated[str, typer.Option(help="Graph precisions, comma-separated: fp32,fp16,int8")] = "fp32",
    batch: Annotated[str, typer.Option(help="Images per caption call, comma-separated")] = "1",
    beam: Annotated[str, typer.Option(help="Beam sizes, comma-separated")] = "3",
    runs: Annotated[int, typer.Option(help="Timed runs per configuration", min=1)] = 50,
    warmup: Annotated[int, typer.Option(help="Untimed runs per configuration before timing", min=0)] = 5,
    threads: Annotated[int, typer.Option(help="Intra-op threads, torch and ONNX Runtime alike", min=1)] = 1,
    images: Annotated[Path | None, typer.Option(help="Folder of photos (default: the shipped samples)")] = None,
    search: SearchItems = None, json_out: JsonOut = None, markdown_out: MarkdownOut = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG chart of the timings")] = None,
) -> None:
    """Time encoder, step and whole caption per backend/precision/batch/beam, side by side with PyTorch eager."""
    from edgecap.benchmarking import BENCH_BACKENDS, BenchPlan, bench_export

    beams = parse_ints(beam, "--beam")
    plan = BenchPlan(backends=parse_list(backend, BENCH_BACKENDS, "--backend"),
                     precisions=parse_list(precision, PRECISIONS, "--precision"), batches=parse_ints(batch, "--batch"),
                     beams=beams, runs=runs, warmup=warmup, threads=threads, images=images,
                     search=search_flags(max(beams), 0.0, False, search))
    bench_export(export_dir, plan, json_out=json_out, markdown_out=markdown_out, plot=plot, say=typer.echo)


@app.command()
def serve(
    export_dir: Annotated[Path | None, typer.Argument(help="Export directory (default: the shipped export)")] = None,
    backend: Annotated[str, typer.Option(help="ort or openvino: backends whose state the scheduler gathers on the "
                                              "host")] = "ort",
    precision: ExportPrecision = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
    batching: Annotated[str, typer.Option(help="inflight: requests join the running step batch; static: whole "
                                               "requests batched (the baseline)")] = "inflight",
    max_batch: Annotated[int, typer.Option(help="Most photos encoded in one call", min=1)] = 32,
    max_rows: Annotated[int, typer.Option(help="Most step rows (photos x beam) in flight", min=1)] = 96,
    max_delay_ms: Annotated[float, typer.Option(help="How long an idle server waits for a second photo", min=0)] = 5,
    queue: Annotated[int, typer.Option(help="Requests waiting to be encoded; one more is answered 503", min=1)] = 256,
    timeout: Annotated[float, typer.Option(help="Seconds a request may take unless it sets deadline_s (504 after)",
                                           min=0.001)] = 30.0,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body in MiB (413 above)", min=0.001)] = 20.0,
) -> None:
    """Serve captions over HTTP (POST /caption, GET /health, GET /metrics) with in-flight batching; SIGTERM drains
    the requests in flight before stopping (docs/serving.md)."""
    from edgecap.config import DEFAULT_EXPORT
    from edgecap.runtime.inflight import SchedulerOptions
    from edgecap.server import ServeOptions
    from edgecap.server import serve as run_server

    scheduler = SchedulerOptions(max_rows=max_rows, max_batch=max_batch, max_delay_ms=max_delay_ms, queue=queue)
    run_server(ServeOptions(export_dir or DEFAULT_EXPORT, backend=backend, precision=choice_value(precision), host=host,
                            port=port, batching=batching, scheduler=scheduler, timeout_s=timeout,
                            max_body_mb=max_body_mb))


@app.command()
def doctor(
    export_dir: Annotated[Path | None, typer.Argument(help="Export directory to check (default: the machine only)")]
    = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the diagnosis as JSON")] = False,
) -> None:
    """What this machine can run: its fingerprint and, for an export, every backend x precision with the reason,
    its files against their recorded sha256 and its TensorRT engines; exit 1 when the export is not healthy."""
    from edgecap.doctor import diagnose
    from edgecap.report import doctor_json, doctor_text

    diagnosis = diagnose(export_dir)
    typer.echo(json.dumps(doctor_json(diagnosis), indent=2) if json_output else doctor_text(diagnosis))
    if not diagnosis.healthy:
        raise typer.Exit(1)


# The optional packages a command imports when it needs them, and the extra that installs each.
EXTRA_OF_PACKAGE = {"torch": "train", "matplotlib": "plots", "onnx": "export", "onnxscript": "export",
                    "onnxruntime": "runtime", "litserve": "serve", "prometheus_client": "serve", "fastapi": "serve",
                    "av": "video"}


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
