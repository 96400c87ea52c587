"""Issue 2's shapes target: a tiny SAT trained in under 5 minutes on this CPU scores at least 3x the CIDEr-D of the
best constant caption on the shapes test split.

Trains with the CLI (``--preset tiny``, ``--max-steps`` cross-entropy steps then one self-critical epoch), evaluates
at beam 3 and prints the training time (wall and CPU), both scores and their ratio.

Usage: python benchmarks/shapes_target.py [--steps 1500] [--out runs/shapes-target]
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from edgecap.data import load_dataset
from edgecap.training.cider import best_constant_cider
from edgecap.training.data import tokenised_references


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="cross-entropy steps before the self-critical epoch")
    parser.add_argument("--out", type=Path, default=Path("runs/shapes-target"))
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"error: {args.out} exists; pass another --out")

    edgecap = [sys.executable, "-m", "edgecap"]
    started = time.perf_counter()
    subprocess.run([*edgecap, "train", "--model", "sat", "--data", "shapes", "--preset", "tiny", "--out", str(args.out),
                    "--max-steps", str(args.steps), "--scst-epochs", "1"], check=True)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = args.out / "eval-test.json"
    subprocess.run([*edgecap, "eval", str(args.out), "--data", "shapes", "--split", "test", "--beam", "3",
                    "--json", str(report)], check=True, stdout=subprocess.DEVNULL)
    model = json.loads(report.read_text())["metrics"]["CIDEr"]
    train = load_dataset("shapes").split("train")[:100]
    constants = sorted({tuple(c) for refs in tokenised_references(train).values() for c in refs})
    constant = best_constant_cider(tokenised_references(load_dataset("shapes").split("test")), constants)
    print(f"tiny SAT, {args.steps} XE steps + 1 SCST epoch: trained in {wall:.0f} s wall "
          f"({usage.ru_utime + usage.ru_stime:.0f} s CPU); test CIDEr-D {model:.3f}, best constant caption "
          f"{constant:.3f}: {model / constant:.2f}x (target 3x in under 300 s)")


if __name__ == "__main__":
    main()
