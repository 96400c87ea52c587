"""Score the captions `dev_captions.py` wrote (on a machine without Java, say a GPU one) with pycocoevalcap, into
the report `edgecap eval --json` writes, so `compare_evals.py` pairs them like any two eval reports.

    python benchmarks/score_captions.py CAPTIONS.json [CAPTIONS.json ...] --data flickr8k:DIR --out DIR

Writes DIR/NAME.json (NAME as the captions file's) and prints one row of metrics per file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgecap.data import load_dataset
from edgecap.errors import EdgecapError
from edgecap.evaluation import Evaluator, score_captions
from edgecap.report import eval_json, write_json
from edgecap.runtime.search import SearchOptions


def read_captions(path: Path) -> dict:
    """A dev_captions.py report; an EdgecapError naming the file when it is not one."""
    try:
        report = json.loads(path.read_text())
        SearchOptions(**report["search"])
        if not isinstance(report["captions"], dict):
            raise TypeError("captions")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise EdgecapError(f"{path}: not a dev_captions.py report ({type(err).__name__}: {err}); write one with "
                           "`python benchmarks/dev_captions.py`") from None
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("captions", nargs="+", type=Path)
    parser.add_argument("--data", required=True, help="dataset spec, e.g. flickr8k:DIR")
    parser.add_argument("--out", type=Path, required=True, help="folder for one eval report per captions file")
    args = parser.parse_args(argv)
    try:
        reports = [read_captions(p) for p in args.captions]
        dataset = load_dataset(args.data)
        args.out.mkdir(parents=True, exist_ok=True)
        with Evaluator() as evaluator:
            for path, report in zip(args.captions, reports, strict=True):
                records = dataset.split(report["split"])
                missing = [r.image_id for r in records if r.image_id not in report["captions"]]
                if missing:
                    raise EdgecapError(f"{path}: no caption for {len(missing)} of the {len(records)} "
                                       f"{report['split']} photos (first: {missing[0]}); caption the whole split")
                result = score_captions(records, report["captions"], SearchOptions(**report["search"]),
                                        evaluator=evaluator)
                write_json(eval_json(result), args.out / path.name)
                metrics = result.scores.metrics
                print(f"{path.stem}: BLEU-4 {100 * metrics['Bleu_4']:.1f}  METEOR {100 * metrics['METEOR']:.1f}  "
                      f"ROUGE-L {100 * metrics['ROUGE_L']:.1f}  CIDEr-D {100 * metrics['CIDEr']:.1f}")
    except EdgecapError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
