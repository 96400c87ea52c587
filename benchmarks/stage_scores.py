"""What each stage of a multi-stage decoder (Stack-Captioning) says, and what coarse-to-fine RL would reward it for.

For every checkpoint, on the first ``--images`` dev photos: each stage's greedy caption scored with CIDEr-D (every
stage takes its own argmax while the last stage's word is fed back, as ``sample_captions(..., stages=True)``
decodes), then ``--samples`` captions per photo sampled the way the self-critical phase samples them (training mode,
so with dropout), with each stage's mean reward and the coarse-to-fine advantage of eq. 15 under the mean baseline.
A stage's mean advantage is zero when its only term is the baseline's; a non-zero mean is the inter-stage term
``r(w^i) - r(w^{i-1})``, which rewards or punishes every sample of the stage alike. Run it on a cross-entropy
checkpoint and on one after a coarse-to-fine epoch to see which stages the RL moved.

    python benchmarks/stage_scores.py CHECKPOINT [CHECKPOINT ...] --data flickr8k:DIR [--images 300] [--samples 5]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from edgecap.checkpoint import load_model
from edgecap.cider import CiderD
from edgecap.data import load_dataset
from edgecap.data.features import cached_features
from edgecap.shipped import shipped_file_or
from edgecap.training.c2f import stage_advantages
from edgecap.training.data import tokenised_references
from edgecap.training.scst import leave_one_out_mean, sample_captions, words_of


def stage_rewards(decoder: torch.nn.Module, features: torch.Tensor, ids: list[str], *, cider: CiderD, vocab,
                  samples: int, max_length: int, greedy: bool) -> np.ndarray:
    """(stages, len(ids) * samples) CIDEr-D of every stage's caption; rows image-major."""
    with torch.no_grad():
        tokens, _, _ = sample_captions(decoder, features, samples=samples, max_length=max_length, greedy=greedy,
                                       stages=True)
    rows = [i for i in ids for _ in range(samples)]
    return np.stack([cider.score(rows, words_of(stage, vocab)) for stage in tokens])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="run directories, .pt files or shipped ids (stackcap)")
    parser.add_argument("--data", required=True, help="dataset spec, e.g. flickr8k:DIR")
    parser.add_argument("--images", type=int, default=300, help="dev photos (0: all)")
    parser.add_argument("--samples", type=int, default=5, help="sampled captions per photo, as scst.samples")
    parser.add_argument("--max-length", type=int, default=20)
    parser.add_argument("--batch", type=int, default=50, help="photos per decode")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dev = load_dataset(args.data).split("dev")
    records = dev[: args.images or None]
    ids = [r.image_id for r in records]
    cider = CiderD(tokenised_references(records))
    print(f"{len(records)} dev photos, {args.samples} samples each; CIDEr-D x 100\n")
    print("| checkpoint | stage | greedy | sampled | sampled beats the stage before | mean C2F advantage |")
    print("|---|---|---|---|---|---|")
    for name in args.checkpoints:
        loaded = load_model(shipped_file_or(Path(name)))
        decoder = loaded.model.decoder
        if not hasattr(decoder, "stage_step"):
            raise SystemExit(f"{name}: a {loaded.model_id} decoder has one stage; this compares the stages of "
                             "Stack-Captioning")
        grid = cached_features(dev, loaded.encoder_config, loaded.prep, label="dev features")  # training's cache
        torch.manual_seed(args.seed)
        greedy, sampled = [], []
        for start in range(0, len(records), args.batch):
            features = torch.from_numpy(np.asarray(grid[start:start + args.batch], np.float32))
            batch_ids = ids[start:start + args.batch]
            decoder.eval()
            greedy.append(stage_rewards(decoder, features, batch_ids, cider=cider, vocab=loaded.vocab, samples=1,
                                        max_length=args.max_length, greedy=True))
            decoder.train()  # the self-critical phase samples with dropout on
            sampled.append(stage_rewards(decoder, features, batch_ids, cider=cider, vocab=loaded.vocab,
                                         samples=args.samples, max_length=args.max_length, greedy=False))
        greedy, sampled = np.concatenate(greedy, axis=1), np.concatenate(sampled, axis=1)
        baselines = leave_one_out_mean(sampled.reshape(len(sampled), len(records), args.samples))
        advantage = stage_advantages(sampled, baselines.reshape(sampled.shape))
        for stage in range(len(sampled)):
            beats = f"{100 * np.mean(sampled[stage] > sampled[stage - 1]):.1f}%" if stage else "-"
            print(f"| {name} | {stage + 1} of {len(sampled)} | {100 * greedy[stage].mean():.2f} "
                  f"| {100 * sampled[stage].mean():.2f} | {beats} | {100 * advantage[stage].mean():+.2f} |")


if __name__ == "__main__":
    main()
