"""Hard attention's REINFORCE terms: the moving baseline follows the sampled captions, and the gradient reaches the
attention only through the rows that sampled a location."""

import pytest
import torch

from edgecap.config import HardAttentionConfig
from edgecap.models import build_model
from edgecap.training.hard_attention import hard_attention_loss
from edgecap.training.losses import word_nll
from edgecap.vocab import PAD

TINY = {"vocab_size": 40, "feature_dim": 16, "num_locations": 9, "embed_dim": 8, "hidden_dim": 12, "att_dim": 10,
        "attention": "hard"}


def _batch(rows: int, seed: int = 0):
    """Features and captions of 3 to 14 words (bos, words, then pad), as real captions vary."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, 40, (rows, 16), generator=generator)
    tokens[:, 0] = 1
    for row, length in enumerate(torch.randint(3, 15, (rows,), generator=generator).tolist()):
        tokens[row, length + 1:] = PAD
    return torch.randn(rows, 9, 16, generator=generator), tokens


def _terms(model, sampled, cfg, baseline=-10.0):
    features, tokens = _batch(len(sampled))
    out = model(features, tokens[:, :-1], hard=True, expected=~sampled)
    target = tokens[:, 1:]
    mask = (target != PAD).float()
    nll = word_nll(out.logprobs, target)
    loss, updated = hard_attention_loss(out, nll, mask, sampled, baseline=baseline, cfg=cfg, n_tokens=mask.sum())
    return loss, updated, (nll * mask).sum(1).detach()


def test_the_moving_baseline_follows_the_sampled_captions_only():
    torch.manual_seed(0)
    sampled = torch.tensor([True, False, True, True, False, True])
    _, updated, caption_nll = _terms(build_model("sat", TINY), sampled, HardAttentionConfig(baseline_decay=0.9))
    assert updated == pytest.approx(0.9 * -10.0 + 0.1 * float(-caption_nll[sampled].mean()), rel=1e-5)


def test_reinforce_reaches_the_attention_only_through_rows_that_sampled_a_location():
    cfg = HardAttentionConfig(reinforce_weight=1.0, entropy=0.0)
    torch.manual_seed(0)
    model = build_model("sat", TINY)
    loss, updated, _ = _terms(model, torch.zeros(6, dtype=torch.bool), cfg)
    assert float(loss.detach()) == 0.0 and updated == -10.0  # every row took the expected context: nothing to reinforce
    loss, _, _ = _terms(model, torch.tensor([True, False] * 3), cfg)
    loss.backward()
    assert model.attention.score.weight.grad.abs().sum() > 0
    assert model.out.weight.grad is None or model.out.weight.grad.abs().sum() == 0  # the words' layer: no REINFORCE
