"""The PyTorch reference backend: a decoder's step contract behind the runtime's StepSession.

The runtime's beam search drives this exactly as it drives ONNX Runtime or
TensorRT, so parity measures only what export and precision change.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from edgecap.runtime.search import Hypothesis, SearchOptions, bad_ending_ids, beam_search
from edgecap.vocab import Vocab


class TorchSession:
    """Holds memory and state as torch tensors for N rows; implements the runtime's StepSession."""

    def __init__(self, decoder: nn.Module, features: torch.Tensor, k: int):
        self.decoder = decoder
        self.memory, self.state = decoder.prepare(features)
        self.k = k

    @torch.no_grad()
    def step(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        logprobs, attention = self._advance(tokens, reorder, position)
        top = logprobs.topk(min(self.k, logprobs.shape[-1]), dim=-1)
        return top.values.numpy(), top.indices.numpy(), attention.numpy()

    @torch.no_grad()
    def step_logprobs(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> np.ndarray:
        """Full log-probs float32 (N, V) of one step, for parity's teacher-forced check."""
        return self._advance(tokens, reorder, position)[0].numpy()

    def _advance(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.from_numpy(np.ascontiguousarray(reorder, dtype=np.int64))
        state = {name: value.index_select(0, rows) for name, value in self.state.items()}
        logprobs, self.state, attention = self.decoder.step(torch.from_numpy(tokens.astype(np.int64)), state,
                                                            self.memory, torch.tensor(position))
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


@torch.no_grad()
def search_features(decoder: nn.Module, features: np.ndarray | torch.Tensor, vocab: Vocab, options: SearchOptions, *,
                    batch_size: int = 100) -> list[Hypothesis]:
    """Best hypothesis per image of grid features (N, L, C), decoded in batches of ``batch_size`` images."""
    decoder.eval()
    banned_endings = bad_ending_ids(vocab.words, options.bad_endings)
    k = options.candidates or 2 * options.beam_size
    best: list[Hypothesis] = []
    for start in range(0, len(features), batch_size):
        chunk = features[start:start + batch_size]
        # A read-only fp16 memmap slice is copied to a writable float32 array (torch warns on read-only memory).
        chunk = chunk.float() if isinstance(chunk, torch.Tensor) else torch.from_numpy(np.array(chunk, np.float32))
        session = TorchSession(decoder, chunk, k)
        for hyps in beam_search(session, len(chunk), options, bad_ending_ids=banned_endings):
            best.append(hyps[0])
    return best


def captions_of(hypotheses: Sequence[Hypothesis], vocab: Vocab) -> list[str]:
    return [vocab.decode(h.tokens) for h in hypotheses]
