"""Result dataclasses -> JSON, Markdown and PNG files; the only place that formats results."""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

if TYPE_CHECKING:  # formatting needs no torch, so an export can be scored and reported without it
    from edgecap.doctor import Diagnosis
    from edgecap.evaluation import EvalResult
    from edgecap.export.trt import BuiltEngine
    from edgecap.parity import ParityResult
    from edgecap.runtime.manifest import Int8Report, Manifest
    from edgecap.runtime.pipeline import Caption
    from edgecap.runtime.search import SearchOptions

METRIC_ORDER = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")


def decoding_json(options: SearchOptions) -> dict:
    """The search settings a report's captions depend on, beside its scores: the three stable fields, then every
    option (``search``), so a report says how to decode the same captions again."""
    return {"beam": options.beam_size, "length_penalty": options.length_penalty,
            "block_trigrams": options.block_trigrams, "search": asdict(options)}


def decoding_text(options: SearchOptions) -> str:
    """``beam 3``, plus every option not at its default, for a report's title."""
    parts = [f"{'sampling, ' if options.sample else ''}beam {options.beam_size}"]
    parts += [f"length penalty {options.length_penalty:g}"] if options.length_penalty else []
    parts += ["trigram blocking"] if options.block_trigrams else []
    default = type(options)()
    parts += [f"{f.name}={_option_text(getattr(options, f.name))}" for f in fields(options)
              if f.name not in ("beam_size", "length_penalty", "block_trigrams", "sample")
              and getattr(options, f.name) != getattr(default, f.name)]
    return ", ".join(parts)


def _option_text(value) -> str:
    """An option as ``--search`` spells it: words joined by ``+``, floats short."""
    if isinstance(value, tuple):
        return "+".join(value) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def eval_json(result: EvalResult) -> dict:
    """Raw pycocoevalcap values keyed by their names, plus what was skipped and why, and each photo's caption and
    CIDEr-D (what ``benchmarks/compare_evals.py`` pairs two models on)."""
    return {"metrics": result.scores.metrics, "skipped": result.scores.skipped, "n_images": result.n_images,
            "backend": result.backend, "precision": result.precision, **decoding_json(result.options),
            "captions": result.captions, "per_image_cider": result.scores.per_image_cider}


def eval_table(result: EvalResult) -> str:
    """One Markdown row of metrics on the 0-100 scale."""
    names = [m for m in METRIC_ORDER if m in result.scores.metrics]
    head = "| " + " | ".join(names) + " |\n|" + "---|" * len(names) + "\n"
    return head + "| " + " | ".join(f"{100 * result.scores.metrics[m]:.1f}" for m in names) + " |"


def parity_json(result: ParityResult) -> dict:
    """The stable fields scripts and CI read (docs/parity-and-bench.md) followed by the detail."""
    return {
        "passed": result.passed,
        "verdict": result.verdict.outcome,
        "photos_to_decide": result.verdict.photos_to_decide,
        "rule": result.rule,
        "identical_rate": result.identical_rate,
        "delta_cider": result.delta_cider,
        "delta_cider_ci95": list(result.delta_cider_ci95),
        "reference": result.reference.metrics,
        "candidate": result.candidate.metrics,
        "n_images": result.n_images,
        "calibration_photos_left_out": result.left_out,
        "machine": result.machine,
        "int8_layers": result.int8_layers,
        "backend": result.backend,
        "precision": result.precision,
        "graphs": result.graphs,
        "split": result.split,
        **decoding_json(result.options),
        "thresholds": {"max_abs_delta_cider": result.threshold.max_delta_cider,
                       "min_identical_rate": result.threshold.min_identical_rate},
        "reasons": list(result.verdict.reasons),
        "first_divergence": {str(k): v for k, v in sorted(result.first_divergence.items())},
        "teacher_forced_steps": [asdict(s) for s in result.steps],
        "differing_captions": result.differing,
    }


def parity_markdown(result: ParityResult) -> str:
    """A human-readable parity report: verdict, metrics side by side, per-step numerics, examples."""
    v = result.verdict
    more = f" (about {v.photos_to_decide:,} photos would decide it)" if v.photos_to_decide else ""
    verdict = v.outcome.upper() + (": " + "; ".join(v.reasons) + more if v.reasons else "")
    low, high = result.delta_cider_ci95
    lines = [
        f"# Parity: {result.backend} {result.precision} vs PyTorch ({result.split}, {result.n_images} images, "
        f"{decoding_text(result.options)})", "", f"**{verdict}**", "",
        f"- identical captions: {100 * result.identical_rate:.1f}% "
        f"(threshold {100 * result.threshold.min_identical_rate:.0f}%)",
        f"- ΔCIDEr: {result.delta_cider:+.2f} (95% CI {low:+.2f} .. {high:+.2f}; non-inferiority margin "
        f"-{result.threshold.max_delta_cider})",
        f"- graphs: {', '.join(f'{graph} `{file}`' for graph, file in result.graphs.items())}",
        *([f"- left out: {result.left_out} photos of this split, INT8 calibration's held-out photos"]
          if result.left_out else []),
        *(f"- {graph}: {c['int8']} layers INT8, {c['fp32']} fp32, {c['qdq_nodes']} Q/DQ nodes"
          for graph, c in result.int8_layers.items()), "",
        "| metric | PyTorch | candidate | Δ |", "|---|---|---|---|",
    ]
    for name in ("Bleu_4", "METEOR", "ROUGE_L", "CIDEr"):
        ref, cand = 100 * result.reference.metrics[name], 100 * result.candidate.metrics[name]
        lines.append(f"| {name} | {ref:.2f} | {cand:.2f} | {cand - ref:+.2f} |")
    lines += ["", "Teacher-forced steps (both fed the PyTorch caption):", "",
              "| step | rows | max abs Δ log-prob | mean abs Δ log-prob | top-1 agree | top-k agree |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {s.step} | {s.rows} | {s.max_abs_delta_logprob:.2e} | {s.mean_abs_delta_logprob:.2e} | "
              f"{100 * s.top1_agreement:.1f}% | {100 * s.topk_agreement:.1f}% |" for s in result.steps]
    if result.first_divergence:
        lines += ["", "First divergence of differing captions (word position: count): "
                  + ", ".join(f"{k}: {v}" for k, v in sorted(result.first_divergence.items()))]
    if result.differing:
        lines += ["", "| image | PyTorch | candidate |", "|---|---|---|"]
        lines += [f"| {d['image_id']} | {d['reference']} | {d['candidate']} |" for d in result.differing[:10]]
    return "\n".join(lines) + "\n"


def write_text(text: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_json(data: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_reports(data: dict, text: str, stem: Path, *, json_out: Path | None = None,
                  markdown_out: Path | None = None) -> list[Path]:
    """``stem``.json and ``stem``.md, and the copies asked for; the paths written."""
    written = []
    for path in (stem.with_suffix(".json"), json_out):
        if path:
            write_json(data, path)
            written.append(path)
    for path in (stem.with_suffix(".md"), markdown_out):
        if path:
            write_text(text, path)
            written.append(path)
    return written


def speed_ratio(ratio: float | None, than: str) -> str:
    """``2.14x as fast as fp32`` / ``0.29x the speed of fp32 (slower)``: a ratio that says which way it points."""
    if ratio is None:
        return f"not timed against {than}"
    return f"{ratio:.2f}x as fast as {than}" if ratio >= 1 else f"{ratio:.2f}x the speed of {than} (slower)"


def int8_summary(q: Int8Report, directory: Path) -> list[str]:
    """What calibration measured, per graph, and the gate rule's verdict on the held-out photos: a warning naming the
    next options when the INT8 set failed (and was not written), a note when the photos were too few to tell."""
    graphs = []
    for name in ("encoder", "step"):
        g = q.graph(name)
        graphs.append(f"{name}: {g.int8_layers} of {g.layers} layers INT8 ({len(g.kept_fp32)} kept fp32 by the "
                      f"search), {speed_ratio(g.ort_cpu_speedup, 'fp32')} on ONNX Runtime CPU"
                      if g.quantized else f"{name}: not quantised ({g.file})")
    corrected = ", bias-corrected" if q.bias_correction else ""
    judged = f", {q.verdict}" if q.verdict else ""
    lines = [f"int8 ({q.scheme}, {q.method}{corrected}): ΔCIDEr {q.delta_cider:+.2f} ± {q.delta_cider_se:.2f} on "
             f"{q.heldout_images} held-out {q.heldout_split} photos{judged}", *(f"  {g}" for g in graphs)]
    failed = q.verdict == "fail" or (not q.verdict and not q.threshold_met)
    if failed:
        hints = ["more --calib-images"]
        if q.method == "max":
            hints.append("--calib-method entropy")
        if q.encoder.quantized and q.step.quantized:
            hints.append("--int8-graphs step (an INT8 step beside the fp16 encoder)")
        and_biases = " and biases corrected" if q.bias_correction else ""
        outcome = ("so no int8 graphs were written" if q.verdict else
                   "expect `edgecap parity --precision int8` to fail")
        lines.append(f"warning: int8 costs more than --calib-max-delta {q.threshold} CIDEr-D even with "
                     f"{q.layers_tried} layers kept fp32{and_biases}, {outcome}. Try {', or '.join(hints)}.")
    elif q.verdict == "inconclusive" or (not q.verdict and 1.96 * q.delta_cider_se > q.threshold):
        needed = f" (about {q.photos_to_decide} would decide)" if q.photos_to_decide else ""
        interval = (f"{q.delta_cider_ci95[0]:+.2f} .. {q.delta_cider_ci95[1]:+.2f}" if q.delta_cider_ci95 else
                    f"± {1.96 * q.delta_cider_se:.2f}")
        lines.append(f"note: the 95% interval of ΔCIDEr ({interval}) reaches across -{q.threshold}: "
                     f"{q.heldout_images} held-out photos are too few to tell whether this INT8 set passes{needed}; "
                     f"gate it with `edgecap parity {directory} --data SPEC --precision int8`, on photos calibration "
                     "never scored, or raise --calib-heldout.")
    return lines


def engine_line(engine: BuiltEngine) -> str:
    """One built (or cached) plan, named inside its export directory."""
    record, rows = engine.record, engine.record.profile
    how = "cached" if engine.reused else f"built in {engine.seconds:.0f} s"
    return (f"TensorRT {record.precision} {record.graph}: {record.file} ({how}; rows {rows.min}-{rows.max}, tuned "
            f"for {rows.opt})")


def caption_json(caption: Caption, attention: Path | None = None) -> dict:
    attention_file = {"attention": str(attention)} if attention else {}
    alternatives = {"alternatives": list(caption.alternatives)} if caption.alternatives else {}
    unmet = {"unmet_words": list(caption.unmet_words)} if caption.unmet_words else {}
    return {"image": str(caption.image), "caption": caption.text, "logprob": round(caption.logprob, 4),
            **alternatives, **unmet, **attention_file}


def caption_line(caption: Caption, attention: Path | None = None) -> str:
    """``photo.jpg: a dog runs on the grass``, its alternatives (n_best) and where its attention maps went."""
    lines = [f"{caption.image}: {caption.text}", *(f"  or: {text}" for text in caption.alternatives)]
    if caption.unmet_words:
        lines.append(f"  no caption found holds: {' '.join(caption.unmet_words)}")
    return "\n".join(lines + ([f"  attention maps: {attention}"] if attention else []))


def export_lines(manifest: Manifest, directory: Path) -> list[str]:
    """What ``edgecap export`` wrote: the INT8 summary when there is one, then the precisions and the manifest."""
    lines = int8_summary(manifest.quantization, directory) if manifest.quantization else []
    if manifest.target:
        lines.append(f"target {manifest.target['name']}: {manifest.target['precision']}, {manifest.target['reason']}")
    return [*lines, f"exported {manifest.model_id} to {directory} ({', '.join(manifest.graphs)}); manifest "
                    f"{directory / 'edgecap.json'}"]


def require_plotting() -> None:
    """Raise the missing-module error of the plots extra (matplotlib) before captioning or timing, not after."""
    import matplotlib  # noqa: F401


def attention_png(caption: Caption, image: Image.Image, path: Path, *, columns: int = 5) -> Path:
    """A grid under the whole caption: the photo, then the photo under each word's attention map (upsampled from
    the feature grid). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    words = [*caption.words, "<end>"]
    side = int(math.isqrt(caption.attention.shape[1]))
    rows = math.ceil((len(words) + 1) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.4 * columns, 2.6 * rows + 0.5))
    axes = np.atleast_1d(axes).ravel()
    shown = np.asarray(image.convert("RGB").resize((224, 224)))
    axes[0].imshow(shown)
    axes[0].set_title(caption.image.name if caption.image else "photo", fontsize=9)
    for ax, word, alpha in zip(axes[1:], words, caption.attention, strict=False):
        grid = alpha[: side * side].reshape(side, side)
        heat = np.asarray(Image.fromarray((255 * grid / max(grid.max(), 1e-8)).astype(np.uint8)).resize(
            (224, 224), Image.BILINEAR)) / 255.0
        # As in the paper's figures: the attended region stays lit, the rest is dimmed.
        ax.imshow((shown * (0.15 + 0.85 * heat[..., None])).astype(np.uint8))
        ax.set_title(word, fontsize=9)
    for ax in axes:
        ax.axis("off")
    fig.suptitle(textwrap.fill(caption.text, 70), fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def attention_paths(images: Sequence[Path], folder: Path) -> list[Path]:
    """``folder/STEM.png`` per image, named after it; a stem that repeats gets ``-2``, ``-3``..."""
    seen: dict[str, int] = {}
    out = []
    for image in images:
        seen[image.stem] = seen.get(image.stem, 0) + 1
        suffix = f"-{seen[image.stem]}" if seen[image.stem] > 1 else ""
        out.append(folder / f"{image.stem}{suffix}.png")
    return out


# ---- bench ------------------------------------------------------------------------------------------

# ---- doctor -------------------------------------------------------------------------------------------------------

def doctor_json(diagnosis: Diagnosis) -> dict:
    return {**asdict(diagnosis), "healthy": diagnosis.healthy}


def doctor_text(diagnosis: Diagnosis) -> str:
    """The machine, then per export row: ``ok`` or ``no`` with the one-line reason."""
    m = diagnosis.machine
    features = " ".join(m["cpu_features"]) or "none known"
    vnni = any("vnni" in f or f in ("amx_int8", "asimddp") for f in m["cpu_features"])
    lines = [f"machine: {m['cpu']}, {m['cores']} cores; CPU features {features}"
             + ("" if vnni else " (no VNNI or dot-product: INT8 gains less on this CPU than on one with them)"),
             f"GPU: {', '.join(m['gpu']) if m['gpu'] else 'none'}" + (f"; {m['jetpack']}" if m["jetpack"] else ""),
             f"libraries: {', '.join(f'{k} {v}' for k, v in m['versions'].items())}",
             f"TensorRT: {diagnosis.tensorrt}"]
    if diagnosis.export is None:
        return "\n".join([*lines, "pass an export directory to see which of its backends and precisions run here"])
    lines.append(f"export: {diagnosis.export}")
    for title, checks in (("runs here", diagnosis.runnable), ("files", diagnosis.files),
                          ("TensorRT engines", diagnosis.engines)):
        lines.append(f"  {title}:" if checks else f"  {title}: none")
        lines += [f"    {'ok' if c.ok else 'no'}  {c.subject}: {c.detail}" for c in checks]
    lines.append("healthy" if diagnosis.healthy else "NOT healthy: a file changed since export, or nothing runs here")
    return "\n".join(lines)
