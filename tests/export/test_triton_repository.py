"""`edgecap export --triton DIR`: a Triton model repository whose step graph computes what the export's does, served
by a real tritonserver (the one nvidia-pytriton bundles, Python backend only) with the captions the runtime gives."""
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from edgecap.client import ServerError, TritonClient
from edgecap.runtime import Captioner, SearchOptions
from edgecap.runtime.backends.ort import cpu_session
from edgecap.runtime.manifest import Manifest
from tests.helpers import SAMPLES, invoke
from tests.triton_server import grpc_captions, missing, triton_server

pytest.importorskip("onnx", reason="the Triton repository's step graph is rewritten with onnx (the export extra)")


def _config_tensors(config: str, section: str) -> dict[str, list[int]]:
    body = re.search(rf"{section} \[\n(.*?)\n\]", config, re.S).group(1)
    entries = re.findall(r'name: "([^"]+)".*?dims: \[ ([^\]]+) \]', body)
    return {name: [int(d) for d in dims.split(",")] for name, dims in entries}


def test_the_repository_holds_the_export_contract_and_its_step_graph_computes_the_same(tiny_export, tmp_path):
    export = tiny_export / "exp"
    code, output = invoke("export", str(export), "--triton", str(tmp_path / "repo"))
    assert code == 0, output
    manifest = Manifest.read(export)
    for model, inputs, outputs in (("edgecap_encoder", manifest.encoder_inputs, manifest.encoder_outputs),
                                   ("edgecap_step", manifest.step_inputs, manifest.step_outputs)):
        config = (tmp_path / "repo" / model / "config.pbtxt").read_text()
        assert 'backend: "onnxruntime"' in config and "max_batch_size: 0" in config
        for section, specs in (("input", inputs), ("output", outputs)):
            assert _config_tensors(config, section) == {
                t.name: [-1 if isinstance(d, str) else d for d in t.shape] or [1] for t in specs}
    assert 'key: "step_model" value: { string_value: "edgecap_step" }' in (
        tmp_path / "repo" / "edgecap" / "config.pbtxt").read_text()

    original = cpu_session(export / manifest.graphs["fp32"]["step"])
    rewritten = cpu_session(tmp_path / "repo" / "edgecap_step" / "1" / "model.onnx")
    rng = np.random.default_rng(0)
    rows = 4
    feeds = {t.name: (rng.standard_normal([rows if isinstance(d, str) else d for d in t.shape]).astype(np.float32)
                      if t.dtype == "float32" else np.zeros([rows] * len(t.shape), dtype=np.int64))
             for t in manifest.step_inputs}
    feeds["tokens"] = rng.integers(0, len(manifest.vocab["words"]), rows)
    feeds["reorder"] = np.arange(rows)[::-1].copy()
    feeds["step"] = np.array(3, dtype=np.int64)
    names = [t.name for t in manifest.step_outputs]
    want = original.run(names, feeds)
    got = rewritten.run(names, {**feeds, "step": feeds["step"].reshape(1)})
    for name, a, b in zip(names, want, got, strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.slow
@pytest.mark.skipif(missing() is not None, reason=missing() or "")
def test_tritonserver_captions_as_the_runtime_does_over_http_and_grpc_and_under_load_and_refuses_bad_requests(
        tiny_export, tmp_path):
    export = tiny_export / "exp"
    code, output = invoke("export", str(export), "--triton", str(tmp_path / "repo"), "--triton-graphs", "python")
    assert code == 0, output
    photos = sorted(SAMPLES.glob("*.jpg"))
    captioner = Captioner.from_dir(export)
    expected = [c.text for c in captioner.caption(photos, SearchOptions())]
    expected_n_best = captioner.caption(photos[:1], SearchOptions(n_best=2, max_length=8))[0]
    with triton_server(tmp_path / "repo", tmp_path) as server:
        client = TritonClient(server.http)
        assert [client.caption(p)["caption"] for p in photos] == expected
        assert grpc_captions(server.grpc, photos) == expected
        answer = client.caption(photos[0].read_bytes(), n_best=2, max_length=8)
        assert answer["caption"] == expected_n_best.text
        assert answer["alternatives"] == list(expected_n_best.alternatives)
        assert answer["logprob"] == pytest.approx(expected_n_best.logprob, abs=1e-4)
        with ThreadPoolExecutor(8) as pool:  # Triton batches these; a batch must not change a caption
            assert list(pool.map(lambda p: client.caption(p)["caption"], photos * 4)) == expected * 4
        for image, options, reason in ((b"", {}, "empty image"), (b"not an image", {}, "not an image"),
                                       (photos[0].read_bytes()[:500], {}, "IMAGE"),
                                       (photos[0].read_bytes(), {"bogus": 1}, "unknown option"),
                                       (photos[0].read_bytes(), {"beam": 50}, "re-export with --beam 50")):
            with pytest.raises(ServerError) as refused:
                client.caption(image, **options)
            assert refused.value.status == 400 and reason in refused.value.reason and "\n" not in refused.value.reason
        assert client.caption(photos[0])["caption"] == expected[0]  # still serving
