"""How a checkpoint stores its weights on disk: fp32, fp16, or weight-only INT8 or INT4 for the shipped file.

The shipped checkpoints travel inside the repository, so their size matters: INT8 storage keeps each large matrix
or convolution kernel as int8 with one fp16 scale per output channel (symmetric, ``w ≈ q * scale``), half the
size of fp16; INT4 storage packs two 4-bit values to a byte with one fp16 scale per group of ``INT4_GROUP``
inputs of a row, a little over a quarter of fp16's size (a per-row scale is too coarse at 4 bits). Every reader of
a checkpoint goes through ``stored_weights``, which turns any of them back into the fp32 state dict the model loads;
the rounding is then part of the model, so export and parity see exactly the weights that PyTorch runs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from edgecap.errors import ModelError

INT8 = ".int8"
SCALE = ".int8_scale"
INT4 = ".int4"  # uint8 (rows, ceil(groups * INT4_GROUP / 2)): two values to a byte, stored as q + 8, low nibble first
INT4_SCALE = ".int4_scale"  # fp16 (rows, groups)
INT4_SHAPE = ".int4_shape"  # int64: the tensor's own shape, which the padded rows no longer tell
INT4_GROUP = 64  # inputs per scale
MIN_INT8_ELEMENTS = 4096  # smaller tensors (biases, norms, tiny kernels) stay fp16: INT8 or INT4 would save nothing


def _quantised(value: torch.Tensor) -> bool:
    return value.is_floating_point() and value.dim() >= 2 and value.numel() >= MIN_INT8_ELEMENTS


def _fp16_scale(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` as fp16, 1 where it is 0 there: an all-zero row or group (or one below fp16's range) rounds to zeros
    at any scale, and a zero one would divide it into NaN."""
    scale = scale.half()
    scale[scale == 0] = 1.0
    return scale


def pack_int8(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every floating tensor of rank >= 2 and >= MIN_INT8_ELEMENTS values stored as int8 plus
    per-output-channel fp16 scales; the other floating tensors as fp16."""
    packed = {}
    for name, value in state.items():
        if not value.is_floating_point():
            packed[name] = value
        elif _quantised(value):
            weight = value.detach().float()
            reduce = tuple(range(1, weight.dim()))
            scale = _fp16_scale(weight.abs().amax(dim=reduce, keepdim=True) / 127)
            packed[name + INT8] = torch.round(weight / scale.float()).clamp(-127, 127).to(torch.int8)
            packed[name + SCALE] = scale
        else:
            packed[name] = value.detach().half()
    return packed


def pack_int4(state: dict[str, torch.Tensor], group: int = INT4_GROUP) -> dict[str, torch.Tensor]:
    """``state`` with every tensor ``pack_int8`` would store as int8 stored as 4-bit values in [-7, 7], one fp16
    scale per ``group`` (even) consecutive inputs of an output row (its last dimensions flattened); the others as
    fp16."""
    if group < 2 or group % 2:
        raise ValueError(f"an INT4 group holds an even number of values, got {group}")
    packed = {}
    for name, value in state.items():
        if not _quantised(value):
            packed[name] = value.detach().half() if value.is_floating_point() else value
            continue
        rows = value.detach().float().reshape(value.shape[0], -1)
        groups = -(-rows.shape[1] // group)
        grouped = torch.nn.functional.pad(rows, (0, groups * group - rows.shape[1])).view(len(rows), groups, group)
        scale = _least_squares_scale(grouped)
        q = (torch.round(grouped / scale.float()).clamp(-7, 7) + 8).to(torch.uint8).view(len(rows), -1)
        packed[name + INT4] = q[:, 0::2] | (q[:, 1::2] << 4)
        packed[name + INT4_SCALE] = scale.squeeze(-1)
        packed[name + INT4_SHAPE] = torch.tensor(value.shape, dtype=torch.int64)
    return packed


def _least_squares_scale(grouped: torch.Tensor) -> torch.Tensor:
    """Each group's fp16 scale: of its largest value / 7 clipped by 0 to 30%, the one whose rounding errs least
    (seven levels a side leave most of a group's values too few steps unless a rare outlier is clipped)."""
    peak = grouped.abs().amax(dim=-1, keepdim=True) / 7

    def error(scale: torch.Tensor) -> torch.Tensor:
        return ((torch.round(grouped / scale.float()).clamp(-7, 7) * scale.float() - grouped) ** 2).sum(-1, True)

    best = _fp16_scale(peak)
    best_error = error(best)
    for clip in (0.95, 0.9, 0.85, 0.8, 0.75, 0.7):
        scale = _fp16_scale(peak * clip)
        scale_error = error(scale)
        better = scale_error < best_error
        best, best_error = torch.where(better, scale, best), torch.where(better, scale_error, best_error)
    return best


def _unpack_int4(state: dict[str, torch.Tensor], base: str) -> torch.Tensor:
    packed, scale = state[base + INT4], state[base + INT4_SCALE].float()
    shape = torch.Size(state[base + INT4_SHAPE].tolist())
    q = torch.stack([packed & 15, packed >> 4], dim=-1).view(len(packed), -1).float() - 8
    values = q.view(*scale.shape, -1) * scale.unsqueeze(-1)
    return values.view(len(values), -1)[:, : shape[1:].numel()].reshape(shape)


def require_scales(state: dict[str, torch.Tensor], source: Path) -> None:
    """A one-line ModelError naming ``source`` when an INT8 or INT4 tensor of ``state`` lost its scale or shape (a
    damaged file)."""
    unscaled = [name for name in state if name.endswith(INT8) and name[: -len(INT8)] + SCALE not in state]
    unscaled += [name for name in state if name.endswith(INT4)
                 and not {name[: -len(INT4)] + INT4_SCALE, name[: -len(INT4)] + INT4_SHAPE} <= state.keys()]
    if unscaled:
        raise ModelError(f"{source}: quantised weights without their scales ({', '.join(unscaled[:3])}); the file is "
                         "damaged, copy or ship it again")


def stored_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fp32 state dict a stored one (fp32, fp16, ``pack_int8``'s or ``pack_int4``'s) stands for."""
    weights = {}
    for name, value in state.items():
        if name.endswith((SCALE, INT4_SCALE, INT4_SHAPE)):
            continue
        if name.endswith(INT4):
            weights[name[: -len(INT4)]] = _unpack_int4(state, name[: -len(INT4)])
        elif name.endswith(INT8):
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
