"""Result dataclasses -> JSON, Markdown and PNG files; the only place that formats results."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import numpy as np
from PIL import Image

from edgecap.captioning import EvalResult
from edgecap.parity import ParityResult
from edgecap.runtime.pipeline import Caption

METRIC_ORDER = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")


def eval_json(result: EvalResult) -> dict:
    """Raw pycocoevalcap values keyed by their names, plus what was skipped and why."""
    return {"metrics": result.scores.metrics, "skipped": result.scores.skipped, "n_images": result.n_images,
            "beam": result.beam_size, "captions": result.captions}


def eval_table(result: EvalResult) -> str:
    """One Markdown row of metrics on the 0-100 scale."""
    names = [m for m in METRIC_ORDER if m in result.scores.metrics]
    head = "| " + " | ".join(names) + " |\n|" + "---|" * len(names) + "\n"
    return head + "| " + " | ".join(f"{100 * result.scores.metrics[m]:.1f}" for m in names) + " |"


def parity_json(result: ParityResult) -> dict:
    """DESIGN.md §8 fields (stable: scripts and CI read them) followed by the detail."""
    return {
        "passed": result.passed,
        "identical_rate": result.identical_rate,
        "delta_cider": result.delta_cider,
        "delta_cider_ci95": list(result.delta_cider_ci95),
        "reference": result.reference.metrics,
        "candidate": result.candidate.metrics,
        "n_images": result.n_images,
        "backend": result.backend,
        "precision": result.precision,
        "split": result.split,
        "beam": result.beam_size,
        "thresholds": {"max_abs_delta_cider": result.threshold.max_delta_cider,
                       "min_identical_rate": result.threshold.min_identical_rate},
        "failures": result.failures,
        "first_divergence": {str(k): v for k, v in sorted(result.first_divergence.items())},
        "teacher_forced_steps": [asdict(s) for s in result.steps],
        "differing_captions": result.differing,
    }


def parity_markdown(result: ParityResult) -> str:
    """A human-readable parity report: verdict, metrics side by side, per-step numerics, examples."""
    verdict = "PASS" if result.passed else "FAIL: " + "; ".join(result.failures)
    low, high = result.delta_cider_ci95
    lines = [
        f"# Parity: {result.backend} {result.precision} vs PyTorch ({result.split}, {result.n_images} images, "
        f"beam {result.beam_size})", "", f"**{verdict}**", "",
        f"- identical captions: {100 * result.identical_rate:.1f}% "
        f"(threshold {100 * result.threshold.min_identical_rate:.0f}%)",
        f"- ΔCIDEr: {result.delta_cider:+.2f} (95% CI {low:+.2f} .. {high:+.2f}; "
        f"threshold ±{result.threshold.max_delta_cider})", "",
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


def caption_json(caption: Caption) -> dict:
    return {"image": str(caption.image), "caption": caption.text, "logprob": round(caption.logprob, 4)}


def attention_png(caption: Caption, image: Image.Image, path: Path, *, columns: int = 5) -> None:
    """A grid: the image, then the image under each word's attention map (upsampled from the feature grid)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    words = [*caption.words, "<end>"]
    side = int(math.isqrt(caption.attention.shape[1]))
    rows = math.ceil((len(words) + 1) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.4 * columns, 2.6 * rows))
    axes = np.atleast_1d(axes).ravel()
    shown = np.asarray(image.convert("RGB").resize((224, 224)))
    axes[0].imshow(shown)
    axes[0].set_title(caption.text if len(caption.text) < 40 else caption.text[:37] + "...", fontsize=7)
    for ax, word, alpha in zip(axes[1:], words, caption.attention, strict=False):
        grid = alpha[: side * side].reshape(side, side)
        heat = np.asarray(Image.fromarray((255 * grid / max(grid.max(), 1e-8)).astype(np.uint8)).resize(
            (224, 224), Image.BILINEAR)) / 255.0
        # As in the paper's figures: the attended region stays lit, the rest is dimmed.
        ax.imshow((shown * (0.15 + 0.85 * heat[..., None])).astype(np.uint8))
        ax.set_title(word, fontsize=9)
    for ax in axes:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
