"""Which graph's INT8 costs the captions: the INT8 encoder with the fp32 step, then the fp32 encoder with the
INT8 step, each against fp32 on the export's own held-out calibration photos (the same draw as ``export``).

Usage: python benchmarks/int8_by_graph.py EXPORT_DIR --data flickr8k:DIR [--images 100]
"""

import argparse
from pathlib import Path

from edgecap.calib.build import heldout_records
from edgecap.calib.sensitivity import CaptionScorer, compare
from edgecap.runtime.manifest import Manifest

from edgecap.data import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--data", required=True, help="the dataset spec the export was calibrated on")
    parser.add_argument("--images", type=int, default=100, help="held-out photos to caption (of the export's 300)")
    args = parser.parse_args()

    manifest = Manifest.read(args.export)
    heldout = heldout_records(manifest, load_dataset(args.data))
    scorer = CaptionScorer(args.export, manifest, heldout[:args.images])
    fp32, int8 = manifest.graph_files(args.export, "fp32"), manifest.graph_files(args.export, "int8")
    baseline = scorer.scores(*fp32)
    for pair in ((int8[0], fp32[1]), (fp32[0], int8[1])):
        delta, stderr = compare(baseline, scorer.scores(*pair))
        print(f"{args.export.name}: {pair[0].name} + {pair[1].name}: ΔCIDEr {delta:+.2f} ± {stderr:.2f} "
              f"on {len(baseline)} held-out photos")


if __name__ == "__main__":
    main()
