"""What defines a run: the spec resolved from a preset and overrides for a new run, or read back from the run's
``config.json`` (with the few changes a resumed run may take) for ``--resume``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from edgecap.checkpoint import read_checkpoint
from edgecap.config import EncoderConfig, Preset, TrainConfig, apply_overrides, preset_for
from edgecap.errors import ModelError
from edgecap.models import MODELS


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines a run; written to config.json and read back on --resume."""

    model_id: str
    data: str
    encoder: EncoderConfig
    train: TrainConfig
    model: dict


def resolve_run(model_id: str, data: str, preset: str, overrides: list[str]) -> RunSpec:
    if model_id not in MODELS:
        raise ModelError(f"unknown model '{model_id}'; choose one of {', '.join(MODELS)}")
    chosen: Preset = apply_overrides(preset_for(preset, model_id), overrides, _model_defaults(model_id))
    return RunSpec(model_id, data, chosen.encoder, chosen.train, chosen.model)


def _model_defaults(model_id: str) -> dict[str, object]:
    """The model config's fields and defaults, against which ``model.FIELD`` overrides are checked."""
    return {f.name: f.default for f in fields(MODELS[model_id][0]) if f.name != "vocab_size"}


def _changed_keys(before: Preset, after: Preset, model_defaults: dict[str, object]) -> list[str]:
    """``SECTION.FIELD`` of every value that differs between two presets (model fields at their defaults count)."""
    changed = [f"{section}.{name}" for section in ("encoder", "train")
               for name, value in asdict(getattr(before, section)).items()
               if getattr(getattr(after, section), name) != value]
    model_before, model_after = {**model_defaults, **before.model}, {**model_defaults, **after.model}
    return changed + [f"model.{name}" for name, value in model_after.items() if model_before[name] != value]


RESUMABLE_FIELDS = ("epochs", "scst_epochs", "patience", "scst_lr", "scst_mirror_share", "scst_zoom_share",
                    "max_steps")
"""The train fields a resumed run may change: how long each phase goes on, and the self-critical phase's rate and
the shares of its views. Every other field already shaped the checkpoints the run has written."""


def run_spec(*, run_dir: Path, spec: RunSpec | None, resume: bool, changes: Sequence[str] = ()) -> RunSpec:
    """The spec a run uses: config.json's with ``changes`` applied when resuming, else ``spec``; refuses a bad
    --resume or --out, and a change that only a new run can make (a change that repeats config.json is none)."""
    if resume:
        if not (run_dir / "last.pt").exists():
            raise ModelError(f"{run_dir}: nothing to resume (no last.pt); drop --resume to start a new run")
        if "train_state" not in read_checkpoint(run_dir / "last.pt"):
            raise ModelError(f"{run_dir / 'last.pt'}: weights without training state (a best.pt copy?), so it "
                             "cannot be resumed; put the run's own last.pt back or start a new run with --out")
        saved = json.loads((run_dir / "config.json").read_text())
        defaults = _model_defaults(saved["model_id"])
        kept = Preset(EncoderConfig(**saved["encoder"]), TrainConfig(**saved["train"]), saved["model"])
        resumed = apply_overrides(kept, list(changes), defaults)
        allowed = [f"train.{field}" for field in RESUMABLE_FIELDS]
        refused = [key for key in _changed_keys(kept, resumed, defaults) if key not in allowed]
        if refused:
            raise ModelError(f"{run_dir}: --resume cannot change {', '.join(refused)}, since the run's checkpoints "
                             f"were trained with its config.json; it may change {', '.join(allowed)} (start a new "
                             "run with --out for anything else)")
        return RunSpec(saved["model_id"], saved["data"], resumed.encoder, resumed.train, resumed.model)
    if (run_dir / "last.pt").exists():
        raise ModelError(f"{run_dir}: already holds a run; pass --resume to continue it or choose another --out")
    return spec
