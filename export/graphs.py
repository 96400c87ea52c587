"""EncoderGraph / StepGraph: a captioner's two halves with flat, named tensor I/O exactly as ``edgecap.spec``.

The exporter sees plain positional tensors; the names come from the lists built
here and are written into the manifest, so the runtime never guesses them.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from edgecap import spec
from edgecap.models.caption_model import CaptionModel


def next_name(state_name: str) -> str:
    """Graph output name of an updated state tensor: ``state.h`` -> ``state.h.next``."""
    return f"{state_name}{spec.NEXT_SUFFIX}"


def graph_weights(captioner: CaptionModel) -> dict[str, np.ndarray]:
    """The model's float weights under the names the two graphs give them (their modules' attribute paths), for
    ``compact.store_exact_fp16`` to recognise a weight the exporter rescaled."""
    state = {name: value.detach().float().numpy() for name, value in captioner.state_dict().items()
             if value.is_floating_point()}
    return {**{f"captioner.{name}": value for name, value in state.items()},
            **{name: value for name, value in state.items() if name.startswith("decoder.")}}


class EncoderGraph(nn.Module):
    """pixels (N, 3, H, W) -> every memory tensor and the initial state, in ``output_names`` order."""

    def __init__(self, captioner: CaptionModel, memory_names: list[str], state_names: list[str]):
        super().__init__()
        self.captioner = captioner
        self.memory_names, self.state_names = memory_names, state_names

    @property
    def output_names(self) -> list[str]:
        return [*self.memory_names, *self.state_names]

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        memory, state = self.captioner.decoder.prepare(self.captioner.encode(pixels))
        return (*(memory[n] for n in self.memory_names), *(state[n] for n in self.state_names))


class StepGraph(nn.Module):
    """One decoding step for N rows; gathers state by ``reorder`` first, so the host never moves state."""

    def __init__(self, captioner: CaptionModel, memory_names: list[str], state_names: list[str], k: int):
        super().__init__()
        self.decoder = captioner.decoder
        self.memory_names, self.state_names, self.k = memory_names, state_names, k

    @property
    def input_names(self) -> list[str]:
        return [spec.TOKENS, spec.STEP, spec.REORDER, *self.state_names, *self.memory_names]

    @property
    def output_names(self) -> list[str]:
        return [spec.TOPK_LOGPROBS, spec.TOPK_IDS, spec.LOGPROBS, *map(next_name, self.state_names), spec.ATTENTION]

    def forward(self, tokens: torch.Tensor, step: torch.Tensor, reorder: torch.Tensor,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        count = len(self.state_names)
        state = {n: t.index_select(0, reorder) for n, t in zip(self.state_names, tensors[:count], strict=True)}
        memory = dict(zip(self.memory_names, tensors[count:], strict=True))
        logprobs, new_state, attention = self.decoder.step(tokens, state, memory, step)
        top = logprobs.topk(self.k, dim=-1)
        # The LSTM family ignores the position; keep it a real graph input so every family has one step signature.
        top_values = top.values + 0 * step.to(top.values.dtype)
        return (top_values, top.indices, logprobs, *(new_state[n] for n in self.state_names), attention)


@torch.no_grad()
def tensor_names(captioner: CaptionModel, image_size: int) -> tuple[list[str], list[str]]:
    """(memory names, state names) the decoder's ``prepare`` produces at the model's input size, in a stable order."""
    memory, state = captioner.decoder.prepare(captioner.encode(torch.zeros(1, 3, image_size, image_size)))
    return sorted(memory), sorted(state)
