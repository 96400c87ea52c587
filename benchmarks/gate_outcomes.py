"""What the parity gate says of the shipped model's exports as the photos grow: pass, fail or inconclusive per
precision at each count of dev photos, and a deliberately damaged graph that must fail.

The damaged export is the fp32 one with the step's largest weight matrix scaled by 0.9 and its sha256 recorded
again, as a faulty exporter would write it: integrity checks pass, so only the gate can catch it.

    python benchmarks/gate_outcomes.py --data flickr8k:DIR --export fp32=DIR --export fp16=DIR --export int8=DIR \\
        [--photos 50,200,1000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgecap.data import load_dataset
from edgecap.errors import EdgecapError
from edgecap.evaluation import Evaluator
from edgecap.parity import run_parity
from edgecap.runtime.manifest import Manifest
from edgecap.runtime.search import SearchOptions


def damaged_copy(export: Path, into: Path) -> Path:
    """``export`` with its fp32 step's largest initializer scaled by 0.9, the manifest's hashes written anew."""
    import onnx
    from onnx import numpy_helper

    shutil.copytree(export, into, ignore=shutil.ignore_patterns("reports", "*.int8.onnx", "calib"))
    manifest = Manifest.read(into)
    manifest = replace(manifest, graphs={"fp32": manifest.graphs["fp32"]}, quantization=None, target={})
    step = into / manifest.graphs["fp32"]["step"]
    model = onnx.load(str(step))
    largest = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    largest.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(largest) * np.float32(0.9), largest.name))
    onnx.save(model, str(step))
    manifest.write(into)
    return into


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--export", action="append", required=True, help="PRECISION=DIR, repeatable")
    parser.add_argument("--photos", default="50,200,1000")
    parser.add_argument("--beam", type=int, default=3)
    args = parser.parse_args(argv)
    exports = [(p, Path(d)) for p, _, d in (item.partition("=") for item in args.export)]
    counts = [int(n) for n in args.photos.split(",")]
    dataset = load_dataset(args.data)
    dev = dataset.split("dev")
    print("| export | precision | photos | identical | ΔCIDEr | 95% interval | verdict |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="edgecap-gate-") as tmp, Evaluator(spice=False) as evaluator:
        damaged = damaged_copy(exports[0][1], Path(tmp) / "damaged")
        for name, precision, directory in [*((str(d), p, d) for p, d in exports), ("damaged step", "fp32", damaged)]:
            for count in counts:
                result = run_parity(directory, dev[:count], split="dev", precision=precision,
                                    options=SearchOptions(beam_size=args.beam), evaluator=evaluator,
                                    data_name=dataset.name)
                low, high = result.delta_cider_ci95
                print(f"| {name} | {precision} | {result.n_images} | {100 * result.identical_rate:.1f}% | "
                      f"{result.delta_cider:+.2f} | {low:+.2f} .. {high:+.2f} | {result.verdict.outcome} |", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except EdgecapError as err:
        sys.exit(f"error: {err}")
