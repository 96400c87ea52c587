"""Result dataclasses -> JSON, Markdown and PNG files; the only place that formats results."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from PIL import Image

from edgecap.captioning import EvalResult
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
