"""Weight-only INT8 and INT4 storage: every weight comes back within half a rounding step of its scale, small
tensors and integer buffers keep their values, a damaged file is refused in one line, and the stored file is about
half (INT8) or a quarter (INT4) of fp16's size."""
import io
from pathlib import Path

import pytest
import torch

from edgecap.errors import ModelError
from edgecap.weight_storage import (
    INT4,
    INT4_GROUP,
    INT4_SCALE,
    INT8,
    MIN_INT8_ELEMENTS,
    SCALE,
    pack_int4,
    pack_int8,
    require_scales,
    stored_weights,
)


def a_state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    channel_ranges = torch.linspace(0.01, 3, 32).view(-1, 1, 1, 1)
    state = {"lstm.weight_ih": torch.randn(512, 96, generator=generator),
             "conv.weight": torch.randn(32, 16, 3, 3, generator=generator) * channel_ranges,
             "lstm.bias": torch.randn(512, generator=generator),
             "tiny.weight": torch.randn(4, 8, generator=generator),
             "bn.num_batches_tracked": torch.tensor(1234)}
    state["lstm.weight_ih"][7] = 0  # an all-zero row must not divide by zero
    return state


def test_int8_weights_come_back_within_half_a_step_of_their_channel_scale():
    state = a_state()
    packed = pack_int8(state)
    assert packed["lstm.weight_ih" + INT8].dtype == torch.int8 and packed["conv.weight" + INT8].dtype == torch.int8
    assert packed["lstm.bias"].dtype == torch.float16 and packed["tiny.weight"].dtype == torch.float16
    assert state["tiny.weight"].numel() < MIN_INT8_ELEMENTS
    restored = stored_weights(packed)
    assert restored.keys() == state.keys()
    for name in ("lstm.weight_ih", "conv.weight"):
        step = packed[name + SCALE].float()
        assert (restored[name] - state[name]).abs().le(step / 2 + 1e-3 * step).all(), name
        assert restored[name].dtype == torch.float32
    assert torch.equal(restored["lstm.weight_ih"][7], torch.zeros(96))
    assert torch.equal(restored["bn.num_batches_tracked"], torch.tensor(1234))
    assert torch.allclose(restored["lstm.bias"], state["lstm.bias"], rtol=1e-3, atol=1e-3)


def test_int4_weights_come_back_within_half_a_step_of_their_group_scale_unless_clipped_to_err_less():
    state = a_state()
    state["lstm.weight_ih"][3, 70:] *= 50  # one group of a row far wider than its others: their scale stays fine
    packed = pack_int4(state)
    assert packed["lstm.weight_ih" + INT4].dtype == torch.uint8 and packed["lstm.bias"].dtype == torch.float16
    restored = stored_weights(packed)
    assert restored.keys() == state.keys()
    for name in ("lstm.weight_ih", "conv.weight"):  # 96 and 144 inputs a row: the last group of each is padded
        rows = state[name].reshape(len(state[name]), -1)
        scale = packed[name + INT4_SCALE].float()
        step = scale.repeat_interleave(INT4_GROUP, dim=1)[:, : rows.shape[1]]
        error = (restored[name] - state[name]).reshape(rows.shape).abs()
        inside = rows.abs() <= 7 * step
        assert error[inside].le(step[inside] / 2 + 1e-3 * step[inside]).all(), name
        padded = torch.nn.functional.pad(rows, (0, scale.shape[1] * INT4_GROUP - rows.shape[1]))
        grouped = padded.view(len(rows), -1, INT4_GROUP)
        peak = (grouped.abs().amax(-1, keepdim=True) / 7).half().float()
        peak[peak == 0] = 1.0
        unclipped = ((torch.round(grouped / peak).clamp(-7, 7) * peak - grouped) ** 2).sum(-1)
        assert (error ** 2).sum() <= unclipped.sum(), name  # the chosen scales err no more than the largest value's
        assert restored[name].shape == state[name].shape and restored[name].dtype == torch.float32
    assert packed["lstm.weight_ih" + INT4_SCALE][3, 0] < packed["lstm.weight_ih" + INT4_SCALE][3, 1] / 10
    assert torch.equal(restored["lstm.weight_ih"][7], torch.zeros(96))
    assert torch.equal(restored["bn.num_batches_tracked"], torch.tensor(1234))


@pytest.mark.parametrize("pack, suffix", [(pack_int8, SCALE), (pack_int4, INT4_SCALE)])
def test_weights_that_lost_their_scales_are_one_line_naming_the_file(pack, suffix):
    packed = pack(a_state())
    del packed["conv.weight" + suffix]
    with pytest.raises(ModelError, match=r"model\.pt: quantised weights without their scales \(conv\.weight"):
        require_scales(packed, Path("model.pt"))


def test_int8_storage_is_about_half_the_size_of_fp16_and_int4_about_a_quarter():
    state = {"embed.weight": torch.randn(2000, 256), "out.weight": torch.randn(2000, 512)}

    def saved_bytes(tensors: dict[str, torch.Tensor]) -> int:
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        return buffer.tell()

    half = saved_bytes({k: v.half() for k, v in state.items()})
    assert saved_bytes(pack_int8(state)) < 0.55 * half
    assert saved_bytes(pack_int4(state)) < 0.3 * half
