import numpy as np
import pytest
import torch

from edgecap import spec
from edgecap.errors import ModelError
from edgecap.models import build_model
from edgecap.models.a2 import ALIGNMENTS
from edgecap.runtime.search import SearchOptions
from edgecap.torch_backend import search_features
from edgecap.vocab import BOS, EOS, PAD, SPECIALS, Vocab
from tests.models.step_check import assert_steps_equal_forward

TINY = {"vocab_size": 30, "feature_dim": 16, "num_locations": 9, "d_model": 32, "heads": 4, "layers": 2,
        "ff_dim": 48, "max_positions": 12}


def tiny(**overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("a2", {**TINY, **overrides})


def perturbed_captioning_loss(model, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """L_IC(α^p): the perturbed decoder's cross-entropy on the next input words, computed with live parameters."""
    memory, _ = model.prepare(features)
    logprobs, _, _ = model.text_decoder(tokens, memory[spec.MEMORY_CROSS_KV], perturb=True)
    return -logprobs[:, :-1].gather(-1, tokens[:, 1:, None]).mean()


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_iterating_step_equals_teacher_forced_forward(alignment):
    model = tiny(alignment=alignment).eval()
    features, tokens = torch.randn(3, 9, 16), torch.randint(1, 30, (3, 8))
    full = assert_steps_equal_forward(model, features, tokens)
    assert not full.doubly_stochastic and full.auxiliary_loss is None  # eval mode: no training objective
    torch.testing.assert_close(full.attention.sum(-1), torch.ones(3, 8))


def test_prepare_names_memory_and_state_batch_first():
    model = tiny()
    memory, state = model.prepare(torch.randn(2, 9, 16))
    assert memory[spec.MEMORY_CROSS_KV].shape == (2, 2, 2, 4, 9, 8)  # N, layers, k/v, heads, L, head_dim
    assert state[spec.STATE_KV].shape == (2, 2, 2, 4, 12, 8)  # N, layers, k/v, heads, Tmax, head_dim
    assert set(memory) == {spec.MEMORY_CROSS_KV} and set(state) == {spec.STATE_KV}


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("images", [1, 4])
def test_beam_search_through_the_cache_equals_teacher_forcing_its_captions(beam, images):
    """Cache writes, the reorder gather and tiling: every returned caption re-scored by teacher forcing."""
    model = tiny(alignment="gate").eval()
    vocab = Vocab(SPECIALS + tuple(f"w{i}" for i in range(TINY["vocab_size"] - len(SPECIALS))))
    features = torch.randn(images, 9, 16)
    options = SearchOptions(beam_size=beam, max_length=8, candidates=len(vocab))  # k = V: eos is always seen
    hyps = search_features(model, features, vocab, options)
    assert len(hyps) == images
    for image, hyp in enumerate(hyps):
        words = torch.tensor([[BOS, *hyp.tokens]])
        with torch.no_grad():
            full = model(features[image:image + 1], words)
        targets = torch.tensor([*hyp.tokens, EOS])
        logprob = full.logprobs[0].gather(-1, targets[:, None]).sum()
        assert abs(float(logprob) - hyp.logprob) < 1e-5
        np.testing.assert_allclose(hyp.attention, full.attention[0].numpy(), atol=1e-5, rtol=0)


def test_mask_objective_moves_the_mask_network_against_the_captioning_loss():
    model = tiny(alignment="gate", dropout=0.0, mask_lambda=0.0).train()
    features, tokens = torch.randn(4, 9, 16), torch.randint(4, 30, (4, 7))
    masks = [p for layer in model.text_decoder.layers for p in layer.cross_attention.mask.parameters()]
    captioner = [p for p in model.parameters() if all(p is not q for q in masks)]

    out = model(features, tokens)
    adversarial = torch.autograd.grad(out.auxiliary_loss, masks + captioner, allow_unused=True)
    assert all(g is None or not g.any() for g in adversarial[len(masks):])  # the captioner gets nothing from it
    direct = torch.autograd.grad(perturbed_captioning_loss(model, features, tokens), masks)
    for reversed_grad, grad in zip(adversarial[: len(masks)], direct, strict=True):
        assert grad.abs().sum() > 0
        torch.testing.assert_close(reversed_grad, -grad)  # the mask ascends the loss the captioner descends

    xe = -out.logprobs[:, :-1].gather(-1, tokens[:, 1:, None]).mean()
    grads = torch.autograd.grad(xe, masks + [model.text_decoder.layers[0].cross_attention.gate.weight],
                                allow_unused=True)
    assert all(g is None or not g.any() for g in grads[:-1]) and grads[-1].abs().sum() > 0

    before = perturbed_captioning_loss(model, features, tokens).item()
    optimizer = torch.optim.SGD(masks, lr=0.5)  # the mask network's share of one trainer step
    out = model(features, tokens)  # cross-entropy + auxiliary loss, one backward
    (-out.logprobs[:, :-1].gather(-1, tokens[:, 1:, None]).mean() + out.auxiliary_loss).backward()
    optimizer.step()
    assert perturbed_captioning_loss(model, features, tokens).item() > before


def test_mask_regulariser_pulls_the_mask_towards_one():
    model = tiny(dropout=0.0, mask_lambda=1.0).train()
    features, tokens = torch.randn(2, 9, 16), torch.randint(4, 30, (2, 5))
    full = model(features, tokens).auxiliary_loss
    without = build_model("a2", {**TINY, "dropout": 0.0, "mask_lambda": 0.0}).train()
    without.load_state_dict(model.state_dict())
    assert full.item() > without(features, tokens).auxiliary_loss.item()  # λ‖1 - m‖² > 0 for m = σ(.) < 1


@pytest.mark.parametrize("alignment", ["gate", "none"])
def test_tiny_model_learns_a_few_batches(alignment):
    model = tiny(alignment=alignment).train()
    generator = torch.Generator().manual_seed(1)
    features = torch.randn(8, 9, 16, generator=generator)
    words = torch.randint(4, 30, (8, 6), generator=generator)
    tokens = torch.cat([torch.full((8, 1), BOS), words, torch.full((8, 1), EOS), torch.full((8, 1), PAD)], 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        out = model(features, tokens[:, :-1])
        target = tokens[:, 1:]
        keep = (target != PAD).float()
        xe = -(out.logprobs.gather(-1, target[..., None]).squeeze(-1) * keep).sum() / keep.sum()
        optimizer.zero_grad()
        (xe if out.auxiliary_loss is None else xe + out.auxiliary_loss).backward()
        optimizer.step()
        losses.append(xe.item())
    assert losses[-1] < 0.5 * losses[0]


def test_plain_transformer_has_no_mask_network_or_gate():
    plain, aligned = tiny(alignment="none"), tiny(alignment="gate")
    assert sum(p.numel() for p in plain.parameters()) < sum(p.numel() for p in aligned.parameters())
    assert all(layer.cross_attention.mask is None and layer.cross_attention.gate is None
               for layer in plain.text_decoder.layers)
    assert plain.train()(torch.randn(2, 9, 16), torch.randint(1, 30, (2, 4))).auxiliary_loss is None


def test_step_refuses_a_position_past_the_cache():
    model = tiny().eval()
    memory, state = model.prepare(torch.randn(1, 9, 16))
    with pytest.raises(ValueError, match="max_positions=12"):
        model.step(torch.tensor([BOS]), state, memory, torch.tensor(12))


def test_config_rejects_an_unknown_alignment():
    with pytest.raises(ModelError, match="cannot be built with these options .*moving_average"):
        build_model("a2", {**TINY, "alignment": "mean"})
