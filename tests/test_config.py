"""Every registered model has its sizes in every preset, and the preset builds it."""

import pytest

from edgecap.config import PRESETS, preset_for
from edgecap.models import MODELS, build_model


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("model_id", sorted(MODELS))
def test_every_model_builds_from_every_preset(preset, model_id):
    config = {"vocab_size": 50, "feature_dim": 64, "num_locations": 36, **preset_for(preset, model_id).model}
    model = build_model(model_id, config)
    assert sum(p.numel() for p in model.parameters()) > 0
