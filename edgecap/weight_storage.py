"""How a checkpoint stores its weights on disk: fp32, fp16, or weight-only INT8 for the shipped file.

The shipped default travels inside the repository, so its size matters: INT8 storage keeps each large matrix
or convolution kernel as int8 with one fp16 scale per output channel (symmetric, ``w ≈ q * scale``), half the
size of fp16. Every reader of a checkpoint goes through ``stored_weights``, which turns any of the three back
into the fp32 state dict the model loads; the INT8 rounding is then part of the model, so export and parity
see exactly the weights that PyTorch runs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from edgecap.errors import ModelError

INT8 = ".int8"
SCALE = ".int8_scale"
MIN_INT8_ELEMENTS = 4096  # smaller tensors (biases, norms, tiny kernels) stay fp16: INT8 would save nothing


def pack_int8(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every floating tensor of rank >= 2 and >= MIN_INT8_ELEMENTS values stored as int8 plus
    per-output-channel fp16 scales; the other floating tensors as fp16."""
    packed = {}
    for name, value in state.items():
        if not value.is_floating_point():
            packed[name] = value
        elif value.dim() >= 2 and value.numel() >= MIN_INT8_ELEMENTS:
            weight = value.detach().float()
            reduce = tuple(range(1, weight.dim()))
            scale = (weight.abs().amax(dim=reduce, keepdim=True) / 127).clamp_min(1e-12).half()
            packed[name + INT8] = torch.round(weight / scale.float()).clamp(-127, 127).to(torch.int8)
            packed[name + SCALE] = scale
        else:
            packed[name] = value.detach().half()
    return packed


def require_int8_scales(state: dict[str, torch.Tensor], source: Path) -> None:
    """A one-line ModelError naming ``source`` when an INT8 tensor of ``state`` lost its scale (a damaged file)."""
    unscaled = [name for name in state if name.endswith(INT8) and name[: -len(INT8)] + SCALE not in state]
    if unscaled:
        raise ModelError(f"{source}: INT8 weights without their scales ({', '.join(unscaled[:3])}); the file is "
                         "damaged, copy or ship it again")


def stored_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fp32 state dict a stored one (fp32, fp16 or ``pack_int8``'s) stands for."""
    weights = {}
    for name, value in state.items():
        if name.endswith(SCALE):
            continue
        if name.endswith(INT8):
            base = name[: -len(INT8)]
            weights[base] = value.float() * state[base + SCALE].float()
        else:
            weights[name] = value.float() if value.is_floating_point() else value
    return weights


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 of a state dict's names and fp32 values: a decoder that shares the shipped encoder records it, so a
    re-shipped encoder cannot silently change what that decoder sees."""
    digest = hashlib.sha256()
    for name in sorted(state):
        value = state[name].detach().cpu()
        digest.update(name.encode())
        digest.update((value.float() if value.is_floating_point() else value).contiguous().numpy().tobytes())
    return digest.hexdigest()
