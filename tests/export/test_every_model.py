"""Every registered model goes the whole way on generated shapes: tiny training, export, fp32 ORT parity.

The parametrisation is the registry itself, so a model added to ``edgecap.models.MODELS`` is covered here
without anyone remembering to add it, and so is Stack-Captioning's coarse stage alone, whose step has no
attention module. SAT's own export is ``tiny_export`` (tests/conftest.py).
"""

import json

import pytest

from edgecap.models import MODELS
from tests.helpers import invoke
from tests.needs import needs_scoring


def _interface(path):
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [v.name for v in graph.input], [v.name for v in graph.output]


@needs_scoring
@pytest.mark.slow
@pytest.mark.parametrize("model_id, settings",
                         [*(pytest.param(m, (), id=m) for m in sorted(set(MODELS) - {"sat"})),
                          pytest.param("stackcap", ("model.fine_stages=0",), id="stackcap-coarse")])
def test_model_trains_exports_and_passes_fp32_parity(model_id, settings, tmp_path):
    run, exported = tmp_path / "run", tmp_path / "exp"
    code, output = invoke("train", "--model", model_id, "--data", "shapes", "--preset", "tiny", "--out", str(run),
                          "--max-steps", "200", "--set", "select.images=20",
                          *(arg for setting in settings for arg in ("--set", setting)))
    assert code == 0, output
    code, output = invoke("export", str(run), "--out", str(exported), "--precision", "fp32,fp16")
    assert code == 0, output
    assert json.loads((exported / "edgecap.json").read_text())["model_id"] == model_id
    for graph in ("encoder", "step"):  # the runtime feeds every precision the same named tensors
        assert _interface(exported / f"{graph}.fp16.onnx") == _interface(exported / f"{graph}.onnx")
    code, output = invoke("parity", str(exported), "--data", "shapes", "--split", "test", "--max-images", "24",
                          "--json", str(tmp_path / "parity.json"))
    assert code == 0, output
    report = json.loads((tmp_path / "parity.json").read_text())
    assert report["identical_rate"] >= 0.99 and abs(report["delta_cider"]) <= 0.1

