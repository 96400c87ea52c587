"""Probe a self-critical learning rate before spending an epoch on it.

From a run's ``best.pt``, take ``--updates`` self-critical steps (SCST, or C2F for multi-stage decoders) on the
run's own train photos in its own epoch-1 order, and print dev greedy CIDEr-D before and after. A rate that
lowers it within 40 steps lowered it over whole epochs in every run measured here.

Usage: python benchmarks/rl_probe.py RUN_DIR --objective c2f --lr 1e-5 [--updates 40] [--dev-images 300]
"""

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import torch

from edgecap.data import load_dataset
from edgecap.training.c2f import c2f_loss
from edgecap.training.checkpoint import read_checkpoint
from edgecap.training.cider import CiderD
from edgecap.training.data import tokenised_references
from edgecap.training.loop import Trainer
from edgecap.training.runs import run_spec
from edgecap.training.scst import scst_loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--objective", choices=("scst", "c2f"), default="scst")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--dev-images", type=int, default=300)
    args = parser.parse_args()

    spec = run_spec(run_dir=args.run, spec=None, resume=True)
    cfg = dataclasses.replace(spec.train, eval_images=args.dev_images)
    trainer = Trainer(args.run, dataclasses.replace(spec, train=cfg), load_dataset(spec.data))
    trainer._load_weights(read_checkpoint(args.run / "best.pt"))
    before = trainer.evaluate()
    trainer.optimizer = trainer._optimizer(args.lr)
    cider = CiderD(tokenised_references(trainer.train_records))
    order = np.random.default_rng(cfg.seed + 1000).permutation(len(trainer.train_records))
    trainer.captioner.train()
    trainer.captioner.encoder.eval()
    decoder, rewards = trainer.captioner.decoder, []
    for update in range(args.updates):
        rows = order[update * cfg.scst_batch_images:(update + 1) * cfg.scst_batch_images]
        features = trainer.train_features.get(rows)
        ids = [trainer.train_records[i].image_id for i in rows]
        objective = c2f_loss if args.objective == "c2f" else scst_loss
        loss, reward = objective(decoder, features, ids, cider=cider, vocab=trainer.vocab, samples=cfg.scst_samples,
                                 max_length=cfg.max_caption_length, baseline=cfg.scst_baseline)
        trainer._update(loss)
        rewards.append(100 * reward)
    after = trainer.evaluate()
    print(f"{args.objective} lr {args.lr:g}, {args.updates} updates of {cfg.scst_batch_images} photos: dev-"
          f"{args.dev_images} greedy CIDEr-D {before:.2f} -> {after:.2f}; train reward first 10 "
          f"{np.mean(rewards[:10]):.1f}, last 10 {np.mean(rewards[-10:]):.1f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
