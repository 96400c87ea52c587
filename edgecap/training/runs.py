"""What defines a run and what may change when it goes on: the spec resolved from a preset and overrides for a new
run, read back from the run's ``config.json`` for ``--resume``, and how a finished run reopens."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from edgecap.checkpoint import read_checkpoint
from edgecap.config import PRESETS, EncoderConfig, Preset, TrainConfig, apply_overrides
from edgecap.errors import ModelError
from edgecap.models import entry, settable_fields
from edgecap.training.state import TrainState
from edgecap.vocab import Vocab

DEFAULT_MODEL_ID = "sat"


@dataclass(frozen=True)
class RunSpec:
    """Everything that defines a run; written to config.json and read back on --resume."""

    model_id: str
    data: str
    encoder: EncoderConfig
    train: TrainConfig
    model: dict

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def read(cls, run_dir: Path) -> RunSpec:
        path = run_dir / "config.json"
        try:
            saved = json.loads(path.read_text())
            return cls(saved["model_id"], saved["data"], EncoderConfig(**saved["encoder"]),
                       TrainConfig.from_json(saved["train"]), saved["model"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
            raise ModelError(f"{path}: not a config.json this edgecap can resume ({type(err).__name__}: {err}); "
                             "start a new run with --out") from None

    def as_preset(self) -> Preset:
        return Preset("", self.encoder, self.train, model=dict(self.model))


def resolve_run(model_id: str | None, data: str, preset: str, overrides: Sequence[str]) -> RunSpec:
    """The spec of a new run: ``preset`` (its recipe's model when ``model_id`` is None) with ``overrides``."""
    chosen = PRESETS[preset]
    if chosen.model_id and model_id and model_id != chosen.model_id:
        raise ModelError(f"--preset {preset} is a recipe for --model {chosen.model_id}, not {model_id}; drop "
                         "--model, or start from --preset base")
    model_id = model_id or chosen.model_id or DEFAULT_MODEL_ID
    sized = replace(chosen, model={**entry(model_id).sizes[chosen.size], **chosen.model})
    resolved = apply_overrides(sized, list(overrides), settable_fields(model_id))
    if resolved.train.scst.objective == "c2f" and not entry(model_id).coarse_to_fine:
        raise ModelError(f"scst.objective=c2f rewards every stage of a multi-stage decoder, and {model_id} has one "
                         "stage; use it with --model stackcap, or drop it")
    return RunSpec(model_id, data, resolved.encoder, resolved.train, resolved.model)


RESUMABLE = ("xe.epochs", "xe.max_steps", "scst.epochs", "scst.lr", "scst.mirror_share", "select.patience")
"""What a resumed run may change: how long each phase goes on, and the self-critical phase's rate and mirrored share.
Everything else already shaped the checkpoints the run has written."""


def _changed_keys(before: RunSpec, after: RunSpec) -> list[str]:
    """``SECTION.FIELD`` of every value that differs between two specs."""
    def flat(spec: RunSpec) -> dict[str, object]:
        train = asdict(spec.train)
        groups = {f"{group}.{k}": v for group in ("optim", "xe", "scst", "hard", "select")
                  for k, v in train.pop(group).items()}
        return {**{f"encoder.{k}": v for k, v in asdict(spec.encoder).items()}, **groups,
                **{f"train.{k}": v for k, v in train.items()}, **{f"model.{k}": v for k, v in spec.model.items()}}

    old, new = flat(before), flat(after)
    defaults = {f"model.{k}": v for k, v in settable_fields(before.model_id).items()}
    return sorted(k for k in old.keys() | new.keys() if old.get(k, defaults.get(k)) != new.get(k, defaults.get(k)))


def run_spec(*, run_dir: Path, spec: RunSpec | None, resume: bool, changes: Sequence[str] = ()) -> RunSpec:
    """The spec a run uses: config.json's with ``changes`` applied when resuming, else ``spec``; refuses a bad
    --resume or --out, and a change that only a new run can make (a change that repeats config.json is none)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ModelError(f"{run_dir}: a file, not a run directory; choose another --out")
    if not resume:
        if (run_dir / "last.pt").exists():
            raise ModelError(f"{run_dir}: already holds a run; pass --resume to continue it or choose another --out")
        return spec
    if not (run_dir / "last.pt").exists():
        raise ModelError(f"{run_dir}: nothing to resume (no last.pt); drop --resume to start a new run")
    if "train_state" not in read_checkpoint(run_dir / "last.pt"):
        raise ModelError(f"{run_dir / 'last.pt'}: weights without training state (a best.pt copy?), so it cannot "
                         "be resumed; put the run's own last.pt back or start a new run with --out")
    saved = RunSpec.read(run_dir)
    resumed = apply_overrides(saved.as_preset(), list(changes), settable_fields(saved.model_id))
    after = RunSpec(saved.model_id, saved.data, resumed.encoder, resumed.train, resumed.model)
    refused = [key for key in _changed_keys(saved, after) if key not in RESUMABLE]
    if refused:
        raise ModelError(f"{run_dir}: --resume cannot change {', '.join(refused)}, since the run's checkpoints were "
                         f"trained with its config.json; it may change {', '.join(RESUMABLE)} (start a new run with "
                         "--out for anything else)")
    return after


def write_run_files(run_dir: Path, spec: RunSpec, vocab: Vocab, *, new: bool) -> None:
    """config.json (the resolved spec), the command line appended to command.txt, and a new run's vocab.json; the
    temporary files a checkpoint write killed midway left behind are removed."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for leftover in run_dir.glob(".*.tmp"):
        leftover.unlink()
    (run_dir / "config.json").write_text(json.dumps(spec.to_json(), indent=2))
    with open(run_dir / "command.txt", "a") as f:
        f.write(" ".join(sys.argv) + "\n")
    if new:
        vocab.save(run_dir / "vocab.json")


def last_phase(run_dir: Path) -> str:
    """The phase of the last epoch ``metrics.jsonl`` records, or a ModelError naming the file."""
    path = run_dir / "metrics.jsonl"
    try:
        return json.loads(path.read_text().splitlines()[-1])["phase"]
    except (OSError, IndexError, KeyError, TypeError, json.JSONDecodeError):
        raise ModelError(f"{path}: missing or damaged, so the finished run cannot say which phase to reopen; "
                         "start a new run with --out (and train.init from this run's best.pt)") from None


def reopen(state: TrainState, cfg: TrainConfig, last_phase: str) -> str:
    """A finished run continues when config.json was given more epochs since: a self-critical phase added after
    cross-entropy starts (after any cross-entropy epochs added too), else the last phase goes on with a fresh
    patience. Updates ``state`` and returns the line to tell the user."""
    limit = cfg.scst.epochs if last_phase == "scst" else cfg.xe.epochs
    if last_phase == "xe" and cfg.scst.epochs:
        state.phase = "xe"  # the run moves on to self-critical training once cross-entropy is over
    elif state.epoch < limit:
        state.phase, state.bad_epochs = last_phase, 0
    limits = f"xe.epochs={cfg.xe.epochs}, scst.epochs={cfg.scst.epochs}"
    if state.phase == "done":
        return (f"already finished ({limits}); more epochs continue it, e.g. --resume --scst-epochs N or --resume "
                "--set xe.epochs=N")
    return f"reopening the finished run ({limits})"
