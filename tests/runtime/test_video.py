"""`edgecap caption VIDEO --every S` on a 30-second video made from the sample photos in the test: captions at the
requested times, the change threshold skipping frames that repeat the last one, SubRip and JSON Lines outputs, and
damaged or missing videos refused in one line. Runs without torch (scripts/test_runtime_only.sh)."""

import json
import subprocess
import sys

import pytest

av = pytest.importorskip("av", reason="video input needs PyAV (pip install 'edgecap[video]')")

from PIL import Image  # noqa: E402

from edgecap.preprocess import SAMPLE_IMAGES  # noqa: E402

PHOTOS = sorted(SAMPLE_IMAGES.glob("*.jpg"))
FPS, SECONDS, HOLD = 10, 30, 5  # each photo is held HOLD seconds, so the picture changes at 0, 5, 10, ...


def _video(path, seconds=SECONDS):
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        for i in range(seconds * FPS):
            photo = Image.open(PHOTOS[i // (HOLD * FPS) % len(PHOTOS)]).convert("RGB").resize((320, 240))
            for packet in stream.encode(av.VideoFrame.from_image(photo)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return _video(tmp_path_factory.mktemp("video") / "clip.mp4")


def _caption(*args):
    return subprocess.run([sys.executable, "-m", "edgecap", "caption", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def _seconds(clock: str) -> float:
    hours, minutes, seconds = clock.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def test_captions_come_at_the_requested_times(video, tmp_path):
    result = _caption(video, "--every", 3, "--srt", tmp_path / "out.srt", "--jsonl", tmp_path / "out.jsonl")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    times = [_seconds(line.split()[0]) for line in lines]
    assert times == pytest.approx([3.0 * k for k in range(10)], abs=1 / FPS)
    assert all(len(line.split()) > 2 for line in lines)
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["caption"] for r in records] == [line.split(None, 1)[1].strip() for line in lines]
    cues = (tmp_path / "out.srt").read_text().strip().split("\n\n")
    assert len(cues) == 10 and cues[1].splitlines()[1] == "00:00:03,000 --> 00:00:06,000"
    assert "real-time factor" in result.stderr


def test_the_change_threshold_captions_only_when_the_picture_changes(video):
    result = _caption(video, "--every", 1, "--change-threshold", 0.05)
    assert result.returncode == 0, result.stderr
    times = [_seconds(line.split()[0]) for line in result.stdout.splitlines()]
    assert times == pytest.approx([float(t) for t in range(0, SECONDS, HOLD)], abs=1 / FPS)


def test_a_recording_cut_short_is_captioned_up_to_the_cut(tmp_path):
    whole = _video(tmp_path / "whole.ts")  # MPEG-TS plays from any point, as a broken recording or stream does
    cut = tmp_path / "cut.ts"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    result = _caption(cut, "--every", 5)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    times = [_seconds(line.split()[0]) for line in result.stdout.splitlines()]
    assert times[0] == 0 and 2 <= len(times) < SECONDS // 5


@pytest.mark.parametrize("name, content, reason", [("missing.mp4", None, "no such file"),
                                                   ("notes.mp4", b"not a video at all", "not a video")])
def test_a_bad_video_is_one_line(tmp_path, name, content, reason):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    result = _caption(path, "--every", 1)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: {path}: {reason}") and result.stderr.count("\n") == 1, result.stderr


def test_a_video_is_captioned_on_its_own(video):
    result = _caption(video, PHOTOS[0])
    assert result.returncode == 2 and "on its own" in result.stderr and result.stderr.count("\n") == 1
