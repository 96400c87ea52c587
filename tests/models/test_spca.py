import pytest
import torch

from edgecap import spec
from edgecap.models import MODELS, build_model
from edgecap.models.spca import MEMORY_CHANNEL, MEMORY_SPATIAL, SPCA, VARIANTS, SPCAConfig
from tests.models.step_check import assert_steps_equal_forward

TINY = {"vocab_size": 40, "feature_dim": 16, "num_locations": 9, "annotation_dim": 12, "embed_dim": 8,
        "hidden_dim": 10, "att_dim": 6, "reduction": 4, "dropout": 0.0}


@pytest.mark.parametrize("kernel_size", [1, 3, 5])
@pytest.mark.parametrize("variant", VARIANTS)
def test_iterating_step_equals_teacher_forced_forward(variant, kernel_size):
    torch.manual_seed(0)
    model = build_model("spca", {**TINY, "variant": variant, "kernel_size": kernel_size}).eval()
    features, tokens = torch.randn(3, 9, 16), torch.randint(0, 40, (3, 6))
    full = assert_steps_equal_forward(model, features, tokens)
    assert not full.doubly_stochastic  # a sigmoid map: the softmax coverage regulariser must not apply


@pytest.mark.parametrize("variant", VARIANTS)
def test_prepare_names_memory_and_state_as_the_spec(variant):
    model = build_model("spca", {**TINY, "variant": variant})
    memory, state = model.prepare(torch.randn(2, 9, 16))
    expected = {spec.MEMORY_FEATURES}
    if variant in ("S", "S-C", "S|C"):
        expected.add(MEMORY_SPATIAL)
    if variant in ("C", "C-S", "S|C"):
        expected.add(MEMORY_CHANNEL)
    assert set(memory) == expected
    assert set(state) == {spec.STATE_H, spec.STATE_C}
    assert all(spec.role_of(k) == spec.ROLE_MEMORY for k in memory)
    assert all(spec.role_of(k) == spec.ROLE_STATE for k in state)
    assert memory[spec.MEMORY_FEATURES].shape == (2, 9, 12)
    if MEMORY_SPATIAL in memory:
        assert memory[MEMORY_SPATIAL].shape == (2, 6, 3, 3)


def test_split_spatial_conv_equals_one_conv_on_the_concatenated_map():
    """Conv_V(V) + Conv_h(tile(h)) with tap coverage is exactly Conv([V; tile(h)]) with zero padding at the border."""
    torch.manual_seed(0)
    model = build_model("spca", {**TINY, "num_locations": 16, "kernel_size": 3})
    spatial, k = model.spatial, 3
    v, h = torch.randn(2, 12, 4, 4), torch.randn(2, 10)
    w_h = spatial.conv_h.weight.view(6, k, k, 10).permute(0, 3, 1, 2)
    weight = torch.cat([spatial.conv_v.weight, w_h], dim=1)
    stacked = torch.cat([v, h[:, :, None, None].expand(2, 10, 4, 4)], dim=1)
    hidden = torch.relu(torch.nn.functional.conv2d(stacked, weight, spatial.conv_v.bias, padding=1))
    expected = torch.sigmoid(spatial.conv_out(hidden)).flatten(1)
    torch.testing.assert_close(spatial(spatial.project(v), h), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_is_a_map_in_unit_interval(variant):
    model = build_model("spca", {**TINY, "variant": variant}).eval()
    memory, state = model.prepare(torch.randn(4, 9, 16))
    _, _, attention = model.step(torch.randint(0, 40, (4,)), state, memory, torch.tensor(0))
    assert attention.shape == (4, 9)
    assert ((attention >= 0) & (attention <= 1)).all()
    if variant == "C":
        torch.testing.assert_close(attention, torch.full((4, 9), 1 / 9))


@pytest.mark.parametrize("bad", [{"variant": "CS"}, {"kernel_size": 2}, {"kernel_size": 7}, {"num_locations": 10},
                                 {"reduction": 0}])
def test_invalid_config_raises(bad):
    with pytest.raises(ValueError, match=str(next(iter(bad.values())))):
        SPCAConfig(**{**TINY, **bad})


def test_training_lowers_the_loss_and_reaches_both_branches():
    torch.manual_seed(0)
    model = build_model("spca", TINY).train()
    features, tokens = torch.randn(8, 9, 16), torch.randint(4, 40, (8, 7))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def loss() -> torch.Tensor:
        logprobs = model(features, tokens[:, :-1]).logprobs
        return -logprobs.gather(-1, tokens[:, 1:, None]).mean()

    first = loss()
    first.backward()
    for p in (model.spatial.conv_v.weight, model.spatial.conv_h.weight, model.spatial.conv_out.weight,
              model.channel.squeeze_v.weight, model.channel.squeeze_h.weight, model.channel.excite.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    for _ in range(40):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    assert loss().item() < 0.5 * first.item()


def test_registry_lists_spca():
    assert MODELS["spca"].classes() == (SPCAConfig, SPCA)
