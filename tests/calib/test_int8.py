"""INT8 Q/DQ graphs of a tiny trained export: TensorRT-style quantisation, captions, repeatable ranges, sensitivity."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.without_torch import run_without_torch

CALIBRATION = dict(data="shapes", images=48, heldout=24, method="max")


def _fresh_copy(tiny_export, target):
    shutil.copytree(tiny_export / "exp", target)
    return target


def test_int8_export_without_calibration_data_is_a_one_line_error(tmp_path):
    from tests.helpers import invoke

    code, output = invoke("export", "--out", str(tmp_path / "exp"), "--precision", "fp32,int8")
    assert code == 2 and "--calib-data" in output and not (tmp_path / "exp").exists()


def test_held_out_photos_come_from_another_split_than_the_calibration_photos():
    from edgecap.calib.build import calibration_draw
    from edgecap.calib.options import Int8Options
    from edgecap.data.records import CaptionDataset, ImageRecord
    from edgecap.errors import DataError

    def records(split, n):
        return tuple(ImageRecord(f"{split}{i}", Path(f"/photos/{split}{i}.jpg"), ("a photo",)) for i in range(n))

    def draw(split):
        return calibration_draw(data, Int8Options(data="toy", images=10, heldout=8, heldout_split=split))

    data = CaptionDataset("toy", "toy:here", {"train": records("train", 50), "dev": records("dev", 20)})
    calibration, heldout = draw("dev")
    assert len(calibration) == 10 and {r.image_id[:5] for r in calibration} == {"train"}
    assert len({r.image_id for r in heldout}) == 8 and {r.image_id[:3] for r in heldout} == {"dev"}
    assert draw("dev") == (calibration, heldout)  # seeded: a rebuild draws the same
    calibration, heldout = draw("train")
    assert {r.image_id[:5] for r in calibration + heldout} == {"train"}
    assert not {r.image_id for r in calibration} & {r.image_id for r in heldout}
    with pytest.raises(DataError, match="toy:here: no 'test' split .* --calib-heldout-split"):
        draw("test")


def _initializers(model):
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.slow
@pytest.mark.parametrize("graph", ["encoder", "step"])
def test_int8_graphs_are_symmetric_qdq_with_per_channel_weights(int8_export, graph):
    from edgecap.export.trt_compat import graph_problems
    from edgecap.runtime.manifest import Manifest

    manifest = Manifest.read(int8_export)
    report = manifest.quantization.graph(graph)
    assert manifest.graphs["int8"][graph] == report.file == f"{graph}.int8.onnx"
    assert graph_problems(int8_export / f"{graph}.int8.onnx", "int8") == []  # the checker `export --trt` runs
    assert 0 < report.int8_layers == report.layers and report.qdq_nodes > 2 * report.int8_layers  # every layer INT8


def _top1_agreement(directory, images) -> float:
    """Share of steps at which the int8 graphs pick fp32's next word, teacher-forced along fp32's beam-3 captions.

    Whole-caption identity is too coarse for a tiny, every-layer-INT8 model: one flipped near-tie changes the
    rest of a caption, and which ties flip changes with the model's last bits.
    """
    from edgecap.parity import teacher_forced
    from edgecap.preprocess import load_images
    from edgecap.runtime.pipeline import Captioner
    from edgecap.runtime.search import SearchOptions
    from edgecap.vocab import EOS

    fp32, int8 = (Captioner.from_dir(directory, precision=p) for p in ("fp32", "int8"))
    assert [f.name for f in int8.manifest.graph_files(directory, "int8")] == ["encoder.int8.onnx", "step.int8.onnx"]
    pixels = load_images(images, fp32.prep)
    assert all(h.tokens for h in int8.search(pixels, SearchOptions(beam_size=3)))
    words = [h.tokens + (EOS,) for h in fp32.search(pixels, SearchOptions(beam_size=3))]
    reference, candidate = (teacher_forced(c.backend, pixels, words) for c in (fp32, int8))
    lengths = np.array([len(w) for w in words])
    agree = [(r.argmax(1) == c.argmax(1))[lengths > t]
             for t, (r, c) in enumerate(zip(reference, candidate, strict=True))]
    return float(np.concatenate(agree).mean())


@pytest.mark.slow
def test_int8_export_captions_like_fp32(int8_export):
    from edgecap.data import load_dataset

    images = [r.path for r in load_dataset("shapes").split("test")[:12]]
    # Every layer INT8 (symmetric activations, softmax inputs included) on a 150-step model with small top-1
    # margins: measured 0.85; graphs with a wrong scale or zero point fall far below (a random pick: ~0.01).
    assert _top1_agreement(int8_export, images) >= 0.75


@pytest.mark.slow
def test_ort_cpu_scheme_writes_uint8_activations_that_caption(int8_export, tmp_path):
    import onnx

    from edgecap.calib.feeds import load_encoder_feeds, load_step_feeds
    from edgecap.calib.quantize import write_qdq
    from edgecap.calib.ranges import compute_ranges
    from edgecap.data import load_dataset
    from edgecap.runtime.manifest import Manifest

    directory = shutil.copytree(int8_export, tmp_path / "exp")
    calib = directory / "calib"
    feeds = {"encoder": load_encoder_feeds(calib / "encoder.npz"), "step": load_step_feeds(calib / "step.npz")}
    for graph, ops in (("encoder", None), ("step", ("Gemm", "MatMul"))):
        ranges = compute_ranges(directory / f"{graph}.onnx", feeds[graph], method="max")
        write_qdq(directory / f"{graph}.onnx", directory / f"{graph}.int8.onnx", ranges, op_types=ops,
                  scheme="ort-cpu")
        model = onnx.load(str(directory / f"{graph}.int8.onnx"))
        values = _initializers(model)
        activations = [values[n.input[2]] for n in model.graph.node
                       if n.op_type == "QuantizeLinear" and n.input[0] not in values]
        assert activations and all(zp.dtype == np.uint8 for zp in activations)
    images = [r.path for r in load_dataset("shapes").split("test")[:12]]
    manifest = Manifest.read(directory).write(directory)  # the graphs rewritten in the other scheme, recorded
    assert manifest.graphs["int8"]["encoder"] == "encoder.int8.onnx"
    assert _top1_agreement(directory, images) >= 0.9


@pytest.mark.slow
def test_saved_feeds_reproduce_the_ranges(int8_export):
    from onnxruntime.quantization import load_tensors_data

    from edgecap.calib.build import OP_TYPES
    from edgecap.calib.feeds import load_encoder_feeds, load_step_feeds
    from edgecap.calib.ranges import compute_ranges
    from edgecap.runtime.backends.ort import OrtBackend
    from edgecap.runtime.manifest import Manifest

    calib = int8_export / "calib"
    feeds = {"encoder": load_encoder_feeds(calib / "encoder.npz"), "step": load_step_feeds(calib / "step.npz")}
    assert sum(len(f["pixels"]) for f in feeds["encoder"]) == 48
    assert len({int(f["step"]) for f in feeds["step"]}) > 3  # rows from many positions of real captions
    step_session = OrtBackend(int8_export, Manifest.read(int8_export)).step
    for feed in feeds["step"]:
        assert np.isfinite(step_session.run(["topk_logprobs"], feed)[0]).all()
    for graph in ("encoder", "step"):
        [cached] = calib.glob(f"{graph}.max.*.json")
        saved = load_tensors_data(cached)
        again = compute_ranges(int8_export / f"{graph}.onnx", feeds[graph], method="max",
                               op_types=OP_TYPES[graph])
        assert set(again.data) == set(saved.data)
        for name, data in again.data.items():
            np.testing.assert_array_equal(data.range_value, saved.data[name].range_value, err_msg=name)


@pytest.mark.slow
def test_an_int8_set_that_fails_the_gate_is_not_written_and_the_report_says_why(tiny_export, tmp_path):
    """A bound no INT8 set can clear (ΔCIDEr above +1000): the search keeps layers fp32 up to max_layers, the gate's
    rule fails, and the export keeps its other precisions with the report of what was tried."""
    from edgecap.calib.build import add_int8
    from edgecap.calib.options import Int8Options
    from edgecap.data import load_dataset
    from edgecap.report import int8_summary
    from edgecap.runtime.manifest import Manifest

    directory = _fresh_copy(tiny_export, tmp_path / "exp")
    options = Int8Options(max_delta=-1000.0, max_layers=2, **CALIBRATION)
    manifest = add_int8(directory, Manifest.read(directory), load_dataset("shapes"), options, progress=False)
    q = manifest.quantization
    assert q.verdict == "fail" and q.threshold_met is False and q.layers_tried == 2
    assert q.delta_cider_ci95[0] <= q.delta_cider <= q.delta_cider_ci95[1]
    kept = {graph: q.graph(graph).kept_fp32 for graph in ("encoder", "step")}
    assert sum(map(len, kept.values())) == 2
    assert sum(q.graph(g).layers - q.graph(g).int8_layers for g in kept) == 2  # counted: exactly those run float
    assert "int8" not in manifest.graphs and not list(directory.glob("*.int8.onnx"))
    assert Manifest.read(directory) == manifest
    assert "no int8 graphs were written" in int8_summary(q, directory)[-1]


def test_export_says_when_the_heldout_estimate_cannot_resolve_the_threshold(tmp_path):
    """On Flickr8k, 300 held-out photos put ±1.2 on ΔCIDEr: exports measured +0.1 there and -1.9 in parity."""
    from dataclasses import replace

    from edgecap.report import int8_summary
    from edgecap.runtime.manifest import GraphInt8, Int8Report

    graph = GraphInt8("g.int8.onnx", True, layers=8, int8_layers=8, qdq_nodes=40, ort_cpu_fp32_ms=2.0,
                      ort_cpu_int8_ms=1.0)
    q = Int8Report(scheme="ort-cpu", method="max", calibration_data="flickr8k", calibration_images=200,
                   heldout_split="dev", heldout_image_ids=tuple(map(str, range(300))), step_rows=256, fp32_cider=50.0,
                   int8_cider=50.11, delta_cider=0.11, delta_cider_se=1.18, all_int8_delta_cider=0.11, threshold=1.0,
                   threshold_met=True, layers_tried=0, bias_correction=False,
                   delta_cider_before_bias_correction=None, build_s=60.0, encoder=graph, step=graph)
    noisy = int8_summary(q, tmp_path / "exp")
    assert "step: 8 of 8 layers INT8 (0 kept fp32 by the search), 2.00x as fast as fp32" in noisy[2]
    assert len(noisy) == 4 and "± 2.31" in noisy[3] and f"edgecap parity {tmp_path / 'exp'} " in noisy[3]
    assert len(int8_summary(replace(q, delta_cider_se=0.41), tmp_path / "exp")) == 3
    failed = int8_summary(replace(q, delta_cider=-1.9, threshold_met=False, layers_tried=12), tmp_path / "exp")
    assert len(failed) == 4 and failed[3].startswith("warning:") and "expect `edgecap parity" in failed[3]
    judged = replace(q, verdict="inconclusive", photos_to_decide=1200)
    assert "about 1200 would decide" in int8_summary(judged, tmp_path / "exp")[3]
    assert len(int8_summary(replace(q, verdict="pass"), tmp_path / "exp")) == 3
    slower = int8_summary(replace(q, step=replace(graph, ort_cpu_int8_ms=4.0)), tmp_path / "exp")
    assert "0.50x the speed of fp32 (slower)" in slower[2]


@pytest.mark.slow
def test_int8_step_alone_runs_beside_the_fp16_encoder(tiny_export, tmp_path, monkeypatch):
    from edgecap.export.trt_compat import check_for_tensorrt
    from edgecap.preprocess import SAMPLE_IMAGES, load_images
    from edgecap.runtime.manifest import GraphInt8, Manifest
    from edgecap.runtime.pipeline import Captioner
    from edgecap.runtime.search import SearchOptions
    from tests.helpers import invoke

    directory = tmp_path / "exp"
    monkeypatch.chdir(tmp_path)  # a relative --out, as the README writes it
    code, output = invoke("export", str(tiny_export / "run"), "--out", "exp", "--precision",
                          "fp32,fp16,int8", "--calib-data", "shapes", "--calib-images", "48", "--calib-heldout", "24",
                          "--calib-max-delta", "100", "--int8-graphs", "step")
    assert code == 0, output
    assert "encoder: not quantised (encoder.fp16.onnx)" in output
    manifest = Manifest.read(directory)
    assert manifest.graphs["int8"] == {"encoder": "encoder.fp16.onnx", "step": "step.int8.onnx"}
    assert manifest.quantization.encoder == GraphInt8("encoder.fp16.onnx", quantized=False)
    assert manifest.quantization.step.quantized is True
    assert not (directory / "encoder.int8.onnx").exists()
    assert manifest.stored_precision("int8", "encoder") == "fp16"
    check_for_tensorrt(directory, manifest, ["int8"])  # what `export --trt` checks: the fp16 encoder passes as fp16
    captioner = Captioner.from_dir(directory, precision="int8")
    pixels = load_images(sorted(SAMPLE_IMAGES.glob("*.jpg")), captioner.prep)
    assert all(h.tokens for h in captioner.search(pixels, SearchOptions(beam_size=3)))


def test_int8_graphs_option_rejects_unknown_graphs(tmp_path):
    from tests.helpers import invoke

    code, output = invoke("export", "--out", str(tmp_path / "exp"), "--precision", "fp32,int8", "--calib-data",
                          "shapes", "--int8-graphs", "decoder")
    assert code == 2 and "--int8-graphs 'decoder'" in output and not (tmp_path / "exp").exists()


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_histogram_ranges_skip_masked_tensors_that_are_not_quantised(tmp_path, method):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgecap.calib.ranges import compute_ranges

    # scores -> Where(mask, scores, -inf) -> Softmax -> MatMul: a decoder's masked attention over a static cache
    initializers = [numpy_helper.from_array(np.array(-np.inf, np.float32), "neg_inf"),
                    numpy_helper.from_array(np.ones((4, 3), np.float32), "w")]
    nodes = [helper.make_node("Where", ["mask", "scores", "neg_inf"], ["masked"], name="mask"),
             helper.make_node("Softmax", ["masked"], ["weights"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["weights", "w"], ["out"], name="project")]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, 4]),
                                                helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])], initializers)
    path = tmp_path / "masked.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rng = np.random.default_rng(0)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0]], bool)
    feeds = [{"scores": rng.normal(size=(2, 4)).astype(np.float32), "mask": mask} for _ in range(3)]
    ranges = compute_ranges(path, feeds, method=method, op_types=("MatMul",))
    assert "masked" not in ranges.data and {"weights", "out"} <= set(ranges.data)
    assert all(np.isfinite(np.asarray(data.range_value, np.float64)).all() for data in ranges.data.values())


def test_calib_imports_no_torch():
    run_without_torch("""
        import edgecap.calib.build, edgecap.calib.feeds, edgecap.calib.quantize, edgecap.calib.ranges
        import edgecap.calib.sensitivity
    """)


def _ranking_graph(path):
    """x -> head (MatMul) -> TopK -> indices -> Gather(table) -> float output; x -> proj (MatMul) -> float output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"w_head": rng.normal(size=(8, 16)), "w_proj": rng.normal(size=(8, 4)), "table": rng.normal(size=(16, 4))}
    nodes = [
        helper.make_node("MatMul", ["x", "w_head"], ["scores"], name="head"),
        helper.make_node("TopK", ["scores", "k"], ["top_values", "ids"], name="topk"),
        helper.make_node("Gather", ["table", "ids"], ["chosen"], name="gather"),
        helper.make_node("MatMul", ["x", "w_proj"], ["projected"], name="proj"),
    ]
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    initializers.append(numpy_helper.from_array(np.array([3], dtype=np.int64), "k"))
    graph = helper.make_graph(nodes, "ranking", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3]),
                               helper.make_tensor_value_info("chosen", TensorProto.FLOAT, [2, 3, 4]),
                               helper.make_tensor_value_info("projected", TensorProto.FLOAT, [2, 4])],
                              initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_layers_that_only_rank_a_discrete_choice_stay_fp32(tmp_path):
    from edgecap.calib.quantize import discrete_choice_layers, quantizable_layers

    model = _ranking_graph(tmp_path / "ranking.onnx")
    assert quantizable_layers(model) == ["head", "proj"]
    assert discrete_choice_layers(model) == ["head"]  # its float values reach outputs only through TopK's indices
    assert discrete_choice_layers(model, ["Conv"]) == []


def test_matmuls_of_two_activations_stay_fp32(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgecap.calib.quantize import activation_matmuls

    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"], name="project"),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0], name="transpose"),
             helper.make_node("MatMul", ["q", "xt"], ["scores"], name="scores")]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [2, 2])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "a.onnx"))
    assert activation_matmuls(tmp_path / "a.onnx") == ["scores"]
