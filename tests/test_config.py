"""Presets build every registered model; recipes name their model; --set overrides apply together and strictly."""

import pytest

from edgecap.config import PRESETS, SHIPPED, apply_overrides
from edgecap.errors import EdgecapError
from edgecap.models import MODELS, build_model, settable_fields
from edgecap.training.runs import resolve_run


@pytest.mark.parametrize("preset", sorted(name for name, p in PRESETS.items() if p.model_id is None))
@pytest.mark.parametrize("model_id", sorted(MODELS))
def test_every_model_builds_from_every_size_preset_with_that_sizes_layers(preset, model_id):
    spec = resolve_run(model_id, "shapes", preset, [])
    assert spec.model == MODELS[model_id].sizes[PRESETS[preset].size]
    model = build_model(model_id, {"vocab_size": 50, "feature_dim": 64, "num_locations": 36, **spec.model})
    width = next(v for k, v in spec.model.items() if k in ("embed_dim", "d_model"))
    assert any(width in p.shape for p in model.parameters())  # the preset's width is the model's


def test_a_recipe_is_its_own_model_and_refuses_another():
    spec = resolve_run(None, "flickr8k:DIR", "sat-flickr8k", [])
    assert spec.model_id == "sat" and spec.encoder.weights == SHIPPED and spec.train.xe.label_smoothing == 0.2
    assert (spec.train.scst.epochs, spec.train.scst.lr, spec.train.scst.mirror_share) == (40, 5e-5, 0.5)
    with pytest.raises(EdgecapError, match="recipe for --model sat"):
        resolve_run("glied", "flickr8k:DIR", "sat-flickr8k", [])


def test_overrides_are_checked_together_not_one_by_one():
    # scst.samples=1 alone breaks the default mean baseline; with scst.baseline=greedy beside it the pair is valid
    preset = apply_overrides(PRESETS["base"], ["scst.samples=1", "scst.baseline=greedy"], {})
    assert (preset.train.scst.samples, preset.train.scst.baseline) == (1, "greedy")
    with pytest.raises(EdgecapError, match="needs scst.samples >= 2"):
        apply_overrides(PRESETS["base"], ["scst.samples=1"], {})


@pytest.mark.parametrize(("item", "named"), [("xe.lr=1", "xe has no field 'lr'"), ("optim=1", "SECTION.FIELD"),
                                             ("loop.lr=1", "SECTION one of"), ("optim.lr=fast", "expected a float")])
def test_a_bad_override_names_what_is_wrong(item, named):
    with pytest.raises(EdgecapError, match=named):
        apply_overrides(PRESETS["base"], [item], {})


@pytest.mark.parametrize("field", ["feature_dim", "num_locations", "vocab_size"])
def test_derived_model_fields_cannot_be_set(field):
    assert field not in settable_fields("sat")
    with pytest.raises(EdgecapError, match=f"no field '{field}'"):
        resolve_run("sat", "shapes", "base", [f"model.{field}=7"])


# The shipped decoder's run, as its config.json recorded it before the options were grouped (old name: value).
SHIPPED_RUN = {"batch_size": 128, "lr": 0.0005, "encoder_lr": 0.0, "weight_decay": 0.0001, "warmup_steps": 300,
               "epochs": 10, "max_steps": 0, "grad_clip": 2.0, "label_smoothing": 0.2, "ema_decay": 0.998,
               "mirror_share": 0.5, "patience": 3, "seed": 0, "min_word_count": 5, "max_caption_length": 20,
               "doubly_stochastic": 1.0, "hard_reinforce_weight": 0.1, "hard_entropy": 0.01,
               "hard_baseline_decay": 0.9, "hard_expected_share": 0.5, "scst_epochs": 40, "scst_lr": 5e-05,
               "scst_samples": 5, "scst_baseline": "mean", "scst_batch_images": 32, "scst_mirror_share": 0.5,
               "eval_beam": 3, "eval_images": 0, "init": ""}
OLD_NAMES = {"patience": "select.patience", "eval_beam": "select.beam", "eval_images": "select.images",
             "encoder_lr": "optim.encoder_lr", "ema_decay": "optim.ema_decay", "weight_decay": "optim.weight_decay",
             "warmup_steps": "optim.warmup_steps", "grad_clip": "optim.grad_clip", "lr": "optim.lr"}


def test_the_shipped_recipe_preset_is_the_shipped_run_s_configuration():
    spec = resolve_run(None, "flickr8k:DIR", "sat-flickr8k", [])
    train = spec.train

    def value(old: str):
        if old in OLD_NAMES:
            group, name = OLD_NAMES[old].split(".")
            return getattr(getattr(train, group), name)
        for prefix, group in (("scst_", train.scst), ("hard_", train.hard)):
            if old.startswith(prefix):
                return getattr(group, old[len(prefix):])
        return getattr(train.xe, old) if hasattr(train.xe, old) else getattr(train, old)

    assert {old: value(old) for old in SHIPPED_RUN} == SHIPPED_RUN
    assert (spec.encoder.name, spec.encoder.image_size, spec.encoder.finetune) == ("efficientnet_lite2", 260, False)
    assert spec.model == {"embed_dim": 256, "att_dim": 256}


@pytest.mark.parametrize("preset", sorted(name for name, p in PRESETS.items() if p.model_id is not None))
def test_every_recipe_names_a_registered_model_and_builds_it(preset):
    spec = resolve_run(None, "flickr8k:DIR", preset, [])
    assert spec.model_id == PRESETS[preset].model_id in MODELS
    build_model(spec.model_id, {"vocab_size": 50, "feature_dim": 64, "num_locations": 36, **spec.model})
