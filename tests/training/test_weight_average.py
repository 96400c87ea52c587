import json
import re

import pytest
import torch
from torch import nn

from edgecap.checkpoint import read_checkpoint
from edgecap.config import OptimConfig
from edgecap.errors import EdgecapError
from edgecap.training.ema import WeightAverage


def _module() -> nn.Module:
    module = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))
    module[1].requires_grad_(False)  # a frozen part is not averaged
    return module


def test_average_follows_the_ramped_decay():
    module = _module()
    average = WeightAverage(module, decay=0.9)
    assert set(average.shadow) == {"0.weight", "0.bias"}
    start = module[0].weight.detach().clone()
    expected = start.clone()
    for n in range(1, 30):
        with torch.no_grad():
            module[0].weight.add_(1.0)
        average.update()
        d = min(0.9, (1 + n) / (10 + n))
        expected = d * expected + (1 - d) * module[0].weight.detach()
    torch.testing.assert_close(average.shadow["0.weight"], expected)
    assert not torch.allclose(expected, module[0].weight)


def test_applied_swaps_the_average_in_and_restores_the_weights():
    module = _module()
    average = WeightAverage(module, decay=0.5)
    own = module[0].weight.detach().clone()
    average.shadow["0.weight"] = torch.zeros_like(own)
    with average.applied():
        assert module[0].weight.abs().sum() == 0
    torch.testing.assert_close(module[0].weight.detach(), own)
    with pytest.raises(RuntimeError), average.applied():
        raise RuntimeError("evaluation failed")
    torch.testing.assert_close(module[0].weight.detach(), own)


def test_state_round_trip_and_a_mismatched_state_is_refused():
    module = _module()
    average = WeightAverage(module, decay=0.99)
    for _ in range(3):
        average.update()
    copy = WeightAverage(_module(), decay=0.99)
    copy.load_state_dict(average.state_dict())
    assert copy.updates == 3
    torch.testing.assert_close(copy.shadow["0.bias"], average.shadow["0.bias"])
    with pytest.raises(KeyError, match="0.weight"):
        copy.load_state_dict({"updates": 1, "shadow": {"0.bias": torch.zeros(2)}})


@pytest.mark.parametrize("decay", [-0.1, 1.0])
def test_decay_out_of_range_is_refused(decay):
    with pytest.raises(EdgecapError, match="ema_decay"):
        OptimConfig(ema_decay=decay)


@pytest.mark.slow
def test_best_pt_keeps_the_average_and_a_resumed_run_carries_it_on(tmp_path):
    from tests.helpers import invoke

    run = tmp_path / "ema"
    code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(run), "--max-steps", "40",
                          "--scst-epochs", "0", "--set", "select.images=10", "--set", "optim.ema_decay=0.95")
    assert code == 0, output
    assert re.search(r"ema: sat, [\d.]+ M trainable parameters on (cpu|cuda \(.+\)); \d+ training photos", output)
    best, last = read_checkpoint(run / "best.pt"), read_checkpoint(run / "last.pt")
    shadow = last["train_state"]["weight_average"]
    assert shadow["updates"] == 40
    for name, weight in best["decoder"].items():
        if f"decoder.{name}" in shadow["shadow"]:
            torch.testing.assert_close(weight, shadow["shadow"][f"decoder.{name}"])
    assert any(not torch.equal(best["decoder"][k], last["decoder"][k]) for k in best["decoder"])

    config = json.loads((run / "config.json").read_text())
    config["train"]["xe"]["max_steps"] = 60
    (run / "config.json").write_text(json.dumps(config))
    code, output = invoke("train", "--out", str(run), "--resume")
    assert code == 0, output
    assert read_checkpoint(run / "last.pt")["train_state"]["weight_average"]["updates"] == 60
