"""How much a model's captions depend on how its photos were compressed and on its encoder's BatchNorm mode.

Captions ``--images`` photos of a split (beam search, as ``edgecap eval``) under each condition and prints their
CIDEr-D (Java-free, idf from those photos' references), against the photos as stored with BatchNorm on its
running statistics, which is how ``edgecap caption`` and the exports see them:

- ``--reencode webp:50 jpeg:50``: each photo decoded, re-encoded at that quality and decoded again, as a deployed
  camera pipeline or a dataset carried in a smaller format would hand it over;
- ``--bn-batch 32``: also with the encoder's BatchNorm on the statistics of batches of that many photos, which
  is what an encoder fine-tuned in train mode sees (``--finetune-encoder``; see ``encoder.frozen_batchnorm``).

Usage: python benchmarks/encoder_shift.py [MODEL] --data flickr8k:DIR [--split dev] [--images 500]
       [--reencode webp:50 jpeg:75] [--bn-batch 32] [--beam 3]
"""

import argparse
import copy
import io
from pathlib import Path

import numpy as np
import torch
from edgecap.runtime.search import SearchOptions
from PIL import Image

from edgecap.data import load_dataset
from edgecap.models.encoder import grid_features
from edgecap.preprocess import read_rgb, to_array
from edgecap.torch_backend import search_features
from edgecap.training.checkpoint import load_model
from edgecap.training.cider import corpus_cider
from edgecap.vocab import tokenize

FORMATS = {"webp": "WEBP", "jpeg": "JPEG"}


def reencoded(image: Image.Image, codec: str) -> Image.Image:
    """``image`` after a round trip through ``codec`` (``webp:Q`` or ``jpeg:Q``; WebP at its slowest, best method)."""
    name, _, quality = codec.partition(":")
    buffer = io.BytesIO()
    image.save(buffer, FORMATS[name], quality=int(quality), **({"method": 6} if name == "webp" else {}))
    return Image.open(buffer).convert("RGB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, nargs="?", help="run directory or checkpoint (default: the shipped model)")
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--images", type=int, default=500, help="the split's first N photos")
    parser.add_argument("--reencode", nargs="*", default=["webp:50"], metavar="CODEC:QUALITY",
                        help=f"round trips to measure ({', '.join(FORMATS)} with a quality 1-100)")
    parser.add_argument("--bn-batch", type=int, default=32, help="photos per BatchNorm batch in train mode (0: skip)")
    parser.add_argument("--beam", type=int, default=3)
    args = parser.parse_args()
    for codec in args.reencode:
        name, _, quality = codec.partition(":")
        if name not in FORMATS or not quality.isdigit() or not 1 <= int(quality) <= 100:
            parser.error(f"--reencode {codec}: expected {'|'.join(FORMATS)}:QUALITY with QUALITY 1-100")

    loaded = load_model(args.model)
    records = load_dataset(args.data).split(args.split)[:args.images]
    references = {r.image_id: [tokenize(c) for c in r.captions] for r in records}
    photos = [read_rgb(r.path) for r in records]
    decoder = loaded.captioner.decoder.eval()
    options = SearchOptions(beam_size=args.beam)

    def score(codec: str | None, bn_batch: int) -> float:
        shown = photos if codec is None else [reencoded(p, codec) for p in photos]
        pixels = torch.from_numpy(np.stack([to_array(p, loaded.prep) for p in shown]))
        encoder = copy.deepcopy(loaded.captioner.encoder).train(bn_batch > 0)  # a copy: train mode moves running stats
        step = bn_batch or 32
        with torch.no_grad():
            features = torch.cat([grid_features(encoder, pixels[i:i + step]) for i in range(0, len(pixels), step)])
        hyps = search_features(decoder, features, loaded.vocab, options)
        candidates = {r.image_id: loaded.vocab.decode(h.tokens).split() for r, h in zip(records, hyps, strict=True)}
        return 100 * corpus_cider(references, candidates)

    print(f"{len(records)} {args.split} photos, beam {args.beam}; CIDEr-D (idf from these photos' references)")
    print("| photos | BatchNorm | CIDEr-D | change |\n|---|---|---|---|")
    baseline = score(None, 0)
    print(f"| as stored | running statistics | {baseline:.1f} | |", flush=True)
    rows = [(codec, 0) for codec in args.reencode] + ([(None, args.bn_batch)] if args.bn_batch else [])
    for codec, bn_batch in rows:
        value = score(codec, bn_batch)
        bn = f"batches of {bn_batch}" if bn_batch else "running statistics"
        print(f"| {codec or 'as stored'} | {bn} | {value:.1f} | {value - baseline:+.1f} |", flush=True)


if __name__ == "__main__":
    main()
