import pytest
import torch

from edgecap.config import TrainConfig
from edgecap.errors import EdgecapError
from edgecap.models import build_model
from edgecap.training.hard_attention import caption_logprob, expected_context_logprob
from edgecap.vocab import PAD

TINY = {"vocab_size": 40, "feature_dim": 16, "num_locations": 9, "embed_dim": 8, "hidden_dim": 12, "att_dim": 10,
        "attention": "hard"}


def _captions_of_many_lengths(rows: int, seed: int = 0) -> torch.Tensor:
    """bos, words, then pad: lengths from 3 to 14 words, as real captions vary."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, 40, (rows, 16), generator=generator)
    tokens[:, 0] = 1
    for row, length in enumerate(torch.randint(3, 15, (rows,), generator=generator).tolist()):
        tokens[row, length + 1:] = PAD
    return tokens


def test_caption_logprob_sums_the_words_and_skips_padding():
    logprobs = torch.log_softmax(torch.randn(2, 3, 5), -1)
    target = torch.tensor([[4, 2, PAD], [1, 3, 2]])
    expected = torch.stack([logprobs[0, 0, 4] + logprobs[0, 1, 2],
                            logprobs[1, 0, 1] + logprobs[1, 1, 3] + logprobs[1, 2, 2]])
    torch.testing.assert_close(caption_logprob(logprobs, target), expected)


def test_the_baseline_is_each_sampled_captions_likelihood_under_the_expected_context():
    torch.manual_seed(0)
    model = build_model("sat", TINY).eval()
    features, tokens = torch.randn(6, 9, 16), _captions_of_many_lengths(6)
    sampled = torch.tensor([True, False, True, True, False, True])
    baseline = expected_context_logprob(model, features, tokens, sampled)
    soft = caption_logprob(model(features, tokens[:, :-1])["logprobs"], tokens[:, 1:]).detach()
    torch.testing.assert_close(baseline[sampled], soft[sampled])
    assert (baseline[~sampled] == 0).all()
    assert not baseline.requires_grad


def test_the_caption_baseline_removes_the_spread_a_moving_average_leaves():
    """log p(y|s,a) - b with one b for every caption spreads with caption length; per caption it does not."""
    torch.manual_seed(0)
    model = build_model("sat", TINY).eval()
    features, tokens = torch.randn(64, 9, 16), _captions_of_many_lengths(64)
    sampled = torch.ones(64, dtype=torch.bool)
    hard = model(features, tokens[:, :-1], hard=True, expected=~sampled)
    seq_logprob = caption_logprob(hard["logprobs"], tokens[:, 1:]).detach()
    per_caption = seq_logprob - expected_context_logprob(model, features, tokens, sampled)
    moving = seq_logprob - seq_logprob.mean()
    assert per_caption.std() < 0.2 * moving.std()


def test_an_unknown_hard_attention_baseline_is_refused():
    with pytest.raises(EdgecapError, match="train.hard_baseline"):
        TrainConfig(hard_baseline="greedy")
