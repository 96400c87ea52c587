"""Several captions of one photo in a batch: ``forward(photos, tokens, rows=...)`` encodes each photo once and
gives every caption what a batch holding its photo's features in its own row gives it."""

import pytest
import torch

from edgecap.models import MODELS, build_model


@pytest.mark.parametrize("model_id", list(MODELS))
def test_captions_sharing_a_photo_get_the_outputs_of_a_row_of_their_own(model_id):
    torch.manual_seed(0)
    model = build_model(model_id, {"vocab_size": 30, "feature_dim": 16, "num_locations": 9,
                                   **MODELS[model_id].sizes["tiny"], "dropout": 0.0}).eval()
    photos, tokens = torch.randn(2, 9, 16), torch.randint(4, 30, (5, 7))
    rows = torch.tensor([1, 0, 1, 1, 0])
    shared, own = model(photos, tokens, rows=rows), model(photos[rows], tokens)
    torch.testing.assert_close(shared.logprobs, own.logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(shared.attention, own.attention, atol=1e-5, rtol=0)
    for shared_stage, own_stage in zip(shared.stage_logprobs, own.stage_logprobs, strict=True):
        torch.testing.assert_close(shared_stage, own_stage, atol=1e-5, rtol=0)
    if own.auxiliary_loss is not None:
        torch.testing.assert_close(shared.auxiliary_loss, own.auxiliary_loss, atol=1e-5, rtol=0)
    assert not torch.allclose(model(photos, tokens, rows=1 - rows).logprobs, shared.logprobs, atol=1e-3)
