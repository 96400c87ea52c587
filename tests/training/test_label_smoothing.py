import pytest
import torch
import torch.nn.functional as F

from edgecap.config import XEConfig
from edgecap.errors import EdgecapError
from edgecap.training.losses import smoothed_nll


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_smoothed_nll_matches_torch_label_smoothing(eps):
    torch.manual_seed(0)
    logits, target = torch.randn(6, 11), torch.randint(0, 11, (6,))
    logprobs = torch.log_softmax(logits, -1)
    nll = -logprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    expected = F.cross_entropy(logits, target, label_smoothing=eps, reduction="none")
    torch.testing.assert_close(smoothed_nll(logprobs, nll, eps), expected)


def test_label_smoothing_out_of_range_is_refused():
    with pytest.raises(EdgecapError, match="xe.label_smoothing"):
        XEConfig(label_smoothing=1.0)
