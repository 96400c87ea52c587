"""The checkpoints that ship inside the package, one per architecture, named on the command line by ``--model ID``.

The shipped default (SAT) holds the fine-tuned encoder that every shipped decoder was trained on; each other
architecture's file holds its decoder alone and names that encoder (``encoder.weights=shipped``), so the package
carries the encoder once. Torch-free: ``edgecap caption`` resolves ``--model`` before it knows what runs it.
"""

from __future__ import annotations

from pathlib import Path

from edgecap.config import DEFAULT_MODEL
from edgecap.errors import EdgecapError
from edgecap.models import MODELS

DEFAULT_ID = "sat"
MODELS_DIR = DEFAULT_MODEL.parent.parent / "models"  # assets/models/ID/model.pt, with its MODEL_CARD.md


def shipped_file(model_id: str) -> Path:
    """Where architecture ``model_id``'s shipped checkpoint lives (or would)."""
    return DEFAULT_MODEL if model_id == DEFAULT_ID else MODELS_DIR / model_id / "model.pt"


def shipped_ids() -> list[str]:
    """The architectures whose checkpoint this install carries, the default first."""
    return [DEFAULT_ID] + sorted(p.parent.name for p in MODELS_DIR.glob("*/model.pt") if p.parent.name in MODELS)


def shipped_file_or(value: Path) -> Path:
    """The checkpoint ``train.init`` names: a shipped id's file (``glied``; ``sat`` the default's), else the path."""
    if len(value.parts) == 1 and not value.exists():
        if str(value) == DEFAULT_ID:
            return DEFAULT_MODEL
        if shipped_file(str(value)).is_file():
            return shipped_file(str(value))
    return value


def shipped_id(path: Path | None) -> str | None:
    """The architecture id of a shipped checkpoint's path (None: the shipped default too), else None."""
    if path is None:
        return DEFAULT_ID
    return next((i for i in shipped_ids() if Path(path).resolve() == shipped_file(i).resolve()), None)


def model_path(value: Path | None) -> Path | None:
    """What ``--model`` (or a RUN argument) names: a path that exists as itself; ``sat`` the shipped default (None);
    another shipped architecture's id its file; a bare name that is neither, one line saying what ships."""
    if value is None or value.exists() or len(value.parts) != 1:
        return value
    name = str(value)
    if name == DEFAULT_ID:
        return None
    if shipped_file_or(value) != value:
        return shipped_file(name)
    shipped = ", ".join(shipped_ids())
    if name in MODELS:
        raise EdgecapError(f"--model {name}: no {name} checkpoint ships with this edgecap (shipped: {shipped}); "
                           f"train one (`edgecap train --preset {name}-flickr8k ...`) and pass its run directory")
    raise EdgecapError(f"--model {name}: no such file or directory, and not a shipped model ({shipped})")
