"""Whether one model captions better than another on the same photos: ΔCIDEr-D (candidate - baseline) with its
paired-bootstrap 95% interval over the photos, from two `edgecap eval --json` reports of one split and decoding.

A difference whose interval spans zero is within the noise of that many photos: train a second seed of each, or
score more photos, before calling either ahead. It also prints how the captions' shape moved (mean words, and how
many end on the candidate's most common last word): self-critical training that games its reward shows there first.

    python benchmarks/compare_evals.py BASELINE.json CANDIDATE.json [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
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


def caption_shape(baseline: dict[str, str], candidate: dict[str, str]) -> dict:
    """Mean words a caption in each report, and how many captions of each end on the candidate's most common last
    word."""
    endings = Counter(words[-1] for words in map(str.split, candidate.values()) if words)
    ending = endings.most_common(1)[0][0] if endings else ""

    def shape(captions: dict[str, str]) -> dict:
        words = [caption.split() for caption in captions.values()]
        return {"words": float(np.mean([len(w) for w in words])) if words else 0.0,
                "ending_count": sum(1 for w in words if w and w[-1] == ending), "captions": len(words)}

    return {"ending": ending, "baseline": shape(baseline), "candidate": shape(candidate)}


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
    result["caption_shape"] = shape = caption_shape(base_report.get("captions", {}), cand_report.get("captions", {}))
    low, high = result["delta_cider_ci95"]
    print(f"CIDEr-D on {result['photos']} photos: baseline {result['baseline']:.2f} ({args.baseline}), candidate "
          f"{result['candidate']:.2f} ({args.candidate})")
    print(f"ΔCIDEr-D {result['delta_cider']:+.2f} (95% interval {low:+.2f} .. {high:+.2f}): {result['says']}")
    print("captions: " + "; ".join(
        f"{name} {shape[name]['words']:.1f} words, {shape[name]['ending_count']} of {shape[name]['captions']} end "
        f"'{shape['ending']}'" for name in ("baseline", "candidate")))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
