"""The checkpoints shipped per architecture: a decoder trained on the shipped encoder ships without it, runs by its
id (`--model ID`) with the very captions of its run, and refuses an encoder other than the one it trained on."""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from edgecap.checkpoint import checkpoint_payload, load_model, read_checkpoint, save_atomic
from edgecap.config import DEFAULT_MODEL, SHIPPED
from edgecap.errors import EdgecapError, ModelError
from edgecap.models import MODELS, build_model
from edgecap.models.caption_model import CaptionModel
from edgecap.runtime.search import SearchOptions
from edgecap.shipped import model_path, shipped_file, shipped_ids
from edgecap.torch_backend import caption_images
from edgecap.weight_storage import weights_digest
from tests.helpers import SAMPLES, invoke

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ship_model.py"


def spca_run_on_the_shipped_encoder(root: Path) -> Path:
    """A run directory holding a small untrained SPCA decoder on the shipped default's encoder, as `edgecap train
    --preset spca-flickr8k` leaves it (encoder stored, encoder.weights=shipped); weights rounded to fp16 so shipping
    them in fp16 changes nothing."""
    default = load_model(None)
    torch.manual_seed(0)
    decoder = build_model("spca", {**MODELS["spca"].sizes["tiny"], "vocab_size": len(default.vocab),
                                   "feature_dim": 1280, "num_locations": 81})
    decoder.load_state_dict({k: v.half().float() for k, v in decoder.state_dict().items()})
    payload = checkpoint_payload(CaptionModel(default.model.encoder, decoder.eval()), model_id="spca",
                                 vocab=default.vocab, prep=default.prep, metrics={},
                                 encoder_config=replace(default.encoder_config, weights=SHIPPED))
    run = root / "run"
    save_atomic(payload, run / "best.pt")
    config = {"model_id": "spca", "encoder": {"weights": SHIPPED},
              "train": {"min_word_count": 5, "select": {"beam": 3}}}
    (run / "config.json").write_text(json.dumps(config))
    (run / "metrics.jsonl").write_text(json.dumps({"phase": "xe", "epoch": 1, "dev_cider": 1.0}) + "\n")
    return run


def ship(run: Path, out: Path) -> None:
    scores = run / "eval.json"
    scores.write_text(json.dumps({"beam": 3, "metrics": {"CIDEr": 0.01}}))
    subprocess.run([sys.executable, str(SCRIPT), str(run), "--eval-json", str(scores), "--command", "edgecap train",
                    "--out", str(out)], check=True, capture_output=True)


def test_a_decoder_on_the_shipped_encoder_ships_alone_and_captions_by_id_as_its_run_does(tmp_path, monkeypatch):
    run = spca_run_on_the_shipped_encoder(tmp_path)
    out = tmp_path / "models" / "spca" / "model.pt"
    ship(run, out)

    payload = read_checkpoint(out)
    assert payload["encoder"] is None and payload["encoder_config"]["weights"] == SHIPPED
    assert out.stat().st_size < (run / "best.pt").stat().st_size / 4  # the encoder is most of the run's file
    assert (out.parent / "MODEL_CARD.md").read_text().startswith("# Shipped model: SPCA on Flickr8k (`--model spca`)")
    image = SAMPLES / "dog.jpg"
    expected = caption_images(load_model(run), [image], SearchOptions())[0].words
    assert caption_images(load_model(out), [image], SearchOptions())[0].words == expected

    monkeypatch.setattr("edgecap.shipped.MODELS_DIR", tmp_path / "models")
    assert shipped_ids() == ["sat", "spca"]
    code, output = invoke("caption", str(image), "--model", "spca", "--json")
    assert code == 0, output
    assert json.loads(output.splitlines()[-1])["caption"] == " ".join(expected)


def test_a_shipped_decoder_refuses_an_encoder_it_was_not_trained_on(tmp_path):
    run = spca_run_on_the_shipped_encoder(tmp_path)
    out = tmp_path / "model.pt"
    ship(run, out)
    payload = torch.load(out, weights_only=True)
    payload["encoder_digest"] = "0" * 64
    save_atomic(payload, out)
    with pytest.raises(ModelError, match="trained on another shipped encoder"):
        load_model(out)


def test_an_architecture_id_names_its_shipped_file_and_an_unshipped_one_says_what_ships(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("edgecap.shipped.MODELS_DIR", tmp_path / "models")
    assert model_path(Path("sat")) is None and model_path(None) is None
    with pytest.raises(EdgecapError, match=r"no glied checkpoint ships with this edgecap \(shipped: sat\)"):
        model_path(Path("glied"))
    with pytest.raises(EdgecapError, match="not a shipped model"):
        model_path(Path("nonesuch"))
    (tmp_path / "models" / "glied").mkdir(parents=True)
    (tmp_path / "models" / "glied" / "model.pt").write_bytes(b"")
    assert model_path(Path("glied")) == shipped_file("glied")
    (tmp_path / "glied").mkdir()  # a run directory of that name, here, is what the user means
    assert model_path(Path("glied")) == Path("glied")
    for command in (["export", "--model", "stackcap", "--out", "x"],
                    ["eval", "--model", "stackcap", "--data", "shapes"]):
        code, output = invoke(*command)
        assert code == 2 and "no stackcap checkpoint ships with this edgecap" in output, command
    code, output = invoke("eval", "glied", "--model", str(tmp_path / "glied"), "--data", "shapes")
    assert code == 2 and "pass one, as RUN or as --model" in output


def test_every_shipped_decoder_was_trained_on_the_encoder_this_package_ships():
    encoder = weights_digest(load_model(DEFAULT_MODEL).model.encoder.state_dict())
    assert not any(key.startswith("_fc.") for key in read_checkpoint(DEFAULT_MODEL)["encoder"]), "the classifier ships"
    for model_id in shipped_ids()[1:]:
        payload = read_checkpoint(shipped_file(model_id))
        assert payload["model_id"] == model_id and payload["encoder"] is None
        assert payload["encoder_digest"] == encoder, model_id
        assert (shipped_file(model_id).parent / "MODEL_CARD.md").is_file(), model_id
