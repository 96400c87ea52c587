"""Whether one model captions better than another on the same photos: ΔCIDEr-D (candidate - baseline) with its
paired-bootstrap 95% interval over the photos, from two `edgecap eval --json` reports of one split and decoding.

A difference whose interval spans zero is within the noise of that many photos: train a second seed of each, or
score more photos, before calling either ahead.

    python benchmarks/compare_evals.py BASELINE.json CANDIDATE.json [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.verdict import paired_bootstrap_ci

DECODING = ("beam", "length_penalty", "block_trigrams")  # fields two comparable reports share


def per_photo_cider(path: Path) -> tuple[dict[str, float], dict]:
    """A report's CIDEr-D per photo (0-100) and the report; an EdgecapError naming the file when it has none."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise EdgecapError(f"{path}: not a readable eval report ({type(err).__name__}); write one with "
                           "`edgecap eval ... --json FILE`") from None
    if not isinstance(report, dict) or not isinstance(report.get("per_image_cider"), dict):
        raise EdgecapError(f"{path}: holds no per-photo CIDEr-D (an eval report of an older edgecap, or not one); "
                           "re-run `edgecap eval ... --json FILE`")
    return {image: 100 * float(score) for image, score in report["per_image_cider"].items()}, report


def compare(baseline: dict[str, float], candidate: dict[str, float]) -> dict:
    """Mean CIDEr-D of both, their difference, its paired-bootstrap 95% interval and what it says."""
    photos = sorted(baseline)
    a, b = np.array([baseline[p] for p in photos]), np.array([candidate[p] for p in photos])
    low, high = paired_bootstrap_ci(a, b)
    says = "candidate ahead" if low > 0 else "candidate behind" if high < 0 else "within noise"
    return {"photos": len(photos), "baseline": float(a.mean()), "candidate": float(b.mean()),
            "delta_cider": float(b.mean() - a.mean()), "delta_cider_ci95": [low, high], "says": says}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--json", type=Path, help="also write the comparison here")
    args = parser.parse_args(argv)
    try:
        (baseline, base_report), (candidate, cand_report) = map(per_photo_cider, (args.baseline, args.candidate))
        if set(baseline) != set(candidate):
            raise EdgecapError(f"{args.candidate}: scores {len(candidate)} photos, {args.baseline} {len(baseline)}, "
                               f"{len(set(baseline) ^ set(candidate))} of them not in both: evaluate both on one split")
        differing = [f for f in DECODING if base_report.get(f) != cand_report.get(f)]
        if differing:
            raise EdgecapError(f"{args.candidate}: decoded with other {', '.join(differing)} than {args.baseline}; "
                               "evaluate both with the same decoding flags")
    except EdgecapError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    result = compare(baseline, candidate)
    low, high = result["delta_cider_ci95"]
    print(f"CIDEr-D on {result['photos']} photos: baseline {result['baseline']:.2f} ({args.baseline}), candidate "
          f"{result['candidate']:.2f} ({args.candidate})")
    print(f"ΔCIDEr-D {result['delta_cider']:+.2f} (95% interval {low:+.2f} .. {high:+.2f}): {result['says']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
