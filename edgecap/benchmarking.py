"""``edgecap bench``: time the grid backend x precision x batch x beam of an export, side by side.

Every (backend, precision) runs in a fresh process of its own (``spawn``), for two reasons: torch's and ONNX
Runtime's thread pools never share a process (on a small machine they fight), and the peak
resident memory of each row belongs to that backend alone (the ONNX Runtime processes never import torch).
Both libraries are pinned to the same intra-op thread count, which the report records.

The PyTorch eager reference is the model the export came from (``load_reference``, sha256-checked), behind the
same ``encode(pixels) -> StepSession`` interface and the same beam search as ONNX Runtime, so the ratio between
them is the gain of the exported graphs alone. Timing itself lives in ``edgecap.runtime.timing`` (torch-free).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgecap.errors import DataError, EdgecapError, ModelError
from edgecap.preprocess import SAMPLE_IMAGES, Preprocessing, load_images
from edgecap.runtime.decoding import decode
from edgecap.runtime.flops import graph_flops
from edgecap.runtime.machine import (
    gemm_peak_gflops,
    library_versions,
    machine_info,
    memcopy_bandwidth_gb_s,
    peak_rss_mb,
)
from edgecap.runtime.manifest import Manifest
from edgecap.runtime.search import SearchOptions
from edgecap.runtime.timing import BenchRow, summarize, time_captions, with_speedups
from edgecap.runtime.weight_bytes import ort_weight_bytes
from edgecap.vocab import Vocab

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
DEFAULT_RUNS = 50
DEFAULT_WARMUP = 5
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
TORCH_PRECISIONS = ("fp32",)  # the eager reference runs in the precision it was trained in
TORCH_BACKENDS = ("torch", "torch-compile")  # the checkpoint itself, eager and compiled by inductor
GRAPH_BACKENDS = ("ort", "openvino", "trt")  # the export's graphs
BENCH_BACKENDS = ("torch", "torch-compile", "ort", "openvino", "trt")


@dataclass(frozen=True)
class BenchPlan:
    backends: tuple[str, ...] = ("torch", "ort")  # any of BENCH_BACKENDS; peers not installed are skipped
    precisions: tuple[str, ...] = ("fp32",)  # graph precisions; ones the export lacks are skipped with a note
    batches: tuple[int, ...] = (1,)  # images per caption call
    beams: tuple[int, ...] = (3,)  # beam sizes; ones above the export's top-k / 2 are skipped with a note
    runs: int = DEFAULT_RUNS  # measured runs per row
    warmup: int = DEFAULT_WARMUP  # runs per row before timing starts
    threads: int = 1  # torch.set_num_threads and ORT intra_op_num_threads, both
    images: Path | None = None  # folder of photos repeated to fill a batch (default: the shipped samples)
    search: SearchOptions = SearchOptions()  # decoding of every row; its beam_size is each row's beam

    def __post_init__(self):
        for name in ("backends", "precisions", "batches", "beams"):
            if not getattr(self, name):
                raise EdgecapError(f"bench: no {name} given")
        if min(self.batches) < 1 or min(self.beams) < 1:
            raise EdgecapError(f"bench: batch and beam sizes must be >= 1, got {self.batches} and {self.beams}")
        if self.runs < 1 or self.warmup < 0 or self.threads < 1:
            raise EdgecapError(f"bench: need runs >= 1, warmup >= 0, threads >= 1 "
                               f"(got {self.runs}, {self.warmup}, {self.threads})")


@dataclass(frozen=True)
class BenchReport:
    export_dir: Path
    model_id: str
    machine: dict
    plan: BenchPlan
    rows: list[BenchRow]
    memcopy_gb_s: float
    images: list[str]
    notes: list[str] = field(default_factory=list)
    gemm_peak_gflops: float | None = None  # one-thread-count float32 GEMM peak, measured with the workers' threads
    encoder_gflops: float | None = None  # Conv/MatMul/Gemm work of one image through the fp32 encoder graph
    parity: dict[tuple[str, str], str] = field(default_factory=dict)  # (backend, precision) -> the saved verdict


@dataclass(frozen=True)
class _Job:
    export_dir: Path
    backend: str
    precision: str
    batch: int
    options: SearchOptions  # with the row's beam
    pixels: np.ndarray  # float32 (batch, 3, H, W)
    runs: int
    warmup: int
    threads: int
    bandwidth_gb_s: float
    encoder_flops: int | None  # per image
    peak_gflops: float | None


def run_bench(export_dir: Path, plan: BenchPlan) -> BenchReport:
    """Time every row of ``plan`` on ``export_dir``; one spawned process per (backend, precision)."""
    export_dir = Path(export_dir)
    if "trt" in plan.backends:
        from edgecap.runtime.backends.trt_cuda import require_tensorrt

        require_tensorrt()  # first, in one line, rather than from inside a worker
    if not export_dir.is_dir():
        raise ModelError(f"{export_dir}: no such directory; pass an export directory made by `edgecap export`")
    manifest = Manifest.read(export_dir)
    pairs, searches, notes = _runnable(plan, manifest)
    beams = list(searches)
    if not pairs or not beams:
        raise EdgecapError(f"bench: nothing to run on {export_dir}: " + "; ".join(notes))
    files = sample_images(plan.images)
    pixels = load_images(files, Preprocessing.from_json(manifest.preprocessing))
    load_start = machine_info()["load_average"]  # the machine may be shared: say how busy it was
    bandwidth = memcopy_bandwidth_gb_s()
    encoder_flops = _encoder_flops(export_dir, manifest)
    shapes = [(batch, beam) for batch in sorted(plan.batches) for beam in sorted(beams)]
    rows: list[BenchRow] = []
    versions: dict[str, str] = {}
    with (tqdm(total=len(pairs) * len(shapes), desc="bench", unit="config", disable=None) as bar,
          _pinned_threads(plan.threads)):
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            peak = pool.submit(gemm_peak_gflops).result()  # with the workers' pinned BLAS threads
        for backend, precision in pairs:
            # max_workers=1 keeps one worker for all rows of this pair: the model loads once, RSS is its own.
            with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
                for batch, beam in shapes:
                    bar.set_description(f"bench {backend} {precision} batch {batch} beam {beam}")
                    job = _Job(export_dir=export_dir.resolve(), backend=backend, precision=precision, batch=batch,
                               options=searches[beam], pixels=pixels[np.arange(batch) % len(pixels)], runs=plan.runs,
                               warmup=plan.warmup, threads=plan.threads, bandwidth_gb_s=bandwidth,
                               encoder_flops=encoder_flops, peak_gflops=peak)
                    row, child_versions = pool.submit(_bench_row, job).result()
                    rows.append(row)
                    versions.update(child_versions)
                    bar.update()
    machine = machine_info()
    machine["versions"] = {**machine["versions"], **versions}
    machine["memcopy_gb_s"] = bandwidth
    machine["load_average_start"] = load_start
    return BenchReport(export_dir=export_dir, model_id=manifest.model_id, machine=machine, plan=plan,
                       rows=with_speedups(rows), memcopy_gb_s=bandwidth, images=[str(f) for f in files], notes=notes,
                       gemm_peak_gflops=peak, encoder_gflops=encoder_flops / 1e9 if encoder_flops else None,
                       parity=saved_parity(export_dir, pairs))


def _runnable(plan: BenchPlan, manifest: Manifest) -> tuple[list[tuple[str, str]], dict[int, SearchOptions],
                                                               list[str]]:
    """The (backend, precision) pairs and the beams of ``plan`` this export and install can run, and a note for each
    one left out."""
    notes: list[str] = []
    pairs = []
    for backend in plan.backends:
        missing = _missing_peer(backend)
        if missing:
            notes.append(f"{backend}: skipped ({missing})")
            continue
        for precision in plan.precisions:
            if backend in TORCH_BACKENDS and precision not in TORCH_PRECISIONS:
                notes.append(f"{backend} {precision}: skipped (the PyTorch checkpoint runs fp32 only)")
            elif backend in GRAPH_BACKENDS and precision not in manifest.graphs:
                notes.append(f"{backend} {precision}: skipped (not exported here: {', '.join(manifest.graphs)}; "
                             f"`edgecap export --precision {precision}` adds it)")
            else:
                pairs.append((backend, precision))
    searches = {}
    for beam in plan.beams:
        try:
            options = replace(plan.search, beam_size=beam)
        except ValueError as err:
            notes.append(f"beam {beam}: skipped ({err})")
            continue
        if options.k > manifest.topk:
            notes.append(f"beam {beam}: skipped (the step graph returns {manifest.topk} candidates, it needs "
                         f"{options.k}; re-export with --beam {beam})")
        else:
            searches[beam] = options
    return pairs, searches, notes


def _missing_peer(backend: str) -> str | None:
    """Why a backend cannot run on this install (one line), or None."""
    if backend == "openvino" and importlib.util.find_spec("openvino") is None:
        return "OpenVINO is not installed; pip install edgecap[openvino]"
    if backend == "torch-compile" and not (shutil.which("c++") or shutil.which("g++")):
        return "torch.compile's inductor needs a C++ compiler on PATH"
    return None


def _encoder_flops(export_dir: Path, manifest: Manifest) -> int | None:
    """Per-image work of the fp32 encoder graph (every precision computes the same layers), None without one."""
    if "fp32" not in manifest.graphs:
        return None
    return graph_flops(manifest.graph_files(export_dir, "fp32")[0])


def saved_parity(export_dir: Path, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The verdict ``edgecap parity`` saved for each (backend, precision) of the export, where it has run."""
    found = {}
    for backend, precision in pairs:
        report = Path(export_dir) / "reports" / f"parity-{backend}-{precision}.json"
        if backend in GRAPH_BACKENDS and report.is_file():
            try:
                data = json.loads(report.read_text())
                found[(backend, precision)] = f"{data['verdict']} on {data['n_images']} photos"
            except (ValueError, KeyError):
                found[(backend, precision)] = "unreadable report: re-run `edgecap parity`"
    return found


def sample_images(folder: Path | None) -> list[Path]:
    """The photos of ``folder`` (default: the shipped samples), sorted; a DataError when there are none."""
    folder = Path(folder) if folder is not None else SAMPLE_IMAGES
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; pass --images DIR with a few photos")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DataError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)}); pass --images DIR with a few photos")
    return files


@contextmanager
def _pinned_threads(threads: int) -> Iterator[None]:
    """OpenMP/BLAS thread variables for the spawned workers (read when their libraries load), then restored."""
    saved = {name: os.environ.get(name) for name in THREAD_VARIABLES}
    os.environ.update({name: str(threads) for name in THREAD_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ---- inside the worker process ------------------------------------------------------------------------------------

_LOADED: dict[tuple[str, str], tuple[object, int | None, Vocab]] = {}


def _bench_row(job: _Job) -> tuple[BenchRow, dict[str, str]]:
    """Run in a spawned worker: load (once) the backend of ``job``, time one row, report the libraries used.

    The first row of a backend also says how long it took from loading to a first caption: for torch-compile that
    is the compile, excluded from the timed runs like every warm-up."""
    started = time.perf_counter()
    first = (job.backend, job.precision) not in _LOADED
    backend, weight_bytes, vocab = _load(job, job.options.k)
    if first:
        decode(backend.encode(job.pixels), len(job.pixels), job.options, vocab)
    startup = time.perf_counter() - started if first else None
    timings = time_captions(backend, job.pixels, job.options, vocab, runs=job.runs, warmup=job.warmup)
    row = summarize(timings, backend=job.backend, precision=job.precision, options=job.options, threads=job.threads,
                    warmup=job.warmup, step_weight_bytes=weight_bytes, bandwidth_gb_s=job.bandwidth_gb_s,
                    peak_rss=peak_rss_mb(), encoder_flops=job.encoder_flops, peak_gflops=job.peak_gflops)
    return replace(row, startup_s=startup), library_versions()


def _load(job: _Job, k: int):
    """(backend, step weight bytes, vocabulary) for the job's backend and precision, cached per process."""
    key = (job.backend, job.precision)
    if key not in _LOADED:
        manifest = Manifest.read(job.export_dir)
        vocab = Vocab.from_json(manifest.vocab)
        if job.backend in TORCH_BACKENDS:
            import torch

            torch.set_num_threads(job.threads)
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:  # already set in this process: keep what it is
                pass
            from edgecap.checkpoint import load_reference
            from edgecap.torch_backend import compiled

            captioner = load_reference(manifest).model
            weight_bytes = _torch_step_weight_bytes(job.export_dir, manifest, captioner.decoder)
            _LOADED[key] = (compiled(captioner) if job.backend == "torch-compile" else captioner, weight_bytes, vocab)
        elif job.backend == "trt":
            from edgecap.runtime.backends.trt import TrtBackend

            # The weight-bytes floor is measured against host memory bandwidth: it says nothing about a GPU.
            _LOADED[key] = (TrtBackend(job.export_dir, manifest, precision=job.precision), None, vocab)
        elif job.backend == "openvino":
            from edgecap.runtime.backends.openvino import OpenvinoBackend

            backend = OpenvinoBackend(job.export_dir, manifest, precision=job.precision, threads=job.threads)
            step_file = manifest.graph_files(job.export_dir, job.precision)[1]
            _LOADED[key] = (backend, ort_weight_bytes(step_file), vocab)
        else:
            from edgecap.runtime.backends.ort import OrtBackend

            backend = OrtBackend(job.export_dir, manifest, precision=job.precision, threads=job.threads)
            step_file = manifest.graph_files(job.export_dir, job.precision)[1]
            _LOADED[key] = (backend, ort_weight_bytes(step_file, providers=backend.step.get_providers()), vocab)
    loaded, weight_bytes, vocab = _LOADED[key]
    if job.backend in TORCH_BACKENDS:
        from edgecap.torch_backend import TorchBackend

        return TorchBackend(loaded, k), weight_bytes, vocab  # k (candidates per row) follows the beam
    return loaded, weight_bytes, vocab


def _torch_step_weight_bytes(export_dir: Path, manifest: Manifest, decoder) -> int | None:
    """The eager step computes what the fp32 step graph computes (same checkpoint, sha256-checked), so its floor
    uses that graph's weight bytes. The decoder's own parameters would overcount: they include the layers only
    ``prepare`` runs (they sit in the encoder graph) and the whole embedding table, of which a step reads N rows.
    """
    if "fp32" in manifest.graphs:
        counted = ort_weight_bytes(manifest.graph_files(export_dir, "fp32")[1])
        if counted is not None:
            return counted
    from torch import nn

    tables = {id(m.weight) for m in decoder.modules() if isinstance(m, nn.Embedding)}
    return sum(p.numel() * p.element_size() for p in decoder.parameters() if id(p) not in tables)


def bench_export(export_dir: Path, plan: BenchPlan, *, json_out: Path | None = None, markdown_out: Path | None = None,
                 plot: Path | None = None, say=print) -> BenchReport:
    """``edgecap bench``: time ``plan`` on ``export_dir``, write the reports (and the plot), say where they went."""
    from edgecap.bench_report import bench_json, bench_markdown, bench_plot
    from edgecap.report import require_plotting, write_reports

    if plot:
        require_plotting()  # before minutes of timing, not after
    report = run_bench(export_dir, plan)
    text = bench_markdown(report)
    written = write_reports(bench_json(report), text, Path(export_dir) / "reports" / "bench", json_out=json_out,
                            markdown_out=markdown_out)
    if plot:
        bench_plot(report, plot)
        written.append(plot)
    say(text)
    say(f"reports: {', '.join(map(str, written))}")
    return report
