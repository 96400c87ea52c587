"""scripts/ship_default.py, which turns a run into the shipped default: fp16 weights that load, and a card that
names the architecture and the command."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.needs import needs_scoring
from tests.test_cli import invoke

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ship_default.py"


@needs_scoring
@pytest.mark.slow
def test_a_shipped_run_loads_from_fp16_weights_and_its_card_names_architecture_and_command(tiny_export, tmp_path):
    from edgecap.runtime.search import SearchOptions

    from edgecap.captioning import caption_images
    from edgecap.data import load_dataset
    from edgecap.training.checkpoint import load_model, read_checkpoint

    run = tiny_export / "run"
    scores = tmp_path / "eval.json"
    code, output = invoke("eval", str(run), "--data", "shapes", "--split", "test", "--max-images", "8",
                          "--json", str(scores))
    assert code == 0, output
    out = tmp_path / "shipped" / "model.pt"
    command = "edgecap train --data shapes --preset tiny --max-steps 150"
    subprocess.run([sys.executable, str(SCRIPT), str(run), "--eval-json", str(scores), "--command", command,
                    "--out", str(out)], check=True, capture_output=True)

    payload = read_checkpoint(out)
    assert {v.dtype for v in payload["decoder"].values() if v.is_floating_point()} == {torch.float16}
    card = (out.parent / "MODEL_CARD.md").read_text()
    assert card.startswith("# Shipped default model: Show, Attend and Tell on Flickr8k")
    assert command in card and "`model.pt`" in card
    image = load_dataset("shapes").split("test")[0].path
    assert caption_images(load_model(out), [image], SearchOptions())[0].words
