"""The static KV cache computes exactly what full causal attention does."""

import torch

from edgecap.models.attention import CachedSelfAttention, EncoderLayer, write_at


def test_cached_steps_equal_causal_attention():
    torch.manual_seed(0)
    layer = CachedSelfAttention(32, 4).eval()
    x = torch.randn(3, 7, 32)
    full = layer(x)
    keys = values = torch.zeros(3, 4, 10, 8)
    for t in range(7):
        out, keys, values = layer.step(x[:, t:t + 1], keys, values, torch.tensor(t))
        torch.testing.assert_close(out[:, 0], full[:, t], atol=1e-5, rtol=0)


def test_write_at_touches_one_slot():
    cache = torch.zeros(2, 1, 5, 3)
    written = write_at(cache, torch.ones(2, 1, 1, 3), torch.tensor(2))
    assert written[:, :, 2].eq(1).all() and written.sum() == 6


def test_encoder_layer_keeps_shape_and_mixes_regions():
    torch.manual_seed(0)
    layer = EncoderLayer(16, 2, 32).eval()
    x = torch.randn(2, 5, 16)
    y = layer(x)
    assert y.shape == x.shape
    changed = x.clone()
    changed[:, 4] += 1
    assert not torch.allclose(layer(changed)[:, 0], y[:, 0])
