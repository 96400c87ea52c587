import pytest
import torch

from edgecap import spec
from edgecap.config import HardAttentionConfig
from edgecap.errors import EdgecapError
from edgecap.models import MODELS, build_model
from tests.models.step_check import assert_steps_equal_forward

TINY = {"vocab_size": 40, "feature_dim": 16, "num_locations": 9, "embed_dim": 8, "hidden_dim": 12, "att_dim": 10}


@pytest.mark.parametrize("gate", [True, False])
def test_iterating_step_equals_teacher_forced_forward(gate):
    torch.manual_seed(0)
    model = build_model("sat", {**TINY, "gate": gate}).eval()
    features, tokens = torch.randn(3, 9, 16), torch.randint(0, 40, (3, 7))
    assert_steps_equal_forward(model, features, tokens)


def test_prepare_names_memory_and_state_as_the_spec():
    model = build_model("sat", TINY)
    memory, state = model.prepare(torch.randn(2, 9, 16))
    assert set(memory) == {spec.MEMORY_FEATURES, spec.MEMORY_ATT_PROJ}
    assert set(state) == {spec.STATE_H, spec.STATE_C}
    assert all(spec.role_of(k) == spec.ROLE_MEMORY for k in memory)
    assert all(spec.role_of(k) == spec.ROLE_STATE for k in state)
    assert memory[spec.MEMORY_ATT_PROJ].shape == (2, 9, 10)


def test_hard_attention_samples_one_location_and_trains_the_attention():
    torch.manual_seed(0)
    model = build_model("sat", {**TINY, "attention": "hard"}).train()
    out = model(torch.randn(4, 9, 16), torch.randint(0, 40, (4, 5)), hard=True)
    assert out.location_logprob.shape == (4, 5) and out.entropy.shape == (4, 5)
    assert (out.location_logprob <= 0).all()
    out.location_logprob.sum().backward()
    assert model.attention.score.weight.grad.abs().sum() > 0


def test_hard_attention_rows_marked_expected_train_as_soft_attention():
    torch.manual_seed(0)
    model = build_model("sat", {**TINY, "attention": "hard"}).eval()  # no dropout: rows compare exactly
    features, tokens = torch.randn(4, 9, 16), torch.randint(0, 40, (4, 6))
    expected = torch.tensor([True, False, True, False])
    hard = model(features, tokens, hard=True, expected=expected)
    soft = model(features, tokens)
    torch.testing.assert_close(hard.logprobs[expected], soft.logprobs[expected])
    assert not torch.allclose(hard.logprobs[~expected], soft.logprobs[~expected])
    assert (hard.location_logprob[expected] == 0).all() and (hard.entropy[expected] == 0).all()
    assert (hard.location_logprob[~expected] < 0).all() and (hard.entropy[~expected] > 0).all()


@pytest.mark.parametrize(("option", "value"), [("expected_share", -0.1), ("expected_share", 1.5),
                                               ("reinforce_weight", -1.0)])
def test_hard_attention_options_out_of_range_are_refused(option, value):
    with pytest.raises(EdgecapError, match=f"hard.{option}"):
        HardAttentionConfig(**{option: value})


def test_unknown_model_option_names_the_known_ones():
    with pytest.raises(Exception, match="hidden_dim"):
        build_model("sat", {**TINY, "hiden_dim": 3})


def test_registry_lists_sat():
    assert MODELS["sat"].classes()[1].__name__ == "SAT"
