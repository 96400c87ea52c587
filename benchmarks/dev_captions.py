"""Captions of a split by checkpoints, for scoring on another machine: a GPU machine without Java captions the
photos here, `score_captions.py` scores them where pycocoevalcap runs.

The photos come from the frozen encoder's feature cache (the one training filled, or a new one), and the beam
search runs on the GPU when there is one, so captioning 1,000 photos takes seconds a checkpoint there.

    python benchmarks/dev_captions.py CHECKPOINT [CHECKPOINT ...] --data flickr8k:DIR --out DIR [--split dev]
        [--beam 3] [--max-length 20]

Writes DIR/NAME.json per checkpoint (NAME: the run directory's name, or the file's stem): the captions, the
decoding, and the checkpoint's training metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from edgecap.checkpoint import load_model
from edgecap.data import load_dataset
from edgecap.data.features import cached_features
from edgecap.errors import EdgecapError
from edgecap.report import decoding_json
from edgecap.runtime.search import SearchOptions
from edgecap.shipped import shipped_file_or
from edgecap.torch_backend import captions_of, search_features


def report_name(checkpoint: Path) -> str:
    """``runs/sat-hard/best.pt`` -> ``sat-hard``; ``glied.pt`` -> ``glied``."""
    return checkpoint.parent.name if checkpoint.name in ("best.pt", "last.pt") else checkpoint.stem


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", type=Path, help="run directories or .pt files")
    parser.add_argument("--data", required=True, help="dataset spec, e.g. flickr8k:DIR")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=SearchOptions.max_length, help="words per caption at most")
    parser.add_argument("--out", type=Path, required=True, help="folder for one NAME.json per checkpoint")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    options = SearchOptions(beam_size=args.beam, max_length=args.max_length)
    try:
        records = load_dataset(args.data).split(args.split)
        args.out.mkdir(parents=True, exist_ok=True)
        for checkpoint in args.checkpoints:
            path = shipped_file_or(checkpoint / "best.pt" if checkpoint.is_dir() else checkpoint)
            loaded = load_model(path)
            if loaded.encoder_config.finetune:
                raise EdgecapError(f"{path}: its encoder was fine-tuned, so no feature cache serves it; use "
                                   "`edgecap eval --model` instead")
            features = cached_features(records, loaded.encoder_config, loaded.prep, label=f"{args.split} features")
            decoder = loaded.model.decoder.to(device)
            captions = captions_of(search_features(decoder, features, loaded.vocab, options), loaded.vocab)
            report = {"model": str(path), "split": args.split, **decoding_json(options), "metrics": loaded.metrics,
                      "captions": {r.image_id: c for r, c in zip(records, captions, strict=True)}}
            target = args.out / f"{report_name(path)}.json"
            target.write_text(json.dumps(report, indent=1))
            print(f"{path}: {len(captions)} captions -> {target}")
    except EdgecapError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
