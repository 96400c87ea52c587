"""End to end through the CLI: train a tiny model on generated shapes, evaluate it, caption with it, bad input."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgecap.data.shapes import generate_shapes
from tests.helpers import SAMPLES, invoke, run_cli_without
from tests.needs import needs_scoring
from tests.without_torch import run_without


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "tiny"
    code, output = invoke("train", "--model", "sat", "--data", "shapes", "--preset", "tiny", "--out", str(out),
                          "--max-steps", "600", "--scst-epochs", "1", "--set", "select.images=50")
    assert code == 0, output
    return out


@pytest.mark.slow
def test_train_writes_a_complete_run_directory(tiny_run):
    for name in ("config.json", "command.txt", "vocab.json", "metrics.jsonl", "best.pt", "last.pt"):
        assert (tiny_run / name).is_file(), name
    config = json.loads((tiny_run / "config.json").read_text())
    assert config["model_id"] == "sat" and config["train"]["xe"]["max_steps"] == 600
    history = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert [h["phase"] for h in history] == ["xe", "xe", "scst"] and history[1]["step"] == 600


@needs_scoring
@pytest.mark.slow
def test_tiny_model_beats_the_best_constant_caption(tiny_run, tmp_path):
    """600 cross-entropy steps and one self-critical epoch, the suite's budget, score well above twice the best
    constant caption's CIDEr-D: the model reads the photos."""
    from edgecap.cider import best_constant_cider
    from edgecap.data import load_dataset
    from edgecap.training.data import tokenised_references

    code, output = invoke("eval", str(tiny_run), "--data", "shapes", "--split", "test", "--beam", "3",
                          "--json", str(tmp_path / "eval.json"))
    assert code == 0, output
    model_cider = json.loads((tmp_path / "eval.json").read_text())["metrics"]["CIDEr"]
    train = load_dataset("shapes").split("train")[:100]
    constants = sorted({tuple(c) for refs in tokenised_references(train).values() for c in refs})
    best_constant = best_constant_cider(tokenised_references(load_dataset("shapes").split("test")), constants)
    assert model_cider >= 2 * best_constant, (model_cider, best_constant)


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_epoch(tmp_path):
    import subprocess
    import sys
    import time

    json_path = generate_shapes(tmp_path / "shapes", n_train=400, n_dev=20, n_test=0)  # a fifth of shapes' epoch
    out = tmp_path / "killed"
    args = ["train", "--data", f"karpathy:{json_path}", "--preset", "tiny", "--out", str(out),
            "--set", "xe.epochs=2", "--set", "xe.batch_size=128", "--set", "select.images=20",
            "--set", "select.patience=5"]
    process = subprocess.Popen([sys.executable, "-m", "edgecap", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (out / "last.pt").exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.2)
    process.kill()
    process.wait()
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in history] == [1]
    code, output = invoke("train", "--out", str(out), "--resume")
    assert code == 0, output
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(h["phase"], h["epoch"]) for h in history] == [("xe", 1), ("xe", 2)]
    assert history[1]["step"] == 2 * history[0]["step"]


@pytest.mark.slow
def test_resuming_from_weights_without_training_state_is_one_line(tiny_run, tmp_path):
    import shutil

    run = shutil.copytree(tiny_run, tmp_path / "run")
    shutil.copy(run / "best.pt", run / "last.pt")
    before = (run / "last.pt").read_bytes()
    code, output = invoke("train", "--out", str(run), "--resume")
    assert code == 2 and "training state" in output and "last.pt" in output and len(output.strip().splitlines()) == 1
    assert (run / "last.pt").read_bytes() == before


@pytest.mark.slow
def test_a_finished_run_continues_when_config_json_allows_more_epochs(tiny_run, tmp_path):
    import shutil

    run = shutil.copytree(tiny_run, tmp_path / "run")

    def history() -> list[tuple[str, int]]:
        return [(h["phase"], h["epoch"]) for h in map(json.loads, (run / "metrics.jsonl").open())]

    code, output = invoke("train", "--out", str(run), "--resume")
    assert code == 0, output
    assert history() == [("xe", 1), ("xe", 2), ("scst", 1)]  # nothing left to do: nothing done
    assert "already finished" in output and "--scst-epochs N" in output
    config = json.loads((run / "config.json").read_text())
    config["train"]["scst"]["epochs"] = 2
    (run / "config.json").write_text(json.dumps(config))
    code, output = invoke("train", "--out", str(run), "--resume")
    assert code == 0, output
    assert history() == [("xe", 1), ("xe", 2), ("scst", 1), ("scst", 2)]


@pytest.mark.slow
def test_a_self_critical_phase_added_to_a_finished_run_starts_on_resume(tmp_path):
    run = tmp_path / "xe-only"
    code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(run), "--max-steps", "20",
                          "--scst-epochs", "0", "--set", "select.images=10")
    assert code == 0, output
    code, output = invoke("train", "--out", str(run), "--resume", "--scst-epochs", "1",
                          "--set", "scst.mirror_share=0.5")
    assert code == 0, output
    phases = [json.loads(line)["phase"] for line in (run / "metrics.jsonl").open()]
    assert phases == ["xe", "scst"]
    resumed = json.loads((run / "config.json").read_text())["train"]["scst"]
    assert (resumed["epochs"], resumed["mirror_share"]) == (1, 0.5)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [("--set", "model.hidden_dim=8"), ("--set", "optim.lr=1e-2"),
                                   ("--set", "xe.mirror_share=0.5")])
def test_resuming_refuses_a_change_that_needs_a_new_run(tiny_run, tmp_path, flags):
    import shutil

    run = shutil.copytree(tiny_run, tmp_path / "run")
    before = {name: (run / name).read_bytes() for name in ("config.json", "last.pt", "metrics.jsonl")}
    code, output = invoke("train", "--out", str(run), "--resume", "--scst-epochs", "2", *flags)
    assert code == 2 and "--resume cannot change" in output and "--out" in output, output
    assert len(output.strip().splitlines()) == 1
    assert {name: (run / name).read_bytes() for name in before} == before


@pytest.mark.slow
def test_resuming_with_the_run_s_own_flags_repeated_is_allowed(tiny_run, tmp_path):
    """Appending --resume to the command that started a run works: flags equal to config.json change nothing."""
    import shutil

    run = shutil.copytree(tiny_run, tmp_path / "run")
    code, output = invoke("train", "--out", str(run), "--resume", "--max-steps", "600", "--scst-epochs", "1",
                          "--set", "select.images=50")
    assert code == 0 and "already finished" in output, output


@pytest.mark.slow
def test_a_second_train_into_the_same_run_is_refused(tiny_run):
    code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(tiny_run))
    assert code == 2 and "--resume" in output


@needs_scoring
@pytest.mark.slow
def test_eval_records_the_decoding_it_ran(tiny_run, tmp_path):
    code, output = invoke("eval", str(tiny_run), "--data", "shapes", "--split", "test", "--max-images", "20",
                          "--length-penalty", "0.7", "--block-trigrams", "--json", str(tmp_path / "eval.json"))
    assert code == 0, output
    report = json.loads((tmp_path / "eval.json").read_text())
    assert (report["beam"], report["length_penalty"], report["block_trigrams"]) == (3, 0.7, True)
    assert set(report["per_image_cider"]) == set(report["captions"])  # what compare_evals.py pairs two models on
    for caption in report["captions"].values():
        words = caption.split()
        trigrams = list(zip(words, words[1:], words[2:], strict=False))
        assert len(trigrams) == len(set(trigrams)), caption


@pytest.mark.slow
def test_caption_json_and_attention_maps_named_after_the_photos(tiny_run, tmp_path):
    photos = [tmp_path / "scene.jpg", tmp_path / "other" / "scene.jpg"]  # one stem twice
    photos[1].parent.mkdir()
    for photo in photos:
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (96, 96, 3), np.uint8)).save(photo)
    code, output = invoke("caption", *map(str, photos), "--model", str(tiny_run / "best.pt"), "--json",
                          "--attention", str(tmp_path / "maps"))
    assert code == 0, output
    lines = [json.loads(line) for line in output.strip().splitlines()]
    assert [line["attention"] for line in lines] == [str(tmp_path / "maps" / n) for n in ("scene.png", "scene-2.png")]
    assert lines[0]["caption"] == lines[1]["caption"] and lines[0]["caption"]
    rows = -(-(len(lines[0]["caption"].split()) + 2) // 5)  # the photo, each word and <end>, five to a row
    assert Image.open(lines[0]["attention"]).size == (5 * 216, round(90 * (2.6 * rows + 0.5)))


def test_attention_maps_show_where_each_word_looked(tmp_path):
    from edgecap.report import attention_png
    from edgecap.runtime.pipeline import Caption
    from edgecap.runtime.search import Hypothesis

    photo = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), np.uint8))

    def render(cells, name):
        attention = np.zeros((4, 4), np.float32)  # three words and <end>, over a 2 x 2 grid
        attention[np.arange(4), cells] = 1.0
        caption = Caption(Path("p.jpg"), "a red dog", Hypothesis((4, 5, 6), -1.0, -1.0, attention))
        return np.asarray(Image.open(attention_png(caption, photo, tmp_path / name)), np.float32)

    first, same, moved = render([0, 1, 2, 3], "a.png"), render([0, 1, 2, 3], "b.png"), render([3, 3, 3, 0], "c.png")
    assert np.array_equal(first, same)
    assert np.abs(first - moved).mean() > 1.0  # other cells lit: other pixels dimmed


def test_shipped_default_captions_the_sample_photos():
    photos = sorted(SAMPLES.glob("*.jpg"))
    code, output = invoke("caption", *map(str, photos))
    assert code == 0, output
    captions = dict(line.split(": ", 1) for line in output.strip().splitlines())
    assert len(captions) == len(photos) and all(len(c.split()) >= 3 for c in captions.values())
    # The samples inside Flickr8k's world of people, dogs and outdoor scenes get their subject named.
    for photo, subject in (("camera", {"man", "person", "camera"}), ("skateboarder", {"skateboarder", "skateboard"}),
                           ("beach", {"beach", "horses"}), ("dog", {"dog"})):
        assert subject & set(captions[str(SAMPLES / f"{photo}.jpg")].split()), (photo, captions)


def test_captioning_needs_no_scoring_package():
    """Only eval and parity score (pycocoevalcap, the metrics extra); a PyTorch install without it captions."""
    photo = str(SAMPLES / "coffee.jpg")
    output = run_without("pycocoevalcap", f"""
        from edgecap.cli import main
        sys.argv = ["edgecap", "caption", {photo!r}, "--beam", "1", "--backend", "torch"]
        try:
            main()
        except SystemExit as done:
            assert not done.code, done.code
    """)
    assert output.startswith(f"{photo}: ") and len(output.split()) >= 4


def test_a_command_that_needs_torch_names_the_extra_where_torch_is_missing():
    """A runtime-only install has no torch: the shipped checkpoint cannot run, and the error says what can; with no
    model named it captions through the shipped export."""
    output = run_cli_without("torch", ["caption", str(SAMPLES / "camera.jpg")])
    assert output.startswith(f"{SAMPLES / 'camera.jpg'}: ") and output.strip().endswith("exit 0"), output
    output = run_cli_without("torch", ["caption", str(SAMPLES / "camera.jpg"), "--backend", "torch"])
    message, status = output.strip().splitlines()
    assert status == "exit 2" and message.startswith("error: this command needs torch")
    assert "pip install 'edgecap[train]'" in message and "--model DIR" in message


def test_attention_maps_without_matplotlib_fail_before_any_captioning(tmp_path):
    output = run_cli_without("matplotlib", ["caption", str(SAMPLES / "camera.jpg"), "--attention",
                                            str(tmp_path / "a.png")])
    message, status = output.strip().splitlines()
    assert status == "exit 2" and message == ("error: this command needs matplotlib, which is not installed: "
                                              "pip install 'edgecap[plots]'")


def test_search_options_give_alternatives_samples_and_one_line_errors():
    photo = str(SAMPLES / "dog.jpg")
    code, output = invoke("caption", photo, "--json", "--search", "n_best=3")
    best = json.loads(output)
    assert code == 0 and len(best["alternatives"]) == 2 and best["caption"] not in best["alternatives"]
    code, output = invoke("caption", photo, "--json", "--search", "sample=true", "--search", "top_p=0.9")
    assert code == 0 and json.loads(output)["caption"]  # repeatability is tested on synthetic tables
    code, output = invoke("caption", photo, "--search", "learned_endings=true", "--search", "ban_words=dog")
    assert code == 0 and " dog" not in output.split(": ", 1)[1], output
    for item, named in (("speed=3", "expected FIELD=VALUE"), ("ban_words=zebraz", "zebraz not in the model's"),
                        ("n_best=5", "n_best (5) exceeds beam_size (3)")):
        code, output = invoke("caption", photo, "--search", item)
        assert code == 2 and output.startswith("error: ") and named in output and "\n" not in output.strip(), output


def test_caption_refuses_a_precision_its_model_lacks():
    code, output = invoke("caption", str(SAMPLES / "camera.jpg"), "--backend", "torch", "--precision", "fp16")
    assert code == 2 and "--precision fp16 picks an export's graphs" in output, output
    code, output = invoke("caption", str(SAMPLES / "camera.jpg"), "--precision", "fp16")  # the shipped export
    assert code == 2 and "no fp16 graphs (exported: fp32, int8)" in output, output


@pytest.mark.parametrize(("args", "named"), [(["eval", "--data", "flickr8k:/nowhere"], "/nowhere"),
                                             (["parity", "exp", "--data", "shapes", "--backend", "trt"], "TensorRT")])
def test_a_wrong_argument_is_named_before_the_missing_scoring_package(args, named):
    """Scoring commands check what the user typed first: fixing the install would only lead to that error."""
    output = run_cli_without("pycocoevalcap", args)
    assert named in output and "pycocoevalcap" not in output and output.strip().endswith("exit 2"), output


@pytest.mark.parametrize("make", ["missing", "empty", "text", "directory"])
def test_bad_images_are_one_line_errors(tmp_path, make):
    path = tmp_path / "photo.jpg"
    if make == "empty":
        path.write_bytes(b"")
    elif make == "text":
        path.write_text("not an image")
    elif make == "directory":
        path.mkdir()
    code, output = invoke("caption", str(path))
    assert code == 2
    assert output.startswith("error: ") and "photo.jpg" in output and "\n" not in output.strip()


def test_a_folder_is_captioned_and_one_bad_photo_costs_only_its_own_caption(tmp_path):
    import shutil
    import subprocess
    import sys

    folder = tmp_path / "trip"
    folder.mkdir()
    for name in ("b.jpg", "c.JPG"):
        shutil.copy(SAMPLES / "coffee.jpg", folder / name)
    (folder / "a.jpg").write_text("not an image")
    (folder / "notes.txt").write_text("not a photo either, and not taken for one")
    result = subprocess.run([sys.executable, "-m", "edgecap", "caption", str(folder), "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    captions = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [c["image"] for c in captions] == [str(folder / "b.jpg"), str(folder / "c.JPG")]
    assert captions[0]["caption"] == captions[1]["caption"] and captions[0]["caption"]
    [error] = result.stderr.strip().splitlines()
    assert error.startswith(f"error: {folder / 'a.jpg'}: not an image")


def test_a_folder_without_photos_is_a_one_line_error(tmp_path):
    (tmp_path / "notes.txt").write_text("no photos here")
    code, output = invoke("caption", str(tmp_path))
    assert code == 2 and output == f"error: {tmp_path}: folder with no image files (.jpg .jpeg .png .bmp .gif .tif " \
                                   ".tiff .webp); pass image files or a folder that holds some"


@pytest.mark.parametrize("mode", ["L", "CMYK", "I;16", "RGBA", "P"])
def test_unusual_image_modes_are_captioned(tmp_path, mode):
    path = tmp_path / f"photo-{mode.replace(';', '')}.png"
    rgb = Image.open(SAMPLES / "coffee.jpg")
    if mode == "I;16":
        image = Image.fromarray((np.asarray(rgb.convert("L"), dtype=np.uint16) * 200).astype(np.uint16))
    else:
        image = rgb.convert(mode)
    if mode == "CMYK":
        path = path.with_suffix(".jpg")
    image.save(path)
    code, output = invoke("caption", str(path))
    assert code == 0, output


def test_bad_model_path_is_a_one_line_error(tmp_path):
    code, output = invoke("caption", str(SAMPLES / "coffee.jpg"), "--model", str(tmp_path))
    assert code == 2 and str(tmp_path) in output


def test_bad_data_spec_is_a_one_line_error():
    code, output = invoke("eval", "--data", "flickr8k:/nowhere")
    assert code == 2 and "/nowhere" in output


def test_console_errors_have_no_traceback(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "edgecap", "caption", str(tmp_path / "missing.jpg")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: ") and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_hard_attention_and_self_critical_phases_run(tmp_path):
    out = tmp_path / "hard"
    code, output = invoke("train", "--data", "shapes", "--preset", "tiny", "--out", str(out), "--max-steps", "20",
                          "--scst-epochs", "1", "--set", "model.attention=hard", "--set", "select.images=10",
                          "--set", "scst.batch_images=200")
    assert code == 0, output
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [h["phase"] for h in history] == ["xe", "scst"]
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["attention"] == "hard"
