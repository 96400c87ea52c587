"""``edgecap bench``'s reports: the JSON contract, the Markdown tables (side by side, peers, floors) and the plot."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edgecap.benchmarking import BenchReport
    from edgecap.runtime.timing import BenchRow

PEER_COLOURS = {"torch": "tab:orange", "torch-compile": "tab:red", "ort": "tab:blue", "openvino": "tab:purple",
                "trt": "tab:green"}


def bench_json(report: BenchReport) -> dict:
    """``machine`` and ``results`` (stable fields, docs/parity-and-bench.md), then how the figures were taken."""
    return {
        "machine": report.machine,
        "results": [asdict(row) for row in report.rows],
        "model_id": report.model_id,
        "export_dir": str(report.export_dir),
        "settings": {"threads": report.plan.threads, "runs": report.plan.runs, "warmup": report.plan.warmup,
                     "thread_pinning": _THREADS_NOTE.format(threads=report.plan.threads),
                     "memcopy_gb_s": report.memcopy_gb_s, "images": report.images},
        "floors": {"gemm_peak_gflops": report.gemm_peak_gflops, "encoder_gflops_per_image": report.encoder_gflops,
                   "memcopy_gb_s": report.memcopy_gb_s},
        "parity": {f"{backend} {precision}": verdict for (backend, precision), verdict in report.parity.items()},
        "notes": report.notes,
    }


_THREADS_NOTE = ("torch.set_num_threads({threads}) and ONNX Runtime intra_op_num_threads={threads} "
                 "(inter-op 1); each backend/precision in its own process")


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def bench_markdown(report: BenchReport) -> str:
    """The machine, how it was measured, the side-by-side table, where the time goes, and notes."""
    m = report.machine
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    lines = [
        f"# Bench: {report.model_id} export `{report.export_dir}`", "",
        f"- machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), GPU: "
        f"{', '.join(m['gpu']) if m['gpu'] else 'none'}; load average (1, 5, 15 min) "
        f"{m.get('load_average_start')} at the start, {m['load_average']} at the end",
        f"- libraries: {versions}",
        f"- threads: {_THREADS_NOTE.format(threads=report.plan.threads)}",
        f"- {report.plan.runs} timed runs per row after {report.plan.warmup} warm-up runs; host wall clock; "
        f"a caption is encode + beam search of the batch ({len(report.images)} sample photos repeated to fill it, "
        "preprocessed beforehand)",
        f"- step floor: step weight bytes / memory-copy bandwidth {report.memcopy_gb_s:.1f} GB/s "
        "(numpy, one thread, read + write bytes)", "",
        "| backend | precision | batch | beam | encoder ms p50 | step ms p50 | step floor ms | steps | "
        "caption ms p50 | p90 | p99 | captions/s | host search | peak RSS MB | speed-up vs torch eager (>1x: faster) | "
        "encoder / step speed-up vs torch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        rss = "–" if r.peak_rss_mb is None else f"{r.peak_rss_mb:.0f}"
        lines.append(
            f"| {r.backend} | {r.precision} | {r.batch} | {r.beam} | {_ms(r.encoder_ms_p50)} | {_ms(r.step_ms_p50)} | "
            f"{_ms(r.step_floor_ms)} | {r.steps_per_caption:.0f} | {_ms(r.caption_ms_p50)} | {_ms(r.caption_ms_p90)} | "
            f"{_ms(r.caption_ms_p99)} | {r.captions_per_s:.1f} | {100 * r.search_overhead_share:.1f}% | {rss} | "
            f"{_times(r.speedup_vs_torch)} | {_times(r.encoder_speedup_vs_torch)} / "
            f"{_times(r.step_speedup_vs_torch)} |")
    lines += ["", "Where a caption's time goes (mean ms per caption call):", "",
              "| backend | precision | batch | beam | encoder | steps | host search | caption |",
              "|---|---|---|---|---|---|---|---|"]
    for r in report.rows:
        share = {name: 100 * value / r.caption_ms_mean for name, value in
                 (("encoder", r.encoder_ms_mean), ("steps", r.steps_ms_mean), ("search", r.search_ms_mean))}
        lines.append(f"| {r.backend} | {r.precision} | {r.batch} | {r.beam} | {_ms(r.encoder_ms_mean)} "
                     f"({share['encoder']:.0f}%) | {_ms(r.steps_ms_mean)} ({share['steps']:.0f}%) | "
                     f"{_ms(r.search_ms_mean)} ({share['search']:.0f}%) | {_ms(r.caption_ms_mean)} |")
    lines += ["", "Step time by position (median ms of the p-th step; growth = last 3 / first 3 positions, ~1 when "
              "the carried state or KV cache keeps every step the same size):", "",
              "| backend | precision | batch | beam | growth | ms per position |", "|---|---|---|---|---|---|"]
    for r in report.rows:
        growth = "–" if r.step_growth is None else f"{r.step_growth:.2f}"
        profile = " ".join(_ms(ms) for ms in r.step_ms_by_position)
        lines.append(f"| {r.backend} | {r.precision} | {r.batch} | {r.beam} | {growth} | {profile} |")
    lines += peers_table(report) + floors_table(report)
    if report.notes:
        lines += ["", "Notes:", ""] + [f"- {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def _ratio_to(rows: list[BenchRow], row: BenchRow, backend: str, precision: str = "fp32") -> str:
    """How many times faster ``row`` is than ``backend`` ``precision`` at its batch and beam ('–': not run)."""
    for other in rows:
        if (other.backend, other.precision, other.batch, other.beam) == (backend, precision, row.batch, row.beam):
            return _times(other.caption_ms_p50 / row.caption_ms_p50) if row.caption_ms_p50 > 0 else "–"
    return "–"


def peers_table(report: BenchReport) -> list[str]:
    """Every path beside what a user would pick instead (PyTorch eager and compiled, OpenVINO on the same graphs),
    with the parity verdict ``edgecap parity`` saved for it."""
    lines = ["", "Peers, side by side (ratios: times faster than that peer at the same batch and beam; parity: the "
             "verdict `edgecap parity` saved for this export, '–' where it has not run):", "",
             "| backend | precision | batch | beam | caption ms p50 | p99 | vs torch eager | vs torch-compile | "
             "vs openvino fp32 | startup s | parity |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.rows:
        parity = ("reference" if r.backend == "torch" else "same checkpoint" if r.backend == "torch-compile"
                  else report.parity.get((r.backend, r.precision), "–"))
        startup = "–" if r.startup_s is None else f"{r.startup_s:.1f}"
        lines.append(f"| {r.backend} | {r.precision} | {r.batch} | {r.beam} | {_ms(r.caption_ms_p50)} | "
                     f"{_ms(r.caption_ms_p99)} | {_ratio_to(report.rows, r, 'torch')} | "
                     f"{_ratio_to(report.rows, r, 'torch-compile')} | {_ratio_to(report.rows, r, 'openvino')} | "
                     f"{startup} | {parity} |")
    return lines


def floors_table(report: BenchReport) -> list[str]:
    """Each path as a multiple of what the hardware allows: the encoder against its FLOPs at the measured GEMM
    peak, the step against its weight bytes at the measured copy bandwidth, and the host search's share."""
    peak = "not measured" if report.gemm_peak_gflops is None else f"{report.gemm_peak_gflops:.1f} GFLOP/s"
    work = "unknown (needs onnx)" if report.encoder_gflops is None else f"{report.encoder_gflops:.2f} GFLOP per image"
    lines = ["", f"Floors: encoder work {work} (Conv, MatMul, Gemm of the fp32 graph) at the float32 GEMM peak {peak} "
             f"(numpy, {report.plan.threads} thread(s)); step weight bytes at {report.memcopy_gb_s:.1f} GB/s. "
             "x floor = measured / floor (1x: at the hardware's limit):", "",
             "| backend | precision | batch | beam | encoder ms | floor | x floor | step ms | floor | x floor | "
             "host search |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.rows:
        enc = r.encoder_ms_p50 / r.encoder_floor_ms if r.encoder_floor_ms else None
        step = r.step_ms_p50 / r.step_floor_ms if r.step_floor_ms else None
        lines.append(f"| {r.backend} | {r.precision} | {r.batch} | {r.beam} | {_ms(r.encoder_ms_p50)} | "
                     f"{_ms(r.encoder_floor_ms)} | {_times(enc)} | {_ms(r.step_ms_p50)} | {_ms(r.step_floor_ms)} | "
                     f"{_times(step)} | {100 * r.search_overhead_share:.1f}% |")
    return lines


def bench_plot(report: BenchReport, path: Path) -> None:
    """Left: caption p50 per configuration (whisker to p90); right: mean encoder / steps / host search split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = report.rows
    labels = [f"{r.backend} {r.precision}\nb{r.batch} k{r.beam}" for r in rows]
    x = np.arange(len(rows))
    colours = [PEER_COLOURS.get(r.backend, "tab:gray") for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8.0, 1.5 * len(rows)), 4.2))
    p50 = np.array([r.caption_ms_p50 for r in rows])
    p90 = np.array([r.caption_ms_p90 for r in rows])
    left.bar(x, p50, color=colours, yerr=[np.zeros_like(p50), p90 - p50], capsize=3)
    for xi, r in zip(x, rows, strict=True):
        if r.speedup_vs_torch is not None and r.backend != "torch":
            left.annotate(f"{r.speedup_vs_torch:.1f}x", (xi, r.caption_ms_p90), xytext=(0, 3),
                          textcoords="offset points", ha="center", va="bottom", fontsize=7)
    left.set_title("whole caption, p50 (whisker: p90); labels: times faster than torch eager", fontsize=9)
    shown = dict.fromkeys(r.backend for r in rows)
    left.legend(handles=[Patch(color=PEER_COLOURS.get(b, "tab:gray"), label=b) for b in shown], fontsize=7)
    bottom = np.zeros(len(rows))
    for name, colour in (("encoder", "tab:green"), ("steps", "tab:purple"), ("search", "tab:gray")):
        values = np.array([getattr(r, f"{name}_ms_mean") for r in rows])
        right.bar(x, values, bottom=bottom, color=colour, label=name if name != "search" else "host search")
        bottom += values
    right.set_title("mean per caption call", fontsize=9)
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("ms")
    fig.suptitle(f"{report.model_id}: {report.machine['cpu']}, {report.plan.threads} thread(s)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
