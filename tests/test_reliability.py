"""What a careless or hostile user does to exports and runs: paths that point outside, graphs and manifests tampered
with, writers racing or killed midway. Each case is one line on stderr, exit 2, and nothing good lost."""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgecap.errors import ImageError, ModelError
from edgecap.runtime.manifest import MANIFEST_NAME, Manifest, contained
from tests.helpers import SAMPLES, invoke
from tests.needs import needs_scoring

PHOTO = str(SAMPLES / "camera.jpg")


def _copy(tiny_export, tmp_path) -> Path:
    return shutil.copytree(tiny_export / "exp", tmp_path / "exp")


def _edit_manifest(directory: Path, change) -> None:
    data = json.loads((directory / MANIFEST_NAME).read_text())
    change(data)
    (directory / MANIFEST_NAME).write_text(json.dumps(data))


def _caption(directory: Path) -> tuple[int, str]:
    return invoke("caption", PHOTO, "--model", str(directory))


def _one_line(code: int, output: str, *named: str) -> None:
    assert code == 2 and len(output.strip().splitlines()) == 1 and "Traceback" not in output, output
    assert all(word in output for word in named), output


def test_a_path_that_resolves_outside_its_directory_is_refused(tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "outside.onnx").write_text("x")
    (tmp_path / "exp" / "link.onnx").symlink_to(tmp_path / "outside.onnx")
    (tmp_path / "exp" / "inside.onnx").write_text("x")
    assert contained(tmp_path / "exp", "inside.onnx", "graph") == tmp_path / "exp" / "inside.onnx"
    for name in ("../outside.onnx", str(tmp_path / "outside.onnx"), "link.onnx", ".", "engines/../../outside.onnx"):
        with pytest.raises(ModelError, match="lies outside the export directory"):
            contained(tmp_path / "exp", name, "graph")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_graph_paths_outside_the_export_are_refused(tiny_export, tmp_path, where):
    directory = _copy(tiny_export, tmp_path)
    other = shutil.copytree(directory, tmp_path / "other")
    name = {"parent": "../other/encoder.onnx", "absolute": str(other / "encoder.onnx"), "symlink": "linked.onnx"}[where]
    if where == "symlink":
        (directory / "linked.onnx").symlink_to(other / "encoder.onnx")
    _edit_manifest(directory, lambda data: data["graphs"]["fp32"].update(encoder=name))
    _one_line(*_caption(directory), "lies outside the export directory", "re-run `edgecap export`")


def test_an_engine_record_outside_the_export_is_refused(tmp_path):
    from edgecap.runtime.engines import DeviceInfo, EngineRecord, Profile, find_engine

    device = DeviceInfo("GPU", "8.7", "10.3.0")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    record = EngineRecord("step", "fp16", "../victim.txt", "step.fp16.onnx", "0" * 64, device.gpu,
                          device.compute_capability, device.tensorrt, Profile(1, 3, 96))
    (tmp_path / "exp").mkdir()
    with pytest.raises(ModelError, match="engine '../victim.txt' lies outside"):
        find_engine({record.key: record.to_json()}, directory=tmp_path / "exp", graph="step", precision="fp16",
                    device=device, source_sha256="0" * 64)
    assert victim.read_text() == "keep me"


@pytest.mark.slow
def test_a_graph_from_another_export_is_refused_by_its_sha256(tiny_export, tmp_path):
    directory = _copy(tiny_export, tmp_path)
    shutil.copy(directory / "step.fp16.onnx", directory / "step.onnx")  # the same shapes, other weights
    _one_line(*_caption(directory), "step.onnx: not the graph this export wrote")


@pytest.mark.slow
@pytest.mark.parametrize(("change", "named"), [
    (lambda d: d["vocab"]["words"].pop(), "the vocabulary has"),
    (lambda d: d.update(topk=12), "topk is 12"),
    (lambda d: d["preprocessing"].update(image_size=64), "preprocessing resizes to 64"),
    (lambda d: d["preprocessing"].pop("mean"), "its preprocessing cannot be read"),
    (lambda d: d["vocab"]["words"].__setitem__(5, d["vocab"]["words"][6]), "repeats a word"),
    (lambda d: d["state_pairs"].popitem(), "is not updated"),
    (lambda d: d["files"].pop("step.onnx"), "without a recorded sha256"),
    (lambda d: d["graphs"]["fp32"].pop("step"), "a graph of each kind"),
])
def test_a_manifest_that_contradicts_itself_is_one_line(tiny_export, tmp_path, change, named):
    directory = _copy(tiny_export, tmp_path)
    _edit_manifest(directory, change)
    _one_line(*_caption(directory), "the manifest does not hold together", named)


@pytest.mark.slow
def test_every_mistyped_or_missing_manifest_field_is_named_in_one_line(tiny_export, tmp_path):
    directory = _copy(tiny_export, tmp_path)
    _edit_manifest(directory, lambda d: [d.update(topk="6", graphs=[]), d.pop("opset")])
    _one_line(*_caption(directory), "wrong type or missing (topk is str, opset missing, graphs is list)")


@pytest.mark.slow
def test_a_graph_that_disagrees_with_its_manifest_is_refused_before_searching(tiny_export, tmp_path):
    """Manifest and graph both say k = 6 ... until the manifest's declared outputs are edited to match topk 12."""
    directory = _copy(tiny_export, tmp_path)

    def wider(data):
        data["topk"] = 12
        for tensor in data["step_outputs"]:
            if tensor["name"].startswith("topk_"):
                tensor["shape"] = ["N", 12]

    _edit_manifest(directory, wider)
    _one_line(*_caption(directory), "topk_", "the manifest says ('N', 12)")


@needs_scoring
@pytest.mark.slow
@pytest.mark.parametrize("damage", ["vocabulary", "preprocessing"])
def test_parity_decodes_with_what_ships_and_fails_when_it_is_damaged(tiny_export, tmp_path, damage):
    directory = _copy(tiny_export, tmp_path)

    def change(data):
        if damage == "vocabulary":  # two words trade places: the same size, the wrong words
            words = data["vocab"]["words"]
            words[4], words[5] = words[5], words[4]
        else:
            data["preprocessing"]["mean"] = [0.0, 0.0, 0.0]

    _edit_manifest(directory, change)
    code, output = invoke("parity", str(directory), "--data", "shapes", "--split", "test", "--max-images", "20")
    assert code == 1 and "FAIL" in output, output


@pytest.mark.slow
def test_a_kill_at_any_stage_of_a_re_export_leaves_the_previous_export(tiny_export, tmp_path):
    directory = _copy(tiny_export, tmp_path)
    before = _caption(directory)
    partial = tmp_path / ".exp.partial"
    for stage in ("encoder.onnx", "step.onnx", "encoder.fp16.onnx", "step.fp16.onnx"):
        process = subprocess.Popen([sys.executable, "-m", "edgecap", "export", str(tiny_export / "run"), "--out",
                                    str(directory), "--precision", "fp32,fp16"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while not (partial / stage).exists() and process.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert _caption(directory) == before, stage  # the old export, whole, still captions as before
        assert Manifest.read(directory).files.keys() >= {"encoder.onnx", "step.onnx"}
    code, output = invoke("export", str(tiny_export / "run"), "--out", str(directory), "--precision", "fp32")
    assert code == 0 and not partial.exists(), output  # the next export cleans up what the killed ones left
    assert _caption(directory) == before and "fp16" not in Manifest.read(directory).graphs


def _hold_lock_in_a_child(directory: Path, what: str):
    """A child process that holds ``directory``'s writer lock until it is killed."""
    code = (f"from pathlib import Path\nfrom edgecap.locks import writing\nimport time\n"
            f"with writing(Path({str(directory)!r}), {what!r}):\n    print('held', flush=True)\n    time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_second_export_or_training_into_a_busy_directory_is_refused_naming_the_first(tmp_path):
    child = _hold_lock_in_a_child(tmp_path / "out", "edgecap export")
    try:
        code, output = invoke("export", "--out", str(tmp_path / "out"), "--precision", "fp32")
        _one_line(code, output, f"{tmp_path / 'out'}: edgecap export (pid {child.pid}) is writing it")
        code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(tmp_path / "out"))
        _one_line(code, output, f"(pid {child.pid}) is writing it")
    finally:
        child.kill()
        child.wait()
    from edgecap.locks import writing

    with writing(tmp_path / "out", "edgecap export"):  # a killed holder leaves nothing that blocks the next one
        pass


def test_export_never_replaces_a_folder_that_is_not_an_export(tmp_path):
    keep = tmp_path / "photos"
    keep.mkdir()
    (keep / "mine.jpg").write_bytes(b"not to lose")
    code, output = invoke("export", "--out", str(keep), "--precision", "fp32")
    _one_line(code, output, "exists and is not an export directory")
    assert (keep / "mine.jpg").read_bytes() == b"not to lose"


@pytest.mark.parametrize("flags", [["--data", "flickr8k:/nowhere"], ["--set", "encoder.weights=/nowhere.pt"],
                                   ["--set", "train.init=/nowhere.pt"]])
def test_a_training_that_cannot_start_writes_nothing(tmp_path, flags):
    run = tmp_path / "run"
    code, output = invoke("train", "--preset", "tiny", "--out", str(run), *(["--data", "shapes"] if
                                                                               "--data" not in flags else []), *flags)
    _one_line(code, output, "/nowhere")
    assert not run.exists()


@pytest.mark.slow
def test_a_resumed_run_clears_the_temporary_files_of_a_killed_checkpoint_write(tiny_export, tmp_path):
    run = shutil.copytree(tiny_export / "run", tmp_path / "run")
    (run / ".last.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    config = (run / "config.json").read_text()
    code, output = invoke("train", "--out", str(run), "--resume", "--set", "optim.lr=1")  # refused: a new run's
    _one_line(code, output, "--resume cannot change optim.lr")
    assert (run / "config.json").read_text() == config  # refused before anything was rewritten
    code, output = invoke("train", "--out", str(run), "--resume")
    assert code == 0 and not list(run.glob(".*.tmp")), output


@pytest.mark.parametrize(("item", "named"), [("optim.lr=-1", "optim.lr"), ("optim.lr=inf", "optim.lr"),
                                             ("xe.batch_size=0", "xe.batch_size"), ("scst.samples=0", "scst.samples"),
                                             ("hard.baseline_decay=1", "hard.baseline_decay"),
                                             ("select.patience=0", "select.patience"),
                                             ("encoder.image_size=0", "encoder.image_size")])
def test_out_of_range_settings_are_refused_before_any_work(tmp_path, item, named):
    code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(tmp_path / "run"),
                          "--set", item)
    _one_line(code, output, named)
    assert not (tmp_path / "run").exists()


def test_negative_photo_counts_are_usage_errors():
    for command in (["eval", "--data", "shapes"], ["parity", "exp", "--data", "shapes"]):
        code, output = invoke(*command, "--max-images", "-1")
        assert code == 2 and "Traceback" not in output and "--max-images" in output


@pytest.mark.slow
def test_caption_frames_takes_a_sequence_of_frames_only(tiny_export):
    from edgecap.runtime import Captioner, SearchOptions

    captioner = Captioner.from_dir(tiny_export / "exp")
    frame = np.full((48, 48, 3), 128, np.uint8)
    with pytest.raises(ImageError, match="takes a sequence of frames, got one ndarray of shape"):
        captioner.caption_frames(frame, SearchOptions())
    assert len(captioner.caption_frames(np.stack([frame, frame]), SearchOptions())) == 2


@pytest.mark.slow
@pytest.mark.parametrize(("change", "named"), [
    (lambda d: d.update(format_version="2"), "format_version is '2', not a version number"),
    (lambda d: d["graphs"].update(fp32="encoder.onnx"), "graphs holds values of the wrong type"),
    (lambda d: d["vocab"].update(words="a b c"), "vocab holds values of the wrong type"),
    (lambda d: d["step_inputs"].append("state.x"), "step_inputs holds a tensor that is not"),
    (lambda d: d.pop("model_config"), "model_config missing"),
])
def test_nested_manifest_damage_is_one_line(tiny_export, tmp_path, change, named):
    directory = _copy(tiny_export, tmp_path)
    _edit_manifest(directory, change)
    _one_line(*_caption(directory), named)


@pytest.mark.slow
def test_an_unknown_onnx_runtime_device_is_one_error(tiny_export):
    from edgecap.runtime import Captioner

    with pytest.raises(ModelError, match="device 'gpu': ONNX Runtime runs on cpu, cuda, tensorrt"):
        Captioner.from_dir(tiny_export / "exp", device="gpu")


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["model_config", "weight"])
def test_a_damaged_checkpoint_is_one_line(tiny_export, tmp_path, damage):
    import torch

    payload = torch.load(tiny_export / "run" / "best.pt", weights_only=True)
    if damage == "model_config":
        del payload["model_config"]
    else:
        name = next(iter(payload["decoder"]))
        payload["decoder"][name] = torch.zeros(3, 3)
    torch.save(payload, tmp_path / "damaged.pt")
    _one_line(*invoke("caption", PHOTO, "--model", str(tmp_path / "damaged.pt")), "damaged.pt: a damaged checkpoint")


def test_a_run_stopped_before_its_first_checkpoint_says_so(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    _one_line(*invoke("export", str(tmp_path / "run"), "--out", str(tmp_path / "exp")), "has no best.pt yet",
              "--resume")


@pytest.mark.parametrize("command", ["train", "export"])
def test_an_output_that_is_a_file_is_one_line(tmp_path, command):
    target = tmp_path / "taken"
    target.write_text("mine")
    args = ["train", "--data", "shapes", "--preset", "tiny"] if command == "train" else ["export"]
    _one_line(*invoke(*args, "--out", str(target)), str(target))
    assert target.read_text() == "mine"


def test_a_shapes_spec_naming_a_file_is_one_line(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    _one_line(*invoke("eval", "--data", f"shapes:{tmp_path / 'file.txt'}"), "shapes:DIR names the folder")


def test_an_impossible_model_option_is_one_line(tmp_path):
    _one_line(*invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(tmp_path / "run"), "--set",
                      "model.dropout=2"), "model 'sat' cannot be built", "--set model.*")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_resuming_a_finished_run_without_its_metrics_is_one_line(tiny_export, tmp_path):
    run = shutil.copytree(tiny_export / "run", tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    _one_line(*invoke("train", "--out", str(run), "--resume", "--set", "xe.epochs=30"), "metrics.jsonl: missing")
