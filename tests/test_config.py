"""Every registered model has its sizes in every preset, and the preset builds it; --set overrides apply together."""

import pytest

from edgecap.config import PRESETS, apply_overrides, preset_for
from edgecap.errors import EdgecapError
from edgecap.models import MODELS, build_model


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("model_id", sorted(MODELS))
def test_every_model_builds_from_every_preset(preset, model_id):
    config = {"vocab_size": 50, "feature_dim": 64, "num_locations": 36, **preset_for(preset, model_id).model}
    model = build_model(model_id, config)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_overrides_are_checked_together_not_one_by_one():
    # scst_samples=1 alone breaks the default mean baseline; with scst_baseline=greedy beside it the pair is valid
    preset = apply_overrides(PRESETS["base"], ["train.scst_samples=1", "train.scst_baseline=greedy"], {})
    assert (preset.train.scst_samples, preset.train.scst_baseline) == (1, "greedy")
    with pytest.raises(EdgecapError, match="needs train.scst_samples >= 2"):
        apply_overrides(PRESETS["base"], ["train.scst_samples=1"], {})
