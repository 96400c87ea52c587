"""Whether a model may run its encoder on smaller images: the dev score and the encoder's time at each size.

The encoder is most of a caption on a CPU, and its work grows with the square of the image side, so a smaller image
is the largest speed lever left; but the decoder was trained on features of one size. For each ``--sizes`` value the
model (PyTorch, the checkpoint as shipped) captions the split's photos resized to that side, and the parity gate's
INT8 rule judges the per-photo CIDEr-D against the trained size's: a size is usable only if the gate passes. The
encoder's one-thread time on a batch of one is measured side by side, trained size first, and given as a ratio.

    python benchmarks/resolution_sweep.py --data flickr8k:DIR [--model sat] [--sizes 260,240,224] [--max-images 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from edgecap.checkpoint import load_model
from edgecap.data import load_dataset
from edgecap.evaluation import Evaluator, score_captions
from edgecap.preprocess import load_images
from edgecap.runtime.search import SearchOptions
from edgecap.shipped import model_path
from edgecap.torch_backend import encode_images, search_features
from edgecap.verdict import THRESHOLDS, judge


def encoder_ms(loaded, paths: list[Path], repeats: int = 5) -> float:
    """Median one-thread milliseconds of the encoder on one photo at a time (decoding excluded)."""
    pixels = [torch.from_numpy(load_images([p], loaded.prep)) for p in paths]
    with torch.no_grad():
        loaded.model.encode(pixels[0])
        times = []
        for _ in range(repeats):
            for image in pixels:
                start = time.perf_counter()
                loaded.model.encode(image)
                times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="e.g. flickr8k:../shared/data/flickr8k")
    parser.add_argument("--model", type=Path, default=None, help="run, checkpoint or shipped id (default: sat)")
    parser.add_argument("--sizes", default="260,240,224", help="image sides; the first is the reference")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--max-images", type=int, default=0, help="0: the whole split")
    parser.add_argument("--beam", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    loaded = load_model(model_path(args.model))
    records = load_dataset(args.data).split(args.split)
    records = records[: args.max_images] if args.max_images else records
    options = SearchOptions(beam_size=args.beam)
    sizes = [int(s) for s in args.sizes.split(",")]
    timing_photos = [r.path for r in records[:8]]
    reference = None
    print(f"{loaded.model_id}, trained at {loaded.prep.image_size} px; {len(records)} {args.split} photos, beam "
          f"{args.beam}; gate: INT8 rule, |ΔCIDEr| {THRESHOLDS['int8'].max_delta_cider:g}")
    print("| side | CIDEr-D | ΔCIDEr (95% interval) | gate | encoder ms (batch 1, 1 thread) | vs first |")
    print("|---|---|---|---|---|---|")
    with Evaluator(spice=False) as evaluator:
        for size in sizes:
            sized = replace(loaded, prep=replace(loaded.prep, image_size=size))
            features = encode_images(sized, [r.path for r in records], progress=True)
            hyps = search_features(sized.model.decoder, features, sized.vocab, options)
            captions = {r.image_id: sized.vocab.decode(h.tokens) for r, h in zip(records, hyps, strict=True)}
            scores = score_captions(records, captions, options, evaluator=evaluator).scores
            per_image = np.array([100 * scores.per_image_cider[r.image_id] for r in records])
            milliseconds = encoder_ms(sized, timing_photos)
            if reference is None:
                reference = (per_image, milliseconds)
                row = f"| {size} | {per_image.mean():.1f} | reference | - | {milliseconds:.1f} | 1.00x |"
            else:
                delta, (low, high), verdict = judge(reference[0], per_image, THRESHOLDS["int8"].max_delta_cider)
                row = (f"| {size} | {per_image.mean():.1f} | {delta:+.2f} ({low:+.2f} .. {high:+.2f}) | "
                       f"{verdict.outcome} | {milliseconds:.1f} | {reference[1] / milliseconds:.2f}x |")
            print(row, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
