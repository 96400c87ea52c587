"""Weight-only INT8 storage: every weight comes back within half a rounding step of its channel's scale, small
tensors and integer buffers keep their values, and the stored file is about half fp16's size."""
import io

import torch

from edgecap.weight_storage import INT8, MIN_INT8_ELEMENTS, SCALE, pack_int8, stored_weights


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


def test_int8_storage_is_about_half_the_size_of_fp16():
    state = {"embed.weight": torch.randn(2000, 256), "out.weight": torch.randn(2000, 512)}

    def saved_bytes(tensors: dict[str, torch.Tensor]) -> int:
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        return buffer.tell()

    half = saved_bytes({k: v.half() for k, v in state.items()})
    assert saved_bytes(pack_int8(state)) < 0.55 * half
