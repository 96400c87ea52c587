"""Export a tiny trained model, then caption through ONNX Runtime with no torch and compare with PyTorch."""

import json

import pytest

from edgecap.errors import ModelError
from edgecap.runtime.manifest import MANIFEST_NAME, Manifest
from tests.helpers import invoke
from tests.without_torch import run_without_torch


@pytest.mark.slow
def test_manifest_describes_the_step_contract(tiny_export):
    manifest = Manifest.read(tiny_export / "exp")
    assert manifest.model_id == "sat" and manifest.opset == 18 and manifest.topk == 6
    step_inputs = {t.name: t for t in manifest.step_inputs}
    assert {"tokens", "step", "reorder", "state.h", "state.c", "memory.features", "memory.att_proj"} == set(step_inputs)
    assert step_inputs["step"].shape == () and step_inputs["tokens"].shape == ("N",)
    assert manifest.state_pairs == {"state.c": "state.c.next", "state.h": "state.h.next"}
    assert all(t.shape[0] == "N" for t in manifest.encoder_outputs)
    assert len(manifest.source_checkpoint_sha256) == 64


@pytest.mark.slow
def test_ort_captions_equal_pytorch_captions(tiny_export):
    from edgecap.data import load_dataset

    images = [str(r.path) for r in load_dataset("shapes").split("test")[:12]]
    code, torch_out = invoke("caption", *images, "--model", str(tiny_export / "run"), "--json")
    assert code == 0, torch_out
    code, ort_out = invoke("caption", *images, "--model", str(tiny_export / "exp"), "--backend", "ort", "--json")
    assert code == 0, ort_out
    captions = [[json.loads(line)["caption"] for line in out.strip().splitlines()] for out in (torch_out, ort_out)]
    assert captions[0] == captions[1]


@pytest.mark.slow
def test_export_directory_captions_without_torch(tiny_export):
    from edgecap.data import load_dataset

    image = load_dataset("shapes").split("test")[0].path
    assert run_without_torch(f"""
        from edgecap.runtime.pipeline import Captioner
        from edgecap.runtime.search import SearchOptions
        [result] = Captioner.from_dir({str(tiny_export / "exp")!r}).caption([{str(image)!r}], SearchOptions())
        assert result.text
        print(result.text)
    """).strip()


@pytest.mark.slow
def test_the_cli_captions_an_export_directory_without_torch_or_a_backend_flag(tiny_export):
    """What a runtime-only install does: ``--model`` naming an export directory is enough."""
    from edgecap.data import load_dataset

    image = str(load_dataset("shapes").split("test")[0].path)
    output = run_without_torch(f"""
        from edgecap.cli import main
        sys.argv = ["edgecap", "caption", {image!r}, "--model", {str(tiny_export / "exp")!r}]
        try:
            main()
        except SystemExit as done:
            assert not done.code, done.code
    """)
    assert output.startswith(f"{image}: ") and len(output.split()) >= 3, output


@pytest.mark.slow
def test_frames_in_memory_caption_as_their_files_do(tiny_export):
    import numpy as np

    from edgecap.data import load_dataset
    from edgecap.errors import ImageError
    from edgecap.preprocess import read_rgb
    from edgecap.runtime.pipeline import Captioner
    from edgecap.runtime.search import SearchOptions

    captioner = Captioner.from_dir(tiny_export / "exp")
    paths = [r.path for r in load_dataset("shapes").split("test")[:5]]
    frames = [np.asarray(read_rgb(p, target_size=captioner.prep.image_size)) for p in paths]
    from_files = captioner.caption(paths, SearchOptions(), batch_size=2)
    from_frames = captioner.caption_frames(frames, SearchOptions(), batch_size=2)
    assert [c.text for c in from_frames] == [c.text for c in from_files]
    assert [c.image for c in from_frames] == [None] * 5 and from_files[0].image == paths[0]
    with pytest.raises(ImageError, match="frame 3: expected a uint8 array"):
        captioner.caption_frames([*frames[:3], frames[3].astype(np.float32)], SearchOptions(), batch_size=2)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["missing-manifest", "other-version", "corrupt-step", "missing-step"])
def test_damaged_export_directories_are_one_line_errors(tiny_export, tmp_path, damage):
    import shutil

    from edgecap.runtime.pipeline import Captioner

    broken = tmp_path / "exp"
    shutil.copytree(tiny_export / "exp", broken)
    if damage == "missing-manifest":
        (broken / MANIFEST_NAME).unlink()
    elif damage == "other-version":
        data = json.loads((broken / MANIFEST_NAME).read_text())
        (broken / MANIFEST_NAME).write_text(json.dumps({**data, "format_version": 99}))
    elif damage == "corrupt-step":
        (broken / "step.onnx").write_bytes(b"not a graph")
    else:
        (broken / "step.onnx").unlink()
    with pytest.raises(ModelError) as err:
        Captioner.from_dir(broken)
    assert str(broken) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("beam", [1, 3])  # greedy skips tiling the encoder's rows
def test_io_binding_and_fp16_graphs_caption_like_fp32(tiny_export, beam):
    from edgecap.data import load_dataset
    from edgecap.runtime.backends.ort import OrtBackend
    from edgecap.runtime.pipeline import Captioner
    from edgecap.runtime.search import SearchOptions

    images = [r.path for r in load_dataset("shapes").split("test")[:8]]
    options = SearchOptions(beam_size=beam)
    fp32 = Captioner.from_dir(tiny_export / "exp")
    bound = Captioner(OrtBackend(tiny_export / "exp", fp32.manifest, io_binding=True), fp32.manifest)
    fp16 = Captioner.from_dir(tiny_export / "exp", precision="fp16")
    texts = [[c.text for c in captioner.caption(images, options)] for captioner in (fp32, bound, fp16)]
    assert texts[0] == texts[1]
    assert sum(a == b for a, b in zip(texts[0], texts[2], strict=True)) >= 7


@pytest.mark.slow
def test_fp16_graph_is_half_precision_with_fp32_io_and_cell_state(tiny_export):
    import onnx

    manifest = Manifest.read(tiny_export / "exp")
    step = onnx.shape_inference.infer_shapes(onnx.load(str(tiny_export / "exp" / manifest.graphs["fp16"]["step"])))
    half = [t for t in step.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert len(half) >= len(step.graph.initializer) // 2
    graph_io = [*step.graph.input, *step.graph.output]
    assert all(v.type.tensor_type.elem_type != onnx.TensorProto.FLOAT16 for v in graph_io)
    dtype = {v.name: v.type.tensor_type.elem_type for v in [*step.graph.value_info, *graph_io]}
    producer = {out: node for node in step.graph.node for out in node.output}

    def computed_by(output):  # the node behind the converter's output Cast, if any
        node = producer[output]
        return producer[node.input[0]] if node.op_type == "Cast" else node

    cell_update, log_softmax = computed_by("state.c.next"), computed_by("logprobs")
    assert cell_update.op_type == "Add" and dtype[cell_update.output[0]] == onnx.TensorProto.FLOAT
    assert log_softmax.op_type == "LogSoftmax" and dtype[log_softmax.output[0]] == onnx.TensorProto.FLOAT


@pytest.mark.slow
def test_a_missing_gpu_provider_is_a_one_line_error(tiny_export):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    from edgecap.preprocess import SAMPLE_IMAGES

    code, output = invoke("caption", str(SAMPLE_IMAGES / "coffee.jpg"), "--model", str(tiny_export / "exp"),
                          "--backend", "ort", "--device", "cuda")
    assert code == 2 and "no cuda provider" in output and "\n" not in output.strip()
