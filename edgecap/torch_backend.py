"""The PyTorch reference backend, and captioning and evaluation of a checkpoint through it.

A decoder's step contract sits behind the runtime's StepSession, so the runtime's beam search drives PyTorch
exactly as it drives ONNX Runtime or TensorRT, and parity measures only what export and precision change.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from edgecap.checkpoint import LoadedModel
from edgecap.data.features import cached_features
from edgecap.data.records import ImageRecord
from edgecap.preprocess import load_images
from edgecap.runtime.decoding import decode
from edgecap.runtime.pipeline import Caption, caption_of
from edgecap.runtime.search import Hypothesis, SearchOptions
from edgecap.vocab import Vocab

if TYPE_CHECKING:  # scoring needs pycocoevalcap (the metrics extra); captioning does not
    from edgecap.evaluation import EvalResult, Evaluator


class TorchSession:
    """Holds memory and state as torch tensors for N rows, on the features' device (a GPU during training's dev
    selection); implements the runtime's StepSession, whose arrays stay numpy on the CPU."""

    def __init__(self, decoder: nn.Module, features: torch.Tensor, k: int):
        self.decoder = decoder
        self.device = features.device
        self.memory, self.state = decoder.prepare(features)
        self.k = k

    @torch.no_grad()
    def step(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        logprobs, attention = self._advance(tokens, reorder, position)
        top = logprobs.topk(min(self.k, logprobs.shape[-1]), dim=-1)
        return top.values.cpu().numpy(), top.indices.cpu().numpy(), attention.cpu().numpy()

    @torch.no_grad()
    def step_logprobs(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> np.ndarray:
        """Full log-probs float32 (N, V) of one step, for parity's teacher-forced check."""
        return self._advance(tokens, reorder, position)[0].cpu().numpy()

    def _advance(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(np.ascontiguousarray(reorder, dtype=np.int64)).to(self.device)
        state = {name: value.index_select(0, rows) for name, value in self.state.items()}
        tokens = torch.from_numpy(tokens.astype(np.int64)).to(self.device)
        logprobs, self.state, attention = self.decoder.step(tokens, state, self.memory,
                                                            torch.tensor(position, device=self.device))
        return logprobs, attention

    def tile(self, beam_size: int) -> None:
        self.memory, self.state = ({name: value.repeat_interleave(beam_size, dim=0) for name, value in d.items()}
                                   for d in (self.memory, self.state))


class TorchBackend:
    """The eager PyTorch model behind the runtime's backend interface: ``encode(pixels) -> StepSession``."""

    def __init__(self, captioner: nn.Module, k: int):
        self.captioner = captioner.eval()
        self.k = k

    @torch.no_grad()
    def encode(self, pixels: np.ndarray) -> TorchSession:
        """pixels float32 (N, 3, H, W) -> a session holding their memory and initial state."""
        features = self.captioner.encode(torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32)))
        return TorchSession(self.captioner.decoder, features, self.k)


def compiled(captioner: nn.Module) -> nn.Module:
    """``captioner`` with its encoder and decoder step compiled by ``torch.compile`` (inductor), the encoder in
    channels_last: the PyTorch a user would try before exporting. Compiling happens at the first call of each shape,
    so it is paid in warm-up (the bench reports it apart)."""
    captioner.eval()
    captioner.encoder.to(memory_format=torch.channels_last)
    eager_encode = captioner.encode

    def encode(pixels: torch.Tensor) -> torch.Tensor:
        return eager_encode(pixels.contiguous(memory_format=torch.channels_last))

    captioner.encode = torch.compile(encode, dynamic=False)
    captioner.decoder.step = torch.compile(captioner.decoder.step, dynamic=False)
    return captioner


@torch.no_grad()
def search_features(decoder: nn.Module, features: np.ndarray | torch.Tensor, vocab: Vocab, options: SearchOptions, *,
                    batch_size: int = 100) -> list[Hypothesis]:
    """Best hypothesis per image of grid features (N, L, C), decoded in batches of ``batch_size`` images."""
    return [found[0] for found in search_features_n(decoder, features, vocab, options, batch_size=batch_size)]


@torch.no_grad()
def search_features_n(decoder: nn.Module, features: np.ndarray | torch.Tensor, vocab: Vocab, options: SearchOptions,
                      *, batch_size: int = 100) -> list[list[Hypothesis]]:
    """``options.n_best`` hypotheses per image of grid features (N, L, C), best first, searched on the decoder's
    device."""
    decoder.eval()
    device = next(decoder.parameters()).device
    found: list[list[Hypothesis]] = []
    for start in range(0, len(features), batch_size):
        chunk = features[start:start + batch_size]
        # A read-only fp16 memmap slice is copied to a writable float32 array (torch warns on read-only memory).
        chunk = chunk.float() if isinstance(chunk, torch.Tensor) else torch.from_numpy(np.array(chunk, np.float32))
        found += decode(TorchSession(decoder, chunk.to(device), options.k), len(chunk), options, vocab)
    return found


def captions_of(hypotheses: Sequence[Hypothesis], vocab: Vocab) -> list[str]:
    return [vocab.decode(h.tokens) for h in hypotheses]


@torch.no_grad()
def encode_images(loaded: LoadedModel, paths: Sequence[Path], *, batch_size: int = 32,
                  progress: bool = False) -> torch.Tensor:
    """Grid features (N, L, C) of image files, through the model's own encoder."""
    loaded.model.eval()
    chunks = []
    starts = range(0, len(paths), batch_size)
    for start in tqdm(starts, desc="encoding", unit="batch", disable=not progress, leave=False):
        pixels = torch.from_numpy(load_images(paths[start:start + batch_size], loaded.prep))
        chunks.append(loaded.model.encode(pixels))
    return torch.cat(chunks)


def caption_images(loaded: LoadedModel, paths: Sequence[Path], options: SearchOptions) -> list[Caption]:
    """One caption per image file, best beam first."""
    features = encode_images(loaded, paths)
    found = search_features_n(loaded.model.decoder, features, loaded.vocab, options)
    return [caption_of(Path(p), hyps, loaded.vocab, options.require_words)
            for p, hyps in zip(paths, found, strict=True)]


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
    hyps = search_features(loaded.model.decoder, features, loaded.vocab, options)
    captions = {r.image_id: loaded.vocab.decode(h.tokens) for r, h in zip(records, hyps, strict=True)}
    return score_captions(records, captions, options, evaluator=evaluator)
