"""Measure what each REINFORCE baseline leaves of hard attention's advantage, and how hard it pushes.

From a hard-attention run's ``last.pt``, on ``--batches`` random batches of its training captions (every row
sampling its locations), print the spread of the advantage log p(y|s,a) - b under the moving baseline (here
the batch mean, where the moving average settles) and under the per-caption one (``train.hard_baseline=caption``),
and the gradient norm of each REINFORCE term at lambda_r = 1 beside the words' cross-entropy gradient.

Usage: python benchmarks/hard_baseline_probe.py RUN_DIR [--batches 3] [--batch-size 128]
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from edgecap.data import load_dataset
from edgecap.training.hard_attention import caption_logprob, expected_context_logprob
from edgecap.training.loop import Trainer
from edgecap.training.runs import run_spec
from edgecap.vocab import PAD


def gradient_norm(loss: torch.Tensor, params: list[torch.Tensor]) -> float:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return float(torch.sqrt(sum((g ** 2).sum() for g in grads if g is not None)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()

    spec = run_spec(run_dir=args.run, spec=None, resume=True)
    trainer = Trainer(args.run, spec, load_dataset(spec.data))
    trainer.resume()
    decoder = trainer.captioner.decoder.train()
    params = [p for p in decoder.parameters() if p.requires_grad]
    rng = np.random.default_rng(0)
    for batch in range(args.batches):
        rows = rng.choice(len(trainer.pairs.tokens), args.batch_size, replace=False)
        unflipped = np.zeros(len(rows), dtype=bool)
        tokens = torch.from_numpy(trainer.pairs.batch(rows, unflipped, trainer.mirrored_tokens))
        tokens = tokens[:, :int((tokens != PAD).sum(1).max())]
        features = trainer.train_features.get(trainer.pairs.image_index[rows], unflipped)
        sampled = torch.ones(len(rows), dtype=torch.bool)
        out = decoder(features, tokens[:, :-1], hard=True, expected=~sampled)
        target = tokens[:, 1:]
        n_tokens = (target != PAD).sum()
        seq_logprob = caption_logprob(out["logprobs"], target)
        location_logprob = (out["location_logprob"] * (target != PAD)).sum(1)
        xe_norm = gradient_norm(-seq_logprob.sum() / n_tokens, params)
        seq_logprob = seq_logprob.detach()
        baselines = {"moving": seq_logprob.mean(),
                     "caption": expected_context_logprob(decoder, features, tokens, sampled)}
        for name, baseline in baselines.items():
            advantage = seq_logprob - baseline
            reinforce_norm = gradient_norm((advantage * location_logprob).sum() / n_tokens, params)
            print(f"batch {batch} {name:>7}: advantage mean {float(advantage.mean()):6.2f} "
                  f"std {float(advantage.std()):6.2f}  |grad REINFORCE| {reinforce_norm:.3f}  "
                  f"|grad cross-entropy| {xe_norm:.3f}")


if __name__ == "__main__":
    main()
