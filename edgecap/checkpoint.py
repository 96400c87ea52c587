"""Self-describing checkpoints, written atomically and loaded with ``weights_only=True``.

A checkpoint holds everything needed to rebuild the model without CLI flags:
model id and config, encoder config, preprocessing, vocabulary and weights. The
encoder's weights are stored only when they differ from the pretrained package
(fine-tuned, trained from scratch or read from a file), which keeps a frozen-encoder model small.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from edgecap.config import DEFAULT_MODEL, EncoderConfig
from edgecap.errors import ModelError
from edgecap.models import MODELS, build_model
from edgecap.models.caption_model import CaptionModel
from edgecap.models.encoder import build_encoder
from edgecap.preprocess import Preprocessing
from edgecap.runtime.manifest import Manifest, file_sha256
from edgecap.vocab import Vocab
from edgecap.weight_storage import require_scales, stored_weights, weights_digest

FORMAT = "edgecap-checkpoint/1"


@dataclass
class LoadedModel:
    model: CaptionModel
    model_id: str
    vocab: Vocab
    prep: Preprocessing
    encoder_config: EncoderConfig
    path: Path
    metrics: dict


def checkpoint_payload(captioner: CaptionModel, *, model_id: str, vocab: Vocab, prep: Preprocessing,
                       encoder_config: EncoderConfig, metrics: dict, half: bool = False) -> dict:
    """The model part of a checkpoint (training state is added by the loop)."""
    cast = (lambda t: t.half() if t.is_floating_point() else t) if half else (lambda t: t)
    own_encoder = encoder_config.finetune or encoder_config.name == "small_cnn" or bool(encoder_config.weights)
    encoder_weights = captioner.encoder.state_dict().items() if own_encoder else None
    return {
        "format": FORMAT,
        "model_id": model_id,
        "model_config": asdict(captioner.decoder.config),
        "encoder_config": asdict(encoder_config),
        "preprocessing": prep.to_json(),
        "vocab": vocab.to_json(),
        "decoder": {k: cast(v.detach().cpu()) for k, v in captioner.decoder.state_dict().items()},
        "encoder": {k: cast(v.detach().cpu()) for k, v in encoder_weights} if encoder_weights else None,
        "metrics": metrics,
    }


def on_cpu(tree):
    """``tree`` (nested dicts and lists) with every tensor moved to the CPU, so a checkpoint written on a GPU loads
    anywhere; an optimizer moves its state back to its parameters' device when it loads it."""
    if isinstance(tree, torch.Tensor):
        return tree.cpu()
    if isinstance(tree, dict):
        return {key: on_cpu(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [on_cpu(value) for value in tree]
    return tree


def save_atomic(payload: dict, path: Path) -> None:
    """Write to a temp file in the same folder, then rename: a kill never leaves half a checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(payload, tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a checkpoint is an ordinary shareable file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_checkpoint(path: Path) -> dict:
    """The raw payload, or a ModelError naming the file and the fix."""
    if path.is_dir():
        if (path / "config.json").is_file() and not (path / "best.pt").is_file():
            raise ModelError(f"{path}: this run has no best.pt yet (it stopped before its first epoch ended); "
                             f"continue it with `edgecap train --out {path} --resume`, or pass another run")
        path = path / "best.pt"
    if not path.is_file():
        raise ModelError(f"{path}: no checkpoint; pass a run directory (with best.pt) or a .pt file from edgecap train")
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises many types for a corrupt file
        raise ModelError(f"{path}: not a readable checkpoint ({type(err).__name__}); re-run edgecap train") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ModelError(f"{path}: checkpoint format '{found}', expected '{FORMAT}'; re-train or upgrade edgecap")
    for part in ("decoder", "encoder"):
        require_scales(payload.get(part) or {}, path)
    return payload


def load_model(path: Path | None = None) -> LoadedModel:
    """Rebuild the captioner of a checkpoint or run directory; ``None`` means the shipped default. A checkpoint in
    the right format whose fields or weights do not fit its model is one ModelError naming the file."""
    path = Path(path) if path is not None else DEFAULT_MODEL
    payload = read_checkpoint(path)
    model_id = payload.get("model_id")
    if model_id not in MODELS:
        raise ModelError(f"{path}: model '{model_id}' is unknown to this edgecap; upgrade edgecap")
    try:
        encoder_config = EncoderConfig(**payload["encoder_config"])
        encoder = build_encoder(encoder_config, pretrained=payload["encoder"] is None)
        if payload["encoder"] is not None:
            encoder.load_state_dict(stored_weights(payload["encoder"]))
        require_encoder(payload, encoder, path)
        decoder = build_model(model_id, payload["model_config"])
        decoder.load_state_dict(stored_weights(payload["decoder"]))
        vocab, prep = Vocab.from_json(payload["vocab"]), Preprocessing.from_json(payload["preprocessing"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:  # missing fields, weights that do not fit
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise ModelError(f"{path}: a damaged checkpoint ({type(err).__name__}: {reason}); copy it again or "
                         "re-run edgecap train") from None
    return LoadedModel(model=CaptionModel(encoder, decoder).eval(), model_id=model_id, vocab=vocab, prep=prep,
                       encoder_config=encoder_config, path=path, metrics=payload.get("metrics", {}))


def require_encoder(payload: dict, encoder: torch.nn.Module, path: Path) -> None:
    """A decoder stored without the encoder it shares (``ship_model.py``) gets the very weights it trained on, or a
    ModelError naming the file."""
    recorded = payload.get("encoder_digest")
    if recorded and weights_digest(encoder.state_dict()) != recorded:
        raise ModelError(f"{path}: this decoder was trained on another shipped encoder than this install's; "
                         "reinstall edgecap, or re-ship the model with its own encoder")


def checkpoint_file(path: Path | None) -> Path:
    """The file a run directory, checkpoint path or ``None`` (the shipped default) stands for."""
    path = Path(path) if path is not None else DEFAULT_MODEL
    return path / "best.pt" if path.is_dir() else path



def load_reference(manifest: Manifest, path: Path | None = None) -> LoadedModel:
    """The PyTorch model an export was made from: ``path`` or the one the manifest records, checked by sha256."""
    recorded = manifest.source_checkpoint
    file = checkpoint_file(path if path is not None else Path(recorded) if recorded else None)
    if not file.is_file():
        raise ModelError(f"{file}: the export's source checkpoint is not there; pass it with --reference RUN")
    if file_sha256(file) != manifest.source_checkpoint_sha256:
        raise ModelError(f"{file}: not the checkpoint this export was made from (sha256 differs); "
                         "pass the right one with --reference RUN, or re-export")
    return load_model(file)
