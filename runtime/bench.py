"""Per-stage timing of any backend, torch-free (DESIGN.md §8): the encoder, every decoder step, the whole caption.

A caption is ``backend.encode(pixels)`` followed by ``beam_search`` over the session it returns, as in
``Captioner.search``; pixels are preprocessed beforehand, so image decoding is not timed. Each step is timed
by wrapping the session in :class:`TimedSession`, so what remains of the caption once the encoder and the
steps are taken out is the host side of the search: logit filters, beam update, bookkeeping, and the one
``tile`` of memory and state. Clocks are host clocks; every backend returns host arrays from ``encode``'s
session and from ``step`` (top-k and attention cross to the host each step), so device work is inside them.

Also here, because a deployment target has no torch: the machine description that every report carries
(figures from different machines must never be mixed), a memory-copy bandwidth measurement and the step's
weight bytes, which give the floor of a memory-bound step: weight bytes / bandwidth.
"""

from __future__ import annotations

import gc
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from edgecap.runtime.backends.base import Backend
from edgecap.runtime.backends.ort import FP32_PRESERVING
from edgecap.runtime.search import SearchOptions, StepSession, beam_search

Clock = Callable[[], float]  # seconds, monotonic


class TimedSession:
    """A StepSession that forwards to ``session`` and records the seconds of each ``step`` call."""

    def __init__(self, session: StepSession, clock: Clock = time.perf_counter):
        self.session = session
        self.clock = clock
        self.step_seconds: list[float] = []

    def step(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        start = self.clock()
        out = self.session.step(tokens, reorder, position)
        self.step_seconds.append(self.clock() - start)
        return out

    def tile(self, beam_size: int) -> None:
        self.session.tile(beam_size)


@dataclass(frozen=True)
class CaptionTimings:
    """Seconds of each measured run (warm-up runs excluded); every run captions the same ``batch`` images."""

    batch: int
    encoder: np.ndarray  # float64 (runs,): backend.encode
    steps: tuple[np.ndarray, ...]  # per run, float64 (steps,): each session.step call
    caption: np.ndarray  # float64 (runs,): encode + the whole beam search

    @property
    def step_totals(self) -> np.ndarray:
        """float64 (runs,): seconds spent inside the step calls of each run."""
        return np.array([s.sum() for s in self.steps])

    @property
    def search(self) -> np.ndarray:
        """float64 (runs,): host-side search seconds of each run (caption - encoder - steps)."""
        return self.caption - self.encoder - self.step_totals


def time_captions(backend: Backend, pixels: np.ndarray, options: SearchOptions, *, runs: int, warmup: int,
                  bad_ending_ids: frozenset[int] = frozenset(), clock: Clock = time.perf_counter) -> CaptionTimings:
    """Caption ``pixels`` float32 (B, 3, H, W) ``warmup + runs`` times; time the last ``runs``.

    The garbage collector is paused while a run is timed (as ``timeit`` does), so a collection triggered by
    the allocations of one backend is not charged to whichever stage happens to be running.
    """
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got runs={runs} warmup={warmup}")
    encoder, steps, caption = [], [], []
    was_enabled = gc.isenabled()
    try:
        for run in range(warmup + runs):
            gc.collect()
            gc.disable()
            start = clock()
            session = TimedSession(backend.encode(pixels), clock)
            encoded = clock()
            beam_search(session, len(pixels), options, bad_ending_ids=bad_ending_ids)
            end = clock()
            if was_enabled:
                gc.enable()
            if run >= warmup:
                encoder.append(encoded - start)
                steps.append(np.array(session.step_seconds, dtype=np.float64))
                caption.append(end - start)
    finally:
        if was_enabled:
            gc.enable()
    return CaptionTimings(batch=len(pixels), encoder=np.array(encoder), steps=tuple(steps), caption=np.array(caption))


@dataclass(frozen=True)
class BenchRow:
    """One configuration's figures. The first fields are the stable bench JSON contract (DESIGN.md §8)."""

    backend: str
    precision: str
    batch: int  # images per caption call
    beam: int
    encoder_ms_p50: float  # backend.encode of the whole batch
    step_ms_p50: float  # one step of all batch * beam rows, median over every step of every run
    caption_ms_p50: float  # encode + beam search of the whole batch
    caption_ms_p90: float
    caption_ms_p99: float
    captions_per_s: float  # images captioned per second of measured caption time
    search_overhead_share: float  # host-side search / caption time, 0-1, over all measured runs
    peak_rss_mb: float | None  # peak resident memory of the process that ran this row (and the rows before it)
    speedup_vs_torch: float | None  # torch caption_ms_p50 / this caption_ms_p50 at the same batch and beam
    # -- detail beyond the contract
    threads: int  # intra-op threads of torch / ONNX Runtime
    runs: int
    warmup: int
    steps_per_caption: float  # step calls per caption call (mean over runs)
    step_ms_p90: float
    encoder_ms_mean: float  # means: encoder + steps + search add up to caption
    steps_ms_mean: float
    search_ms_mean: float
    caption_ms_mean: float
    step_weight_bytes: int | None  # bytes of the weights one step reads (None: not known)
    step_floor_ms: float | None  # step_weight_bytes / memory-copy bandwidth: a memory-bound step's lower bound
    step_ms_by_position: tuple[float, ...] = ()  # median ms of the p-th step over the runs that reached it
    step_growth: float | None = None  # last 3 positions / first 3 (median ms): ~1 when the cache keeps steps flat
    encoder_speedup_vs_torch: float | None = None
    step_speedup_vs_torch: float | None = None


def step_ms_by_position(steps: Sequence[np.ndarray]) -> tuple[float, ...]:
    """Median ms of each step position over the runs that reached it.

    A decoder that re-read its whole prefix would slow down word by word; the LSTM state and the static KV cache
    (DESIGN.md §4) keep every step the same size, and this profile is how a user sees that they do.
    """
    longest = max((len(s) for s in steps), default=0)
    return tuple(float(np.median([s[p] for s in steps if len(s) > p]) * 1e3) for p in range(longest))


def step_growth(by_position: Sequence[float], edge: int = 3) -> float | None:
    """Median of the last ``edge`` positions over the median of the first ``edge`` (None: too few steps)."""
    if len(by_position) < 2 * edge:
        return None
    return float(np.median(by_position[-edge:]) / np.median(by_position[:edge]))


def summarize(timings: CaptionTimings, *, backend: str, precision: str, options: SearchOptions, threads: int,
              warmup: int, step_weight_bytes: int | None = None, bandwidth_gb_s: float | None = None,
              peak_rss: float | None = None) -> BenchRow:
    """A BenchRow (milliseconds) from raw timings; speedups are filled in by :func:`with_speedups`."""
    ms = 1e3
    caption = timings.caption * ms
    every_step = np.concatenate(timings.steps) * ms if timings.steps else np.zeros(0)
    p50, p90, p99 = (float(v) for v in np.percentile(caption, [50, 90, 99]))
    by_position = step_ms_by_position(timings.steps)
    floor = None
    if step_weight_bytes is not None and bandwidth_gb_s:
        floor = step_weight_bytes / (bandwidth_gb_s * 1e9) * ms
    return BenchRow(
        backend=backend, precision=precision, batch=timings.batch, beam=options.beam_size,
        encoder_ms_p50=float(np.median(timings.encoder) * ms),
        step_ms_p50=float(np.median(every_step)) if len(every_step) else 0.0,
        caption_ms_p50=p50, caption_ms_p90=p90, caption_ms_p99=p99,
        captions_per_s=float(timings.batch * len(caption) / timings.caption.sum()),
        search_overhead_share=float(timings.search.sum() / timings.caption.sum()),
        peak_rss_mb=peak_rss, speedup_vs_torch=None, threads=threads, runs=len(caption), warmup=warmup,
        steps_per_caption=float(np.mean([len(s) for s in timings.steps])),
        step_ms_p90=float(np.percentile(every_step, 90)) if len(every_step) else 0.0,
        encoder_ms_mean=float(timings.encoder.mean() * ms), steps_ms_mean=float(timings.step_totals.mean() * ms),
        search_ms_mean=float(timings.search.mean() * ms), caption_ms_mean=float(caption.mean()),
        step_weight_bytes=step_weight_bytes, step_floor_ms=floor,
        step_ms_by_position=by_position, step_growth=step_growth(by_position))


def with_speedups(rows: Sequence[BenchRow], reference: str = "torch") -> list[BenchRow]:
    """Rows with each ratio against the ``reference`` backend's row of the same batch and beam (None: no such row).

    Ratios are reference time / row time, so above 1 is faster than the reference; its own rows get 1.0.
    """
    base = {(r.batch, r.beam): r for r in rows if r.backend == reference}

    def ratio(ref: float, value: float) -> float | None:
        return ref / value if value > 0 else None

    out = []
    for row in rows:
        ref = base.get((row.batch, row.beam))
        if ref is None:
            out.append(replace(row, speedup_vs_torch=None, encoder_speedup_vs_torch=None, step_speedup_vs_torch=None))
        else:
            out.append(replace(row, speedup_vs_torch=ratio(ref.caption_ms_p50, row.caption_ms_p50),
                               encoder_speedup_vs_torch=ratio(ref.encoder_ms_p50, row.encoder_ms_p50),
                               step_speedup_vs_torch=ratio(ref.step_ms_p50, row.step_ms_p50)))
    return out


# ---- the machine --------------------------------------------------------------------------------------------------

def peak_rss_mb() -> float | None:
    """Peak resident set size of this process so far, in MiB (None where the OS does not say).

    Linux: ``VmHWM``, the high-water mark of this process's own memory. ``ru_maxrss`` is only the fallback: it
    survives ``exec``, so a spawned worker would report its parent's size at fork time when that is larger.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**10  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """Name and driver of each NVIDIA GPU that nvidia-smi lists; [] when there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()] if listed.returncode == 0 else []


def library_versions() -> dict[str, str]:
    """numpy, onnxruntime and (only when this process already imported it) torch: never imports torch."""
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("edgecap", "onnxruntime", "onnxruntime-gpu", "onnx", "tensorrt", "cuda-python"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(torch.__version__)
    return versions


def machine_info() -> dict:
    """What a reader needs to know before comparing figures: CPU, cores, GPU, OS, library versions, load."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "gpu": gpu_names() or None,
        "platform": platform.platform(),
        "versions": library_versions(),
        "load_average": [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def memcopy_bandwidth_gb_s(*, megabytes: int = 256, repeats: int = 5) -> float:
    """Best-of-``repeats`` bandwidth of one numpy copy between two ``megabytes`` arrays, one thread.

    Counts bytes read plus bytes written (the STREAM "copy" convention), on random data. The arrays are far
    larger than any CPU cache, so this is main-memory bandwidth; a step whose weights stay in cache can beat
    the floor derived from it.
    """
    count = megabytes * 2**20 // 8
    source = np.random.default_rng(0).random(count)
    target = np.empty_like(source)
    np.copyto(target, source)  # fault the pages in before timing
    best = min(_timed(lambda: np.copyto(target, source)) for _ in range(repeats))
    return 2 * source.nbytes / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def onnx_weight_bytes(path: Path) -> int | None:
    """Bytes of weights one run of an ONNX graph reads: its initializers and constant tensors, as stored.

    A table read only through ``Gather`` (a word embedding) is left out: a step reads N of its rows, not all.
    A weight read only through ``Cast`` counts at the cast's type: ONNX Runtime folds such constants when it
    loads the graph (an fp16 graph's Gemm weights that are kept in fp32 are read as fp32). None when ``onnx``
    (the export extra) is not installed: the runtime itself never needs it.
    """
    try:
        import onnx
        from onnx import helper
    except ImportError:
        return None
    model = onnx.load(str(path), load_external_data=False)  # the sizes are in the dims; the bytes need not load

    def size(tensor) -> int:
        return int(np.prod(tensor.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize

    uses: dict[str, set[tuple[str, int]]] = {}
    cast_to: dict[str, set[int]] = {}  # tensor name -> element types it is cast to
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            uses.setdefault(name, set()).add((node.op_type, index))
            if node.op_type == "Cast":
                cast_to.setdefault(name, set()).update(a.i for a in node.attribute if a.name == "to")

    def read_bytes(name: str, tensor) -> int:
        used = uses.get(name, set())
        if used == {("Gather", 0)}:
            return 0
        if used == {("Cast", 0)} and len(cast_to.get(name, ())) == 1:
            return size(tensor) // helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize * \
                helper.tensor_dtype_to_np_dtype(next(iter(cast_to[name]))).itemsize
        return size(tensor)

    total = sum(read_bytes(t.name, t) for t in model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            total += sum(read_bytes(node.output[0], a.t) for a in node.attribute if a.name == "value")
    return total


def ort_weight_bytes(path: Path, *, providers: Sequence[str] = ("CPUExecutionProvider",)) -> int | None:
    """:func:`onnx_weight_bytes` of the graph as ONNX Runtime runs it on ``providers``, after its load-time rewrites.

    They matter: the CPU provider has no fp16 Gemm, so it casts an fp16 graph's weights to fp32 once at load
    and every step then reads fp32. Falls back to the file as stored where the rewritten graph cannot be saved.
    """
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as folder:
        optimized = Path(folder) / "optimized.onnx"
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(optimized)
        options.log_severity_level = 3  # no warning that the saved graph is tied to this CPU: it is only measured
        try:
            ort.InferenceSession(str(path), options, providers=list(providers), **FP32_PRESERVING)
            return onnx_weight_bytes(optimized)
        except Exception:  # e.g. a compiling provider that cannot save its graph
            return onnx_weight_bytes(path)
