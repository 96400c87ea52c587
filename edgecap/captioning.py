"""Caption images and evaluate a PyTorch model: the library behind ``edgecap caption`` and ``edgecap eval``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm import tqdm

from edgecap.data.features import cached_features
from edgecap.data.records import ImageRecord
from edgecap.preprocess import load_images
from edgecap.runtime.pipeline import Caption
from edgecap.runtime.search import SearchOptions
from edgecap.torch_backend import search_features
from edgecap.training.checkpoint import LoadedModel

if TYPE_CHECKING:  # scoring needs pycocoevalcap (the metrics extra); captioning does not
    from edgecap.evaluation import EvalResult, Evaluator


@torch.no_grad()
def encode_images(loaded: LoadedModel, paths: Sequence[Path], *, batch_size: int = 32,
                  progress: bool = False) -> torch.Tensor:
    """Grid features (N, L, C) of image files, through the model's own encoder."""
    loaded.captioner.eval()
    chunks = []
    starts = range(0, len(paths), batch_size)
    for start in tqdm(starts, desc="encoding", unit="batch", disable=not progress, leave=False):
        pixels = torch.from_numpy(load_images(paths[start:start + batch_size], loaded.prep))
        chunks.append(loaded.captioner.encode(pixels))
    return torch.cat(chunks)


def caption_images(loaded: LoadedModel, paths: Sequence[Path], options: SearchOptions) -> list[Caption]:
    """One caption per image file, best beam first."""
    features = encode_images(loaded, paths)
    hyps = search_features(loaded.captioner.decoder, features, loaded.vocab, options)
    return [Caption(Path(p), loaded.vocab.decode(h.tokens), h) for p, h in zip(paths, hyps, strict=True)]


def split_features(loaded: LoadedModel, records: Sequence[ImageRecord]) -> np.ndarray | torch.Tensor:
    """Features of a dataset split; the on-disk cache serves frozen encoders with the package's ImageNet weights
    (an encoder read from a file is encoded from the checkpoint's own copy: the file may have moved or changed)."""
    config = loaded.encoder_config
    if config.name.startswith("efficientnet_lite") and not config.finetune and not config.weights:
        return cached_features(records, config, loaded.prep, label="eval features")
    return encode_images(loaded, [r.path for r in records], progress=True)


def evaluate_model(loaded: LoadedModel, records: Sequence[ImageRecord], options: SearchOptions, *,
                   evaluator: Evaluator) -> EvalResult:
    """Caption every record with beam search and score against its human references."""
    from edgecap.evaluation import score_captions

    features = split_features(loaded, records)
    hyps = search_features(loaded.captioner.decoder, features, loaded.vocab, options)
    captions = {r.image_id: loaded.vocab.decode(h.tokens) for r, h in zip(records, hyps, strict=True)}
    return score_captions(records, captions, options, evaluator=evaluator)
