import numpy as np
import pytest
import torch

from edgecap import spec
from edgecap.errors import ModelError
from edgecap.models import build_model
from edgecap.runtime.search import SearchOptions, beam_search
from edgecap.torch_backend import TorchSession
from edgecap.vocab import BOS, EOS
from tests.models.step_check import assert_steps_equal_forward

TINY = {"vocab_size": 40, "feature_dim": 16, "num_locations": 9, "d_model": 16, "heads": 2, "layers": 2,
        "ff_dim": 24, "max_positions": 12, "attributes_vocab": 20, "attributes": 4}


@pytest.mark.parametrize("variant", ["glied", "base"])
def test_iterating_step_equals_teacher_forced_forward(variant):
    torch.manual_seed(0)
    model = build_model("glied", {**TINY, "variant": variant}).eval()
    features, tokens = torch.randn(3, 9, 16), torch.randint(0, 40, (3, 7))
    full = assert_steps_equal_forward(model, features, tokens)
    assert not full.doubly_stochastic  # SAT's doubly stochastic regulariser must not apply to a Transformer


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("images", [1, 2, 4])
def test_beam_search_with_the_cache_equals_teacher_forcing_its_captions(beam, images):
    """Reorder + static cache through the runtime's search == decoding each result from scratch."""
    torch.manual_seed(images)
    model = build_model("glied", TINY).eval()
    features = torch.randn(images, 9, 16)
    # 12 candidates per row: the filters (no pad, bos or early eos) always leave some, so each caption gets its eos term
    options = SearchOptions(beam_size=beam, max_length=8, ban_unk=False, bad_endings=(), candidates=12)
    results = beam_search(TorchSession(model, features, options.k), images, options)
    for image, hyps in enumerate(results):
        assert len(hyps) == beam
        for hyp in hyps:
            tokens = torch.tensor([[BOS, *hyp.tokens]])
            with torch.no_grad():
                full = model(features[image:image + 1], tokens)
            targets = torch.tensor([*hyp.tokens, EOS])
            word_logprobs = full.logprobs[0].gather(-1, targets[:, None])[:, 0].double()
            words = float(word_logprobs[:-1].sum())
            eos = hyp.logprob - words
            if len(hyp.tokens) < options.max_length:  # ended by choosing eos
                assert eos == pytest.approx(float(word_logprobs[-1]), abs=1e-4)
            else:  # forced end: eos scored by itself or bounded by the k-th candidate
                assert eos >= float(word_logprobs[-1]) - 1e-4
            np.testing.assert_allclose(hyp.attention, full.attention[0].numpy(), atol=1e-5, rtol=0)


def test_mil_head_learns_the_attribute_words_of_its_images():
    """Each image's captions contain planted attribute words; the head's loss drops and its top-K finds them."""
    torch.manual_seed(0)
    model = build_model("glied", {**TINY, "attributes": 3, "dropout": 0.0})
    features = torch.randn(8, 9, 16)
    planted = torch.stack([torch.randperm(20)[:3] for _ in range(8)]) + 4  # attribute ids are 4..23
    tokens = torch.cat([torch.full((8, 1), BOS), planted, torch.randint(24, 40, (8, 3))], dim=1)
    optimizer = torch.optim.Adam(model.attribute_head.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        loss = model(features, tokens).auxiliary_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]
    memory, _ = model.eval().prepare(features)
    ids = memory[spec.MEMORY_ATTRIBUTE_IDS]
    assert ids.dtype == torch.int64 and ids.shape == (8, 3)
    assert ids.sort(dim=1).values.tolist() == planted.sort(dim=1).values.tolist()


def test_attribute_embeddings_are_the_word_embeddings():
    torch.manual_seed(0)
    model = build_model("glied", TINY).eval()
    assert [m for m in model.modules() if isinstance(m, torch.nn.Embedding)] == [model.embed]
    features = torch.randn(2, 9, 16)
    memory, _ = model.prepare(features)
    attribute = int(memory[spec.MEMORY_ATTRIBUTE_IDS][0, 0])
    tokens = torch.full((2, 3), 30)  # never an attribute id: the gradient can only come through the attributes
    model(features, tokens).logprobs[:, :, 5].sum().backward()
    assert model.embed.weight.grad[attribute].abs().sum() > 0


def test_memory_and_state_follow_the_spec():
    model = build_model("glied", TINY)
    memory, state = model.prepare(torch.randn(2, 9, 16))
    assert set(memory) == {spec.MEMORY_CROSS_KV, spec.MEMORY_ATTRIBUTE_KV, spec.MEMORY_ATTRIBUTE_IDS,
                           spec.MEMORY_ASPECT}
    assert memory[spec.MEMORY_CROSS_KV].shape == (2, 2, 2, 2, 9, 8)
    assert memory[spec.MEMORY_ATTRIBUTE_KV].shape == (2, 2, 2, 2, 4, 8)
    assert memory[spec.MEMORY_ASPECT].shape == (2, 2, 16)
    ids = memory[spec.MEMORY_ATTRIBUTE_IDS]
    assert ids.min() >= 4 and ids.max() < 24
    assert set(state) == {spec.STATE_KV} and state[spec.STATE_KV].shape == (2, 2, 2, 2, 12, 8)
    base_memory, _ = build_model("glied", {**TINY, "variant": "base"}).prepare(torch.randn(2, 9, 16))
    assert spec.MEMORY_ASPECT not in base_memory


def test_bad_options_name_the_conflicting_values():
    with pytest.raises(ModelError, match="attributes_vocab 20"):
        build_model("glied", {**TINY, "attributes": 21})
    with pytest.raises(ModelError, match="vocab_size 10"):  # a small vocabulary caps the attribute vocabulary
        build_model("glied", {**TINY, "vocab_size": 10, "attributes": 7})
    with pytest.raises(ModelError, match="variant"):
        build_model("glied", {**TINY, "variant": "full"})


def test_decoding_past_the_kv_cache_is_refused():
    model = build_model("glied", TINY).eval()
    memory, state = model.prepare(torch.randn(1, 9, 16))
    with pytest.raises(ModelError, match="max_positions 12"):
        model.step(torch.tensor([BOS]), state, memory, torch.tensor(12))
