"""scripts/ship_model.py, which turns a run into the shipped default: fp16, INT8 or INT4 weights that load (as a model
and as another run's encoder.weights), and a card that names the architecture and the command."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import invoke
from tests.needs import needs_scoring

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ship_model.py"


@needs_scoring
@pytest.mark.slow
@pytest.mark.parametrize("weights", ["fp16", "int8", "int4"])
def test_a_shipped_run_loads_from_its_stored_weights_and_its_card_names_architecture_and_command(
        tiny_export, tmp_path, weights):
    from edgecap.checkpoint import load_model, read_checkpoint
    from edgecap.data import load_dataset
    from edgecap.models.encoder import read_encoder_weights
    from edgecap.runtime.search import SearchOptions
    from edgecap.torch_backend import caption_images
    from edgecap.weight_storage import pack_int4, stored_weights

    run = tiny_export / "run"
    scores = tmp_path / "eval.json"
    code, output = invoke("eval", str(run), "--data", "shapes", "--split", "test", "--max-images", "8",
                          "--json", str(scores))
    assert code == 0, output
    out = tmp_path / "shipped" / "model.pt"
    command = "edgecap train --data shapes --preset tiny --max-steps 150"
    subprocess.run([sys.executable, str(SCRIPT), str(run), "--eval-json", str(scores), "--command", command,
                    "--out", str(out), "--weights", weights], check=True, capture_output=True)

    payload = read_checkpoint(out)
    decoder, encoder = ({v.dtype for v in payload[part].values()} for part in ("decoder", "encoder"))
    assert torch.float32 not in decoder | encoder and torch.int8 not in encoder
    assert (torch.int8 in decoder) == (weights == "int8") and (torch.uint8 in decoder) == (weights == "int4")
    card = (out.parent / "MODEL_CARD.md").read_text()
    assert card.startswith("# Shipped default model: Show, Attend and Tell on Flickr8k")
    assert command in card and "`model.pt`" in card
    assert f"- Weights: {'fp16' if weights == 'fp16' else f'decoder weight-only {weights.upper()}'} (" in card
    shipped, trained = load_model(out).model, load_model(run).model
    if weights == "int4":  # 4-bit steps are too coarse for a tolerance: the very weights its packing stands for
        expected = stored_weights(pack_int4({k: v.half() for k, v in trained.decoder.state_dict().items()}))
        assert all(torch.equal(shipped.decoder.state_dict()[k], v) for k, v in expected.items())
    for name, weight in trained.decoder.state_dict().items():
        tolerance = 0.02 if weights != "int4" else 0.35  # a group's outlier may be clipped by up to 30%
        assert torch.allclose(shipped.decoder.state_dict()[name], weight,
                              atol=tolerance * weight.abs().max().item()), name
    encoder = shipped.encoder.state_dict()
    assert all(torch.equal(encoder[k], v) for k, v in read_encoder_weights(out).items())
    image = load_dataset("shapes").split("test")[0].path
    assert caption_images(load_model(out), [image], SearchOptions())[0].words
    if weights == "fp16":  # every weight is an fp16 value, so the export stores its graphs compactly
        exported = tmp_path / "exp"
        code, output = invoke("export", str(out), "--out", str(exported))
        assert code == 0 and "stored as fp16, bit-identical once loaded (lossless)" in output, output
        for graph in ("encoder.onnx", "step.onnx"):  # the encoder's too, its batch norms folded in
            assert (exported / graph).stat().st_size < 0.6 * (tiny_export / "exp" / graph).stat().st_size, graph
        assert invoke("caption", str(image), "--model", str(exported)) == invoke("caption", str(image), "--model",
                                                                                  str(out))
