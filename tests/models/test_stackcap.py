import pytest
import torch

from edgecap import spec
from edgecap.errors import ModelError
from edgecap.models import MODELS, build_model

TINY = {"vocab_size": 40, "feature_dim": 16, "num_locations": 9, "annotation_dim": 12, "embed_dim": 8,
        "hidden_dim": 12, "att_dim": 10, "dropout": 0.0}


@pytest.mark.parametrize("fine_stages", [0, 1, 2, 3])
def test_iterating_step_equals_teacher_forced_forward_for_every_stage(fine_stages):
    torch.manual_seed(0)
    model = build_model("stackcap", {**TINY, "fine_stages": fine_stages}).eval()
    features, tokens = torch.randn(3, 9, 16), torch.randint(0, 40, (3, 7))
    full = model(features, tokens)
    assert len(full.stage_logprobs) == fine_stages
    stages = [*full.stage_logprobs, full.logprobs]
    memory, state = model.prepare(features)
    staged_state = state
    for t in range(tokens.shape[1]):
        logprobs, state, alpha = model.step(tokens[:, t], state, memory, torch.tensor(t))
        every, staged_state, staged_alpha = model.stage_step(tokens[:, t], staged_state, memory, torch.tensor(t))
        torch.testing.assert_close(logprobs, full.logprobs[:, t], atol=1e-5, rtol=0)
        torch.testing.assert_close(alpha, full.attention[:, t], atol=1e-5, rtol=0)
        torch.testing.assert_close(staged_alpha, alpha, atol=1e-6, rtol=0)
        assert len(every) == fine_stages + 1
        for stage_logprobs, expected in zip(every, stages, strict=True):
            torch.testing.assert_close(stage_logprobs, expected[:, t], atol=1e-5, rtol=0)
        for name in state:
            torch.testing.assert_close(staged_state[name], state[name], atol=1e-6, rtol=0)


def test_prepare_names_memory_and_state_with_their_roles():
    model = build_model("stackcap", {**TINY, "fine_stages": 2})
    memory, state = model.prepare(torch.randn(2, 9, 16))
    assert set(memory) == {spec.MEMORY_FEATURES, "memory.mean_feature", "memory.att_proj.fine1",
                           "memory.att_proj.fine2"}
    assert set(state) == {f"state.{x}.{stage}" for x in "hc" for stage in ("coarse", "fine1", "fine2")}
    assert all(spec.role_of(k) == spec.ROLE_MEMORY for k in memory)
    assert all(spec.role_of(k) == spec.ROLE_STATE for k in state)
    assert memory[spec.MEMORY_FEATURES].shape == (2, 9, 12) and memory["memory.mean_feature"].shape == (2, 12)
    assert memory["memory.att_proj.fine2"].shape == (2, 9, 10)
    assert all(v.shape == (2, 12) for v in state.values())
    # fp16 export keeps the producers of state names starting with "state.c" in fp32: every cell state must match.
    assert sum(k.startswith(spec.STATE_C) for k in state) == 3


def test_stacked_attention_carries_the_gradient_from_the_last_stage_to_the_first():
    torch.manual_seed(0)
    model = build_model("stackcap", {**TINY, "fine_stages": 3})
    out = model(torch.randn(2, 9, 16), torch.randint(0, 40, (2, 4)))
    out.logprobs.sum().backward()
    for module in (model.coarse, model.attention[0], *model.stack, model.out[-1]):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_a_few_adamw_steps_lower_the_summed_cross_entropy():
    torch.manual_seed(0)
    model = build_model("stackcap", TINY).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    features, tokens = torch.randn(4, 9, 16), torch.randint(4, 40, (4, 6))

    def summed_xe():
        out = model(features, tokens[:, :-1])
        target = tokens[:, 1:].unsqueeze(-1)
        return sum(-s.gather(-1, target).mean() for s in [*out.stage_logprobs, out.logprobs])

    first = summed_xe()
    for _ in range(20):
        optimizer.zero_grad()
        loss = summed_xe()
        loss.backward()
        optimizer.step()
    assert summed_xe().item() < 0.8 * first.item()


def test_the_coarse_stage_alone_attends_evenly_and_skips_the_doubly_stochastic_term():
    model = build_model("stackcap", {**TINY, "fine_stages": 0})
    memory, state = model.prepare(torch.randn(2, 9, 16))
    assert set(memory) == {spec.MEMORY_FEATURES, "memory.mean_feature"}
    assert set(state) == {"state.h.coarse", "state.c.coarse"}
    out = model(torch.randn(2, 9, 16), torch.randint(0, 40, (2, 4)))
    torch.testing.assert_close(out.attention, torch.full((2, 4, 9), 1 / 9))
    assert out.stage_logprobs == () and not out.doubly_stochastic


def test_registry_lists_stackcap_and_rejects_negative_fine_stages():
    assert MODELS["stackcap"].classes()[1].__name__ == "StackCap"
    with pytest.raises(ModelError, match="fine_stages"):
        build_model("stackcap", {**TINY, "fine_stages": -1})
