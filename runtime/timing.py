"""Per-stage timing of any backend, torch-free: the encoder, every decoder step, the whole caption.

A caption is ``backend.encode(pixels)`` followed by ``decode`` (the search) over the session it returns, as in
``Captioner.search``; pixels are preprocessed beforehand, so image decoding is not timed. Each step is timed
by wrapping the session in :class:`TimedSession`, so what remains of the caption once the encoder and the
steps are taken out is the host side of the search: logit filters, beam update, bookkeeping, and the one
``tile`` of memory and state. Clocks are host clocks; every backend returns host arrays from ``encode``'s
session and from ``step`` (top-k and attention cross to the host each step), so device work is inside them.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgecap.runtime.backends.base import Backend
from edgecap.runtime.decoding import decode
from edgecap.runtime.search import SearchOptions, StepSession
from edgecap.vocab import Vocab

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


def time_captions(backend: Backend, pixels: np.ndarray, options: SearchOptions, vocab: Vocab, *, runs: int,
                  warmup: int, clock: Clock = time.perf_counter) -> CaptionTimings:
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
            decode(session, len(pixels), options, vocab)
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
    """One configuration's figures. The first fields are the stable bench JSON contract (docs/parity-and-bench.md)."""

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
    encoder_floor_ms: float | None = None  # encoder FLOPs of the batch / measured GEMM peak: a compute-bound floor
    startup_s: float | None = None  # first row of a backend: loading to a first caption (torch-compile: compiling)


def step_ms_by_position(steps: Sequence[np.ndarray]) -> tuple[float, ...]:
    """Median ms of each step position over the runs that reached it.

    A decoder that re-read its whole prefix would slow down word by word; the LSTM state and the static KV cache
    keep every step the same size, and this profile is how a user sees that they do.
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
              peak_rss: float | None = None, encoder_flops: int | None = None,
              peak_gflops: float | None = None) -> BenchRow:
    """A BenchRow (milliseconds) from raw timings; speedups are filled in by :func:`with_speedups`."""
    ms = 1e3
    caption = timings.caption * ms
    every_step = np.concatenate(timings.steps) * ms if timings.steps else np.zeros(0)
    p50, p90, p99 = (float(v) for v in np.percentile(caption, [50, 90, 99]))
    by_position = step_ms_by_position(timings.steps)
    floor = None
    if step_weight_bytes is not None and bandwidth_gb_s:
        floor = step_weight_bytes / (bandwidth_gb_s * 1e9) * ms
    encoder_floor = None
    if encoder_flops and peak_gflops:
        encoder_floor = encoder_flops * timings.batch / (peak_gflops * 1e9) * ms
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
        step_ms_by_position=by_position, step_growth=step_growth(by_position), encoder_floor_ms=encoder_floor)


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
