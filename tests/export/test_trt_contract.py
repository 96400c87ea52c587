"""The TensorRT half of export and runtime, checked without a GPU: profiles, cache keys, refusals, the manifest's
engine records, one-line errors where TensorRT is missing, and the graph check `export --trt` runs before building.
Real engines are built and run only behind the ``tensorrt`` marker, on a machine that has TensorRT and a GPU."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgecap.errors import BackendUnavailableError, ModelError
from edgecap.preprocess import SAMPLE_IMAGES
from edgecap.runtime.engines import (
    DeviceInfo,
    EngineOptions,
    EngineRecord,
    Profile,
    engine_key,
    find_engine,
    profile_rows,
    profile_shapes,
)
from edgecap.runtime.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, TensorSpec
from tests.helpers import invoke, run_cli_without
from tests.without_torch import run_without_torch

HERE = DeviceInfo("NVIDIA H100 80GB HBM3", "9.0", "10.8.0")
SHA = "ab" * 32
STEP_INPUTS = (TensorSpec("tokens", "int64", ("N",), "input"), TensorSpec("step", "int64", (), "input"),
               TensorSpec("reorder", "int64", ("N",), "input"), TensorSpec("state.h", "float32", ("N", 64), "state"),
               TensorSpec("memory.features", "float32", ("N", 49, 32), "memory"))


def _tensorrt_missing() -> str | None:
    from edgecap.runtime.backends.trt_cuda import require_tensorrt

    try:
        require_tensorrt()
    except BackendUnavailableError as err:
        return str(err)
    return None


# ---- profiles -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("options", "encoder", "step"), [
    (EngineOptions(), Profile(1, 1, 32), Profile(1, 3, 96)),
    (EngineOptions(max_batch=8, opt_batch=4, beam=5), Profile(1, 4, 8), Profile(1, 20, 40)),
    (EngineOptions(max_batch=1, opt_batch=1, beam=1), Profile(1, 1, 1), Profile(1, 1, 1)),
])
def test_profile_rows_are_images_for_the_encoder_and_images_times_beam_for_the_step(options, encoder, step):
    assert profile_rows("encoder", options) == encoder
    assert profile_rows("step", options) == step


def test_profile_shapes_give_every_n_shaped_input_min_opt_max_and_skip_static_ones():
    shapes = profile_shapes(STEP_INPUTS, Profile(1, 3, 96))
    assert set(shapes) == {"tokens", "reorder", "state.h", "memory.features"}  # "step" is a static scalar
    assert shapes["tokens"] == ((1,), (3,), (96,))
    assert shapes["state.h"] == ((1, 64), (3, 64), (96, 64))
    assert shapes["memory.features"] == ((1, 49, 32), (3, 49, 32), (96, 49, 32))


def test_n_off_axis_0_and_bad_options_are_one_line_errors():
    with pytest.raises(ModelError, match="axis 0"):
        profile_shapes([TensorSpec("memory.x", "float32", (4, "N"), "memory")], Profile(1, 1, 2))
    with pytest.raises(ModelError, match="opt-batch 8 exceeds max-batch 4"):
        EngineOptions(max_batch=4, opt_batch=8)
    with pytest.raises(ModelError, match="beam"):
        EngineOptions(beam=0)


@pytest.mark.slow
def test_profiles_from_a_real_manifest(tiny_export):
    manifest = Manifest.read(tiny_export / "exp")
    options = EngineOptions(max_batch=16, opt_batch=2, beam=3)
    encoder = profile_shapes(manifest.encoder_inputs, profile_rows("encoder", options))
    size = manifest.preprocessing["image_size"]
    assert encoder == {"pixels": ((1, 3, size, size), (2, 3, size, size), (16, 3, size, size))}
    step = profile_shapes(manifest.step_inputs, profile_rows("step", options))
    assert set(step) == {t.name for t in manifest.step_inputs} - {"step"}
    for tensor in manifest.step_inputs:
        if tensor.name != "step":
            assert [s[0] for s in step[tensor.name]] == [1, 6, 48]
            assert all(s[1:] == tuple(tensor.shape[1:]) for s in step[tensor.name])


# ---- cache keys and records ---------------------------------------------------------------------------------------

def _record(**changes) -> EngineRecord:
    record = EngineRecord(graph="step", precision="fp16", file="engines/step.fp16.x.plan", source="step.fp16.onnx",
                          source_sha256=SHA, gpu=HERE.gpu, compute_capability=HERE.compute_capability,
                          tensorrt=HERE.tensorrt, profile=Profile(1, 3, 96))
    return replace(record, **changes)


@pytest.mark.parametrize("change", [
    {"gpu": "Orin"}, {"compute_capability": "8.7"}, {"tensorrt": "10.3.0"}, {"precision": "int8"},
    {"graph": "encoder"}, {"profile": Profile(1, 3, 48)}, {"profile": Profile(1, 6, 96)}, {"source_sha256": "cd" * 32},
])
def test_the_cache_key_changes_with_every_component(change):
    base = _record()
    assert base.key == engine_key(HERE, "fp16", "step", Profile(1, 3, 96), SHA)
    assert replace(base, **change).key != base.key
    assert _record().key == base.key  # and only with them


def _directory_with(tmp_path: Path, *records: EngineRecord) -> tuple[Path, dict]:
    for record in records:
        (tmp_path / record.file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / record.file).write_bytes(b"plan")
    return tmp_path, {r.key: r.to_json() for r in records}


def test_the_record_built_here_from_this_graph_is_found(tmp_path):
    other = _record(gpu="Orin", compute_capability="8.7", tensorrt="10.3.0", file="engines/orin.plan")
    directory, engines = _directory_with(tmp_path, other, _record())
    found = find_engine(engines, directory=directory, graph="step", precision="fp16", device=HERE, source_sha256=SHA)
    assert found == _record()


@pytest.mark.parametrize(("change", "words"), [
    ({"gpu": "Orin"}, ["GPU 'Orin'", "this machine: 'NVIDIA H100 80GB HBM3'"]),
    ({"compute_capability": "8.7"}, ["compute capability 8.7", "this machine: 9.0"]),
    ({"tensorrt": "10.3.0"}, ["TensorRT 10.3.0", "this machine: 10.8.0"]),
    ({"source_sha256": "cd" * 32}, ["step.fp16.onnx", "changed since"]),
])
def test_a_mismatched_engine_is_refused_in_one_line_saying_what_differs(tmp_path, change, words):
    directory, engines = _directory_with(tmp_path, _record(**change))
    with pytest.raises(ModelError) as err:
        find_engine(engines, directory=directory, graph="step", precision="fp16", device=HERE, source_sha256=SHA)
    message = str(err.value)
    assert "\n" not in message and str(directory / "engines/step.fp16.x.plan") in message
    assert all(word in message for word in words), message
    assert f"edgecap export {directory} --trt --precision fp16` on this machine" in message


def test_no_record_and_a_missing_plan_are_refused_with_the_fix(tmp_path):
    lookup = dict(directory=tmp_path, graph="step", precision="int8", device=HERE, source_sha256=SHA)
    with pytest.raises(ModelError, match=r"no int8 TensorRT engines.*--trt --precision int8` on this machine"):
        find_engine({}, **lookup)
    record = _record(precision="int8")
    with pytest.raises(ModelError, match="missing from the export directory"):
        find_engine({record.key: record.to_json()}, **lookup)


def _manifest(directory: Path, **extra) -> Manifest:
    """A small manifest that holds together, with stand-in graph files written to ``directory``."""
    for name in ("encoder.fp16.onnx", "step.fp16.onnx"):
        (directory / name).write_bytes(f"stand-in for {name}".encode())
    outputs = (TensorSpec("logprobs", "float32", ("N", 5), "output"),
               TensorSpec("topk_ids", "int64", ("N", 6), "output"),
               TensorSpec("topk_logprobs", "float32", ("N", 6), "output"),
               TensorSpec("state.h.next", "float32", ("N", 64), "state"))
    return Manifest(format_version=FORMAT_VERSION, model_id="sat", model_config={}, encoder_config={},
                    vocab={"words": ["<pad>", "<bos>", "<eos>", "<unk>", "a"]},
                    preprocessing={"image_size": 32, "mean": [0.5] * 3, "std": [0.5] * 3},
                    encoder_inputs=(TensorSpec("pixels", "float32", ("N", 3, 32, 32), "input"),), encoder_outputs=(),
                    step_inputs=STEP_INPUTS, step_outputs=outputs, state_pairs={"state.h": "state.h.next"}, topk=6,
                    max_length=20, opset=18,
                    graphs={"fp16": {"encoder": "encoder.fp16.onnx", "step": "step.fp16.onnx"}},
                    source_checkpoint_sha256=SHA, **extra)


def test_engine_records_round_trip_through_the_manifest_and_old_manifests_still_read(tmp_path):
    records = [_record(), _record(graph="encoder", source="encoder.fp16.onnx", profile=Profile(1, 1, 32))]
    manifest = _manifest(tmp_path, engines={r.key: r.to_json() for r in records}).write(tmp_path)
    again = Manifest.read(tmp_path)
    assert again == manifest
    assert [EngineRecord.from_json(r) for r in again.engines.values()] == records
    data = json.loads((tmp_path / MANIFEST_NAME).read_text())
    del data["engines"]  # written before engines existed
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    assert Manifest.read(tmp_path).engines == {}


# ---- without TensorRT ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["caption", "parity", "bench", "export"])
def test_trt_commands_without_tensorrt_are_one_line_errors(command, tmp_path):
    if _tensorrt_missing() is None:
        pytest.skip("this machine has TensorRT and a GPU")
    args = {"caption": ["caption", str(SAMPLE_IMAGES / "coffee.jpg"), "--backend", "trt", "--model", str(tmp_path)],
            "parity": ["parity", str(tmp_path), "--data", "shapes", "--backend", "trt"],
            "bench": ["bench", str(tmp_path), "--backend", "torch,ort,trt"],
            "export": ["export", "--out", str(tmp_path / "exp"), "--trt", "--precision", "fp16"]}[command]
    code, output = invoke(*args)
    assert code == 2 and "\n" not in output.strip(), output
    assert "pip install edgecap[trt] on a machine with an NVIDIA GPU" in output
    assert "TensorRT" in output and "import tensorrt" in output
    assert not (tmp_path / "exp").exists()  # export did no work before saying so


def test_the_trt_modules_import_and_refuse_in_one_line_without_torch():
    if _tensorrt_missing() is None:
        pytest.skip("this machine has TensorRT and a GPU")
    out = run_without_torch("""
        import edgecap.export.trt, edgecap.export.trt_compat, edgecap.runtime.engines
        from edgecap.errors import BackendUnavailableError
        from edgecap.runtime.backends.trt import TrtBackend
        try:
            TrtBackend("no-such-dir", None)
        except BackendUnavailableError as err:
            print(err)
    """)
    assert "pip install edgecap[trt]" in out and len(out.strip().splitlines()) == 1


# ---- the graph check `export --trt` runs first -----------------------------------------------------------------------

@pytest.mark.slow
def test_exported_fp16_and_int8_graphs_are_buildable_as_typed(tiny_export, int8_export):
    from edgecap.export.trt_compat import check_for_tensorrt, graph_problems

    for directory, precision in ((tiny_export / "exp", "fp16"), (int8_export, "int8"), (int8_export, "fp32")):
        manifest = Manifest.read(directory)
        for path in manifest.graph_files(directory, precision):
            assert graph_problems(path, precision) == [], path
        check_for_tensorrt(directory, manifest, [precision])


def _qdq_weight(model, op_types=("Conv", "MatMul", "Gemm")):
    """(DequantizeLinear node, its weight, its scale initializer) of the first quantised layer's weights."""
    from onnx import numpy_helper

    init = {t.name: t for t in model.graph.initializer}
    dq = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in init}
    layer = next(n for n in model.graph.node if n.op_type in op_types and n.input[1] in dq)
    node = dq[layer.input[1]]
    return node, numpy_helper.to_array(init[node.input[0]]), init[node.input[1]]


def _set_initializer(model, name: str, value: np.ndarray) -> None:
    from onnx import numpy_helper

    [tensor] = [t for t in model.graph.initializer if t.name == name]
    tensor.CopyFrom(numpy_helper.from_array(value, name))


def _break(model, damage: str) -> None:
    from onnx import TensorProto, helper

    if damage == "zero-point-3":
        node = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2)
        _set_initializer(model, node.input[2], np.array(3, dtype=np.int8))
    elif damage == "uint8-zero-point":
        node = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2)
        _set_initializer(model, node.input[2], np.array(128, dtype=np.uint8))
    elif damage == "int32-dequantize":
        model.graph.initializer.extend([helper.make_tensor("bias_q", TensorProto.INT32, [4], [1, 2, 3, 4]),
                                        helper.make_tensor("bias_scale", TensorProto.FLOAT, [], [0.01])])
        model.graph.node.append(helper.make_node("DequantizeLinear", ["bias_q", "bias_scale"], ["bias"],
                                                 name="bias_dq"))
    elif damage == "per-tensor-weights":
        node, _, scale = _qdq_weight(model)
        _set_initializer(model, scale.name, np.array(0.01, dtype=np.float32))
    elif damage == "scales-on-the-input-axis":
        node, weight, scale = _qdq_weight(model, ("MatMul",))
        axis = next(a for a in node.attribute if a.name == "axis")
        axis.i = 0
        _set_initializer(model, scale.name, np.full(weight.shape[0], 0.01, dtype=np.float32))
    elif damage == "opset-12":
        next(o for o in model.opset_import if o.domain in ("", "ai.onnx")).version = 12
    elif damage == "float16-input":
        model.graph.input[-1].type.tensor_type.elem_type = TensorProto.FLOAT16
    elif damage == "float16-output":
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "graph", "damage", "words"), [
    ("int8", "step", "zero-point-3", "zero point [3]"),
    ("int8", "encoder", "uint8-zero-point", "zero point [128] (uint8)"),
    ("int8", "step", "int32-dequantize", "dequantises INT32"),
    ("int8", "encoder", "per-tensor-weights", "not one per output channel"),
    ("int8", "step", "scales-on-the-input-axis", "not one per output channel"),
    ("int8", "step", "opset-12", "opset 12"),
    ("fp16", "step", "float16-input", "is float16"),
    ("fp16", "encoder", "float16-output", "is float16"),
])
def test_graphs_broken_on_purpose_fail_the_check(tiny_export, int8_export, tmp_path, precision, graph, damage, words):
    import onnx

    from edgecap.export.trt_compat import graph_problems

    source = (int8_export if precision == "int8" else tiny_export / "exp") / f"{graph}.{precision}.onnx"
    model = onnx.load(str(source))
    _break(model, damage)
    broken = tmp_path / source.name
    onnx.save(model, str(broken))
    problems = graph_problems(broken, precision)
    assert problems and any(words in p for p in problems), problems
    assert all(p.startswith(broken.name) and "\n" not in p for p in problems)


@pytest.mark.slow
def test_export_trt_without_onnx_names_the_trt_extra(tiny_export):
    output = run_cli_without("onnx", ["export", str(tiny_export / "exp"), "--trt", "--precision", "fp32"])
    *_, message, status = output.strip().splitlines()  # after the stage line, one line and the exit status
    assert status == "exit 2" and message.startswith("error: checking graphs for TensorRT needs onnx")
    assert "pip install edgecap[trt]" in message


@pytest.mark.slow
def test_export_trt_checks_the_graphs_before_it_needs_tensorrt(int8_export, tmp_path):
    import onnx

    directory = shutil.copytree(int8_export, tmp_path / "exp")
    code, output = invoke("export", str(directory), "--trt", "--precision", "fp32,int8")
    assert code == 2 and "\n" not in output.strip(), output
    if _tensorrt_missing() is not None:  # sound graphs: the build stops only at the missing TensorRT
        assert "pip install edgecap[trt]" in output and "not buildable" not in output
    model = onnx.load(str(directory / "step.int8.onnx"))
    _break(model, "zero-point-3")
    onnx.save(model, str(directory / "step.int8.onnx"))
    Manifest.read(directory).write(directory)  # broken on purpose, and recorded: the TensorRT check must see it
    code, output = invoke("export", str(directory), "--trt", "--precision", "fp32,int8")
    assert code == 2 and "\n" not in output.strip(), output
    assert f"{directory}: not buildable by TensorRT as typed: step.int8.onnx: QuantizeLinear" in output
    assert "zero point [3]" in output and "--int8-scheme tensorrt" in output
    assert Manifest.read(directory).engines == {}


# ---- the backend's host logic, on simulated CUDA -------------------------------------------------------------------

@pytest.fixture
def simulated_trt(monkeypatch):
    """``tensorrt`` and ``cuda.bindings`` replaced by tests/runtime/simulated_trt.py for this test only."""
    import sys

    from tests.runtime import simulated_trt

    for name, module in simulated_trt.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    return sys.modules["cuda.bindings.runtime"].simulator


@pytest.mark.slow
def test_trt_backend_host_logic_on_simulated_cuda_captions_like_onnx_runtime(simulated_trt, tiny_export, tmp_path):
    """Bindings, state ping-pong, tiling on the device, staging and graph replay, checked against ONNX Runtime:
    the simulated engines run the same fp32 graphs, so every caption and log-prob must match exactly."""
    from edgecap.data import load_dataset
    from edgecap.parity import teacher_forced
    from edgecap.preprocess import Preprocessing, load_images
    from edgecap.runtime.backends.trt import TrtBackend
    from edgecap.runtime.engines import GRAPHS
    from edgecap.runtime.manifest import file_sha256
    from edgecap.runtime.pipeline import Captioner
    from edgecap.runtime.search import SearchOptions
    from tests.runtime.simulated_trt import CAPABILITY, GPU, VERSION, write_plan

    directory = shutil.copytree(tiny_export / "exp", tmp_path / "exp")
    manifest = Manifest.read(directory)
    options, engines = EngineOptions(max_batch=4, beam=3), {}
    for graph, source in zip(GRAPHS, manifest.graph_files(directory, "fp32"), strict=True):
        rows = profile_rows(graph, options)
        record = EngineRecord(graph, "fp32", f"engines/{graph}.plan", source.name, file_sha256(source), GPU,
                              "{}.{}".format(*CAPABILITY), VERSION, rows)
        write_plan(directory / record.file, source, rows.max)
        engines[record.key] = record.to_json()
    manifest = replace(manifest, engines=engines).write(directory)

    images = [r.path for r in load_dataset("shapes").split("test")[:4]]
    ort = Captioner.from_dir(directory)
    for beam in (1, 3):
        search = SearchOptions(beam_size=beam)
        want = [(c.text, c.logprob) for c in ort.caption(images, search)]
        for graphs in (False, True):
            with TrtBackend(directory, manifest, cuda_graphs=graphs) as backend:
                got = [(c.text, c.logprob) for c in Captioner(backend, manifest).caption(images, search)]
            assert [t for t, _ in got] == [t for t, _ in want] and all(t for t, _ in got)
            np.testing.assert_allclose([p for _, p in got], [p for _, p in want], rtol=1e-6)
    assert simulated_trt.launches["captured"] and simulated_trt.launches["replayed"] > 10

    pixels = load_images(images, Preprocessing.from_json(manifest.preprocessing))
    words = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    with TrtBackend(directory, manifest) as backend:
        for ours, theirs in zip(teacher_forced(backend, pixels, words), teacher_forced(ort.backend, pixels, words),
                                strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)
        first = backend.encode(pixels)
        backend.encode(pixels)
        for retired in (lambda: first.step(np.ones(4, np.int64), np.arange(4), 0), lambda: first.tile(3)):
            with pytest.raises(RuntimeError, match="retired"):
                retired()
        with pytest.raises(ModelError, match="--max-batch 5"):
            backend.encode(np.concatenate([pixels, pixels[:1]]))
        session = backend.encode(pixels[:2])
        with pytest.raises(ModelError, match="2 images x beam 7.*--max-batch 2 --beam 7"):
            session.tile(7)


# ---- real engines (a machine with TensorRT and an NVIDIA GPU) -----------------------------------------------------

@pytest.fixture
def tensorrt_machine() -> None:
    missing = _tensorrt_missing()
    if missing is not None:
        pytest.skip(f"needs TensorRT and a GPU: {missing}")


@pytest.mark.slow
@pytest.mark.tensorrt
def test_trt_engines_caption_like_onnx_runtime(tensorrt_machine, tiny_export, tmp_path):
    from edgecap.data import load_dataset
    from edgecap.runtime.backends.trt import TrtBackend
    from edgecap.runtime.pipeline import Captioner
    from edgecap.runtime.search import SearchOptions

    directory = shutil.copytree(tiny_export / "exp", tmp_path / "exp")
    code, output = invoke("export", str(directory), "--trt", "--precision", "fp32,fp16", "--max-batch", "8")
    assert code == 0, output
    manifest = Manifest.read(directory)
    assert len(manifest.engines) == 4 and (directory / "engines" / "timing.cache").is_file()
    code, output = invoke("export", str(directory), "--trt", "--precision", "fp32,fp16", "--max-batch", "8")
    assert code == 0 and output.count("(cached;") == 4, output

    images = [r.path for r in load_dataset("shapes").split("test")[:8]]
    options = SearchOptions(beam_size=3)
    texts = {}
    for precision in ("fp32", "fp16"):
        for backend in ("ort", "trt"):
            captioner = Captioner.from_dir(directory, backend=backend, precision=precision)
            texts[backend, precision] = [c.text for c in captioner.caption(images, options)]
        with TrtBackend(directory, manifest, precision=precision, cuda_graphs=True) as graphs:
            texts["graphs", precision] = [c.text for c in Captioner(graphs, manifest).caption(images, options)]
    assert texts["trt", "fp32"] == texts["ort", "fp32"] == texts["graphs", "fp32"]
    assert texts["graphs", "fp16"] == texts["trt", "fp16"]
    assert sum(a == b for a, b in zip(texts["trt", "fp16"], texts["ort", "fp32"], strict=True)) >= 7

    record = next(r for r in manifest.engines.values() if r["precision"] == "fp32")
    record["tensorrt"] = "9.9.9"
    replace(manifest, engines={**manifest.engines}).write(directory)
    with pytest.raises(ModelError, match=r"TensorRT 9\.9\.9 \(this machine: .*--trt --precision fp32` on this machine"):
        Captioner.from_dir(directory, backend="trt")


# ---- the engine builder, against a recording stand-in for TensorRT ------------------------------------------------

@pytest.mark.slow
def test_export_trt_builds_strongly_typed_engines_with_one_profile_and_they_caption(simulated_trt, tiny_export,
                                                                                   tmp_path):
    """What `_build` asks of TensorRT, call by call, then the plans it wrote captioning like ONNX Runtime."""
    from edgecap.runtime.pipeline import Captioner
    from edgecap.runtime.search import SearchOptions
    from tests.runtime.simulated_trt import BUILDER

    directory = shutil.copytree(tiny_export / "exp", tmp_path / "exp")
    code, output = invoke("export", str(directory), "--trt", "--precision", "fp32", "--max-batch", "4")
    assert code == 0, output
    assert [c for c in BUILDER.calls if c[0] == "parse"] == [("parse", "encoder.onnx"), ("parse", "step.onnx")]
    assert [c[1] for c in BUILDER.calls if c[0] == "create_network"] == [1 << 5, 1 << 5]  # STRONGLY_TYPED
    assert all(c[2:] == (("TF32",), "DETAILED") for c in BUILDER.calls if c[0] == "build")  # no TF32, inspectable
    shapes = {c[1]: c[2:] for c in BUILDER.calls if c[0] == "shape"}
    assert shapes["pixels"][0][0] == 1 and shapes["pixels"][2][0] == 4  # images: 1 .. max-batch
    assert shapes["tokens"] == ((1,), (3,), (12,))  # rows: 1 .. max-batch x beam, tuned for one image's beam
    assert "step" not in shapes  # the scalar position has no profile
    assert [c[1] for c in BUILDER.calls if c[0] == "timing_cache"] == [b"", b"+timings"]  # saved, then reused
    assert (directory / "engines" / "timing.cache").read_bytes() == b"+timings+timings"
    records = Manifest.read(directory).engines.values()
    assert len(records) == 2 and all(len(r["plan_sha256"]) == 64 and r["int8_layers"] is None for r in records)
    images = [SAMPLE_IMAGES / "camera.jpg", SAMPLE_IMAGES / "dog.jpg"]
    texts = {backend: [c.text for c in Captioner.from_dir(directory, backend=backend).caption(images, SearchOptions())]
             for backend in ("ort", "trt")}
    assert texts["trt"] == texts["ort"]
    BUILDER.calls.clear()
    code, output = invoke("export", str(directory), "--trt", "--precision", "fp32", "--max-batch", "4")
    assert code == 0 and output.count("(cached;") == 2 and not BUILDER.calls, output


@pytest.mark.slow
@pytest.mark.parametrize("float_only", [False, True])
def test_an_int8_engine_must_run_its_int8_layers_in_int8(simulated_trt, int8_export, tmp_path, float_only):
    from tests.runtime.simulated_trt import BUILDER

    directory = shutil.copytree(int8_export, tmp_path / "exp")
    BUILDER.float_only = float_only  # a build that silently ran the Q/DQ graph's layers in float
    code, output = invoke("export", str(directory), "--trt", "--precision", "int8")
    quantization = Manifest.read(directory).quantization
    if float_only:
        assert code == 2 and "runs 0 of its" in output and "not an INT8 engine" in output, output
        assert Manifest.read(directory).engines == {}
    else:
        assert code == 0, output
        counts = {r["graph"]: r["int8_layers"] for r in Manifest.read(directory).engines.values()}
        assert counts == {g: quantization.graph(g).int8_layers for g in ("encoder", "step")} and min(counts.values())


@pytest.mark.slow
def test_a_replaced_plan_is_refused_by_its_sha256(simulated_trt, tiny_export, tmp_path):
    from edgecap.runtime.pipeline import Captioner

    directory = shutil.copytree(tiny_export / "exp", tmp_path / "exp")
    code, output = invoke("export", str(directory), "--trt", "--precision", "fp32")
    assert code == 0, output
    [plan] = [r["file"] for r in Manifest.read(directory).engines.values() if r["graph"] == "step"]
    (directory / plan).write_text((directory / plan).read_text().replace('"max_rows": 96', '"max_rows": 95'))
    with pytest.raises(ModelError, match="not the plan this export built"):
        Captioner.from_dir(directory, backend="trt")
