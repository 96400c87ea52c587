"""A tiny SAT trainer on eight generated shapes photos, for tests that reach into one training step."""

from collections.abc import Callable
from pathlib import Path

import pytest

from edgecap.data import load_dataset
from edgecap.data.shapes import generate_shapes
from edgecap.training.loop import Trainer
from edgecap.training.runs import resolve_run


@pytest.fixture
def shapes_trainer(tmp_path: Path) -> Callable[[list[str]], Trainer]:
    """Builds the trainer with the given `--set` overrides on the tiny preset."""

    def build(overrides: list[str]) -> Trainer:
        json_path = generate_shapes(tmp_path / "shapes", n_train=8, n_dev=2, n_test=0)
        spec = resolve_run("sat", f"karpathy:{json_path}", "tiny", overrides)
        (tmp_path / "run").mkdir()
        return Trainer(tmp_path / "run", spec, load_dataset(spec.data), cache_dir=tmp_path / "cache")

    return build
