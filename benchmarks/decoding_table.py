"""What each decoding option does to a model's captions: one table of scores on a split, one encoding of its photos.

    python benchmarks/decoding_table.py --data flickr8k:DIR [--model RUN_OR_CKPT] [--split dev] [--max-images N]
                                        [--only NAME_PART]

Every row decodes the same encoded photos through the shared search with one setting and is scored against the
human references. "Broken endings" counts captions whose last word ends fewer than 1% of the training captions that
hold it (the vocabulary's learned endings): "a man is wearing a yellow" rather than "... a yellow shirt".
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from edgecap.checkpoint import load_model
from edgecap.data import load_dataset
from edgecap.errors import EdgecapError
from edgecap.evaluation import Evaluator, score_captions
from edgecap.runtime.search import SearchOptions
from edgecap.torch_backend import search_features, split_features

BEAM = SearchOptions()
SAMPLE = replace(BEAM, sample=True, seed=0)
SETTINGS = {
    "beam 3 (default)": BEAM,
    "beam 1 (greedy)": replace(BEAM, beam_size=1),
    "beam 5": replace(BEAM, beam_size=5),
    "beam 3, patience 2": replace(BEAM, patience=2.0),
    "beam 3, learned endings": replace(BEAM, learned_endings=True),
    "beam 3, no bad endings": replace(BEAM, bad_endings=()),
    "beam 3, min length 8": replace(BEAM, min_length=8),
    "beam 3, length penalty 0.5, trigram blocking": replace(BEAM, length_penalty=0.5, block_trigrams=True),
    "diverse beam 3, 3 groups, diversity 0.5": replace(BEAM, groups=3),
    "sampling, temperature 1": SAMPLE,
    "sampling, temperature 0.5": replace(SAMPLE, temperature=0.5),
    "sampling, top-k 3": replace(SAMPLE, top_k=3),
    "sampling, top-p 0.8": replace(SAMPLE, top_p=0.8),
}
METRICS = ("Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--model", type=Path, default=None, help="run directory or checkpoint (default: shipped)")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--max-images", type=int, default=0)
    parser.add_argument("--only", default="", help="only the settings whose name contains one of these "
                        "(comma-separated)")
    args = parser.parse_args(argv)
    loaded = load_model(args.model)
    records = load_dataset(args.data).split(args.split)[: args.max_images or None]
    features = split_features(loaded, records)
    endings = set(loaded.vocab.learned_endings)
    print(f"{len(records)} {args.split} photos; {len(endings)} learned endings in the vocabulary\n")
    print("| decoding | " + " | ".join(METRICS) + " | words per caption | broken endings |")
    print("|---|" + "---|" * (len(METRICS) + 2))
    with Evaluator(spice=False) as evaluator:
        for name, options in SETTINGS.items():
            if not any(part in name for part in args.only.split(",")) or options.learned_endings and not endings:
                continue
            hyps = search_features(loaded.model.decoder, features, loaded.vocab, options)
            captions = {r.image_id: loaded.vocab.decode(h.tokens) for r, h in zip(records, hyps, strict=True)}
            metrics = score_captions(records, captions, options, evaluator=evaluator).scores.metrics
            lengths = [len(c.split()) for c in captions.values()]
            broken = sum(c.split()[-1] in endings for c in captions.values() if c)
            print(f"| {name} | " + " | ".join(f"{100 * metrics[m]:.1f}" for m in METRICS)
                  + f" | {sum(lengths) / len(lengths):.1f} | {broken} of {len(captions)} |", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except EdgecapError as err:
        sys.exit(f"error: {err}")
