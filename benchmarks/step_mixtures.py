"""Does mixing step probabilities lift the shipped SAT's dev CIDEr-D without retraining?

Two mixtures, each scored at beam 3 on Flickr8k dev with pycocoevalcap for every mixing weight given:
``--with RUN`` averages the shipped decoder with a second decoder trained on the same frozen encoder (a model
ensemble); ``--mirror`` averages the shipped decoder over each photo and its mirror image (test-time flipping,
which the training recipe's mirrored photos make fair). The step returns log(w p_shipped + (1 - w) p_other),
so weight 1.0 reproduces the shipped model and is the baseline. Neither is in the exported runtime: this measures
whether one would be worth putting there.

Usage: python benchmarks/step_mixtures.py --data flickr8k:DIR (--with RUN | --mirror) [--weights 1.0,0.75,0.5]
"""

import argparse
import dataclasses
import math
import sys
import time

import numpy as np
import torch
from edgecap.runtime.search import SearchOptions
from torch import nn

from edgecap.data import load_dataset
from edgecap.data.features import cached_features
from edgecap.data.views import MIRRORED
from edgecap.evaluation import Evaluator
from edgecap.torch_backend import captions_of, search_features
from edgecap.training.checkpoint import DEFAULT_MODEL, LoadedModel, load_model


class StepMixture(nn.Module):
    """Decoders behind one step contract; decoder i reads channel block i of the features it is prepared with."""

    def __init__(self, decoders: list[nn.Module], weights: list[float]):
        super().__init__()
        self.decoders = nn.ModuleList(decoders)
        self.log_weights = [math.log(w) if w > 0 else -math.inf for w in weights]

    def prepare(self, features: torch.Tensor) -> tuple[dict, dict]:
        memory, state = {}, {}
        views = features.chunk(len(self.decoders), dim=-1)
        for i, (decoder, view) in enumerate(zip(self.decoders, views, strict=True)):
            own_memory, own_state = decoder.prepare(view)
            memory.update({f"{i}.{k}": v for k, v in own_memory.items()})
            state.update({f"{i}.{k}": v for k, v in own_state.items()})
        return memory, state

    def step(self, tokens, state, memory, position):
        mixed, next_state, first_attention = [], {}, None
        for i, decoder in enumerate(self.decoders):
            logprobs, own_next, attention = decoder.step(tokens, _member(state, i), _member(memory, i), position)
            mixed.append(logprobs + self.log_weights[i])
            next_state.update({f"{i}.{k}": v for k, v in own_next.items()})
            first_attention = attention if first_attention is None else first_attention
        return torch.logsumexp(torch.stack(mixed), dim=0), next_state, first_attention


def _member(tensors: dict[str, torch.Tensor], i: int) -> dict[str, torch.Tensor]:
    """Decoder i's own entries of a mixture's flat state or memory, under their own names."""
    prefix = f"{i}."
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def same_encoder(a: LoadedModel, b: LoadedModel) -> bool:
    ours, theirs = a.captioner.encoder.state_dict(), b.captioner.encoder.state_dict()
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="flickr8k:DIR")
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--with", dest="other", help="a run or checkpoint trained on the shipped model's encoder")
    kind.add_argument("--mirror", action="store_true", help="mix each photo with its mirror image")
    parser.add_argument("--weights", default="1.0,0.75,0.5", help="the shipped decoder's (plain view's) shares")
    args = parser.parse_args()
    torch.set_num_threads(1)

    shipped = load_model(DEFAULT_MODEL)
    other = load_model(args.other) if args.other else shipped
    if other.vocab.words != shipped.vocab.words or not same_encoder(shipped, other):
        sys.exit(f"error: {args.other}: not trained on the shipped model's encoder and vocabulary; pass a run made "
                 f"with --set encoder.weights={DEFAULT_MODEL}")
    # The shipped file's own encoder, cached under its sha256 like a run that names it in encoder.weights.
    encoder = dataclasses.replace(shipped.encoder_config, weights=str(DEFAULT_MODEL))
    records = load_dataset(args.data).split("dev")
    plain = cached_features(records, encoder, shipped.prep, label="dev features")
    second = cached_features(records, encoder, shipped.prep, label="dev mirrored", view=MIRRORED) if args.mirror \
        else plain
    views = np.concatenate([np.asarray(plain), np.asarray(second)], axis=-1)
    references = {r.image_id: list(r.captions) for r in records}
    with Evaluator(spice=False) as evaluator:
        for weight in (float(w) for w in args.weights.split(",")):
            started = time.perf_counter()
            mixture = StepMixture([shipped.captioner.decoder, other.captioner.decoder], [weight, 1 - weight]).eval()
            captions = captions_of(search_features(mixture, views, shipped.vocab, SearchOptions(beam_size=3)),
                                   shipped.vocab)
            candidates = dict(zip([r.image_id for r in records], captions, strict=True))
            metrics = evaluator.score(references, candidates).metrics
            scores = " ".join(f"{name} {100 * value:.2f}" for name, value in metrics.items())
            print(f"shipped share {weight:.2f}: {scores} ({time.perf_counter() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
