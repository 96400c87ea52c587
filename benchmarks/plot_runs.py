"""Training runs side by side: dev CIDEr-D by epoch from each run's metrics.jsonl, as one picture and a summary,
so the arms of a claim (or a phase that has levelled off) can be seen at a glance rather than read from tables.

Cross-entropy epochs are solid lines, self-critical epochs dashed and numbered on from them; each run's best epoch
is a filled dot. Run directories do not outlive their machine: plot them before they go.

    python benchmarks/plot_runs.py RUN [RUN ...] --out curves.png [--label NAME ...] [--title TEXT] [--ymin 40]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from edgecap.errors import EdgecapError

PHASE_STYLE = {"xe": "-", "scst": "--"}


@dataclass
class RunHistory:
    label: str
    phases: list[str]  # one entry per epoch, in the order trained
    dev_cider: list[float]
    seconds: list[float]

    @property
    def best(self) -> int:
        """Index of the best epoch (the first, on ties, as checkpoint selection keeps it)."""
        return max(range(len(self.dev_cider)), key=lambda i: (self.dev_cider[i], -i))


def read_history(run: Path, label: str | None = None) -> RunHistory:
    """A run's epochs from RUN/metrics.jsonl (or that file itself); an EdgecapError naming the file otherwise."""
    if not run.exists():
        raise EdgecapError(f"{run}: no such run directory or metrics.jsonl; check the path")
    path = run / "metrics.jsonl" if run.is_dir() else run
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as err:
        raise EdgecapError(f"{path}: not a readable metrics.jsonl ({type(err).__name__}); point at a run directory "
                           "that `edgecap train --out` wrote") from None
    rows = [r for r in rows if isinstance(r, dict) and r.get("dev_cider") is not None]
    if not rows:
        raise EdgecapError(f"{path}: no epoch with a dev score yet; plot the run after its first epoch ends")
    name = label or (path.parent.name if path.name == "metrics.jsonl" else path.stem)
    return RunHistory(name, [str(r.get("phase", "xe")) for r in rows], [float(r["dev_cider"]) for r in rows],
                      [float(r.get("seconds", 0.0)) for r in rows])


def summary_lines(runs: list[RunHistory]) -> list[str]:
    """One line a run: its epochs, its best epoch and score, and its mean epoch time."""
    width = max(len(r.label) for r in runs)
    lines = []
    for r in runs:
        counts = ", ".join(f"{r.phases.count(p)} {p}" for p in dict.fromkeys(r.phases))
        minutes = sum(r.seconds) / len(r.seconds) / 60
        lines.append(f"{r.label:<{width}}  {counts} epochs; best {r.dev_cider[r.best]:.2f} at epoch {r.best + 1} "
                     f"({r.phases[r.best]}); {minutes:.1f} min an epoch")
    return lines


def plot_runs(runs: list[RunHistory], out: Path, title: str = "", ymin: float | None = None) -> Path:
    """Write the picture of ``runs`` to ``out`` (the format from its suffix); ``ymin`` cuts off the first epochs'
    low scores, which flatten the part where runs differ. Returns ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for run in runs:
        color = None
        for phase in dict.fromkeys(run.phases):
            # A phase's line starts at the previous phase's last epoch, so a run reads as one unbroken curve.
            idx = [i for i, p in enumerate(run.phases) if p == phase]
            idx = ([idx[0] - 1] if idx[0] > 0 else []) + idx
            (line,) = ax.plot([i + 1 for i in idx], [run.dev_cider[i] for i in idx], PHASE_STYLE.get(phase, ":"),
                              color=color, marker=".", label=run.label if color is None else None)
            color = line.get_color()
        ax.plot(run.best + 1, run.dev_cider[run.best], "o", color=color, markersize=8)
    if ymin is not None:
        ax.set_ylim(bottom=ymin)
    ax.set_xlabel("epoch (self-critical epochs dashed, numbered on)")
    ax.set_ylabel("dev CIDEr-D during training")
    ax.set_title(title or "dev CIDEr-D by epoch; dot: best epoch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run directories (or their metrics.jsonl files)")
    parser.add_argument("--out", type=Path, required=True, help="the picture: .png, .svg or .pdf")
    parser.add_argument("--label", action="append", default=[], help="a name per run, in order (default: its folder)")
    parser.add_argument("--title", default="")
    parser.add_argument("--ymin", type=float, help="lowest dev CIDEr-D shown (default: all epochs)")
    args = parser.parse_args(argv)
    try:
        if args.label and len(args.label) != len(args.runs):
            raise EdgecapError(f"--label given {len(args.label)} times for {len(args.runs)} runs; give one per run "
                               "or none")
        labels = args.label or [None] * len(args.runs)
        runs = [read_history(run, label) for run, label in zip(args.runs, labels, strict=True)]
    except EdgecapError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print("\n".join(summary_lines(runs)))
    print(f"wrote {plot_runs(runs, args.out, args.title, args.ymin)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
