"""What a training step costs each way it can be computed, side by side on this machine.

Cross-entropy: a batch of captions drawn one by one (one photo each) against the same number of captions five to a
photo (``xe.captions_per_image=5``: each photo encoded once). Self-critical, for the Transformers: sampling through
the step loop with autograd against sampling without it and scoring the captions in one teacher-forced pass. Each
model runs at its Flickr8k size on random grid features of the shipped encoder's shape (81 x 1,280), with an
optimiser step; the ways alternate and the median of ``--runs`` is reported, so the ratios are measured together.

    python benchmarks/train_step.py [--models sat,a2,glied] [--runs 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from edgecap.config import XEConfig
from edgecap.models import MODELS, build_model
from edgecap.training.losses import xe_loss
from edgecap.training.scst import policy_samples, sample_captions
from edgecap.vocab import BOS, EOS

VOCAB, LOCATIONS, CHANNELS = 2600, 81, 1280  # Flickr8k's vocabulary at min count 5; Lite2's grid at 260 px
CAPTIONS, SCST_PHOTOS, SAMPLES = 128, 32, 5  # the flickr8k presets' xe.batch_size, scst.batch_images, scst.samples


def xe_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, per_photo: int) -> Callable[[], None]:
    """One cross-entropy step on CAPTIONS captions of 9-16 words, ``per_photo`` of them to a photo."""
    lengths = torch.randint(9, 17, (CAPTIONS,))
    tokens = torch.randint(4, VOCAB, (CAPTIONS, 18))
    tokens[:, 0] = BOS
    tokens[torch.arange(CAPTIONS), lengths + 1] = EOS
    photos = -(-CAPTIONS // per_photo)
    features, rows = torch.randn(photos, LOCATIONS, CHANNELS), torch.arange(CAPTIONS) // per_photo
    target = tokens[:, 1:]
    mask = (torch.arange(target.shape[1]) <= lengths[:, None]).float()

    def step():
        out = model(features, tokens[:, :-1], rows=rows)
        loss, _ = xe_loss(out, target, mask, XEConfig(label_smoothing=0.2), n_tokens=mask.sum(), n_rows=CAPTIONS)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


def scst_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sample: Callable) -> Callable[[], None]:
    """One policy-gradient step on SCST_PHOTOS photos x SAMPLES sampled captions (the same draws for each way)."""
    features = torch.randn(SCST_PHOTOS, LOCATIONS, CHANNELS)

    def step():
        torch.manual_seed(0)
        tokens, logprobs, mask = sample(model, features, samples=SAMPLES, max_length=16)
        loss = -(torch.randn(len(tokens), 1) * logprobs * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


def median_seconds(steps: dict[str, Callable[[], None]], runs: int) -> dict[str, float]:
    """Median seconds of each step, alternating between them so that drifts in the machine hit all alike."""
    times = {name: [] for name in steps}
    for step in steps.values():
        step()  # warm-up
    for _ in range(runs):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="sat,a2,glied", help="model ids, comma-separated")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.threads} threads; median of {args.runs} steps each; seconds per step\n")
    print("| model | step | one way | the other | ratio |\n|---|---|---|---|---|")
    for model_id in args.models.split(","):
        torch.manual_seed(0)
        model = build_model(model_id, {"vocab_size": VOCAB, "feature_dim": CHANNELS, "num_locations": LOCATIONS,
                                       **MODELS[model_id].sizes["base"]}).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        xe = median_seconds({"1": xe_step(model, optimizer, 1), "5": xe_step(model, optimizer, 5)}, args.runs)
        print(f"| {model_id} | cross-entropy, {CAPTIONS} captions | one photo each: {xe['1']:.2f} "
              f"| five to a photo: {xe['5']:.2f} | {xe['1'] / xe['5']:.2f}x |")
        if hasattr(model, "teacher_forced"):
            rl = median_seconds({"loop": scst_step(model, optimizer, sample_captions),
                                 "pass": scst_step(model, optimizer, policy_samples)}, args.runs)
            print(f"| {model_id} | self-critical, {SCST_PHOTOS} x {SAMPLES} samples | autograd through the step "
                  f"loop: {rl['loop']:.2f} | one scoring pass: {rl['pass']:.2f} | {rl['loop'] / rl['pass']:.2f}x |")


if __name__ == "__main__":
    main()
