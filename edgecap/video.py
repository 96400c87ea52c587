"""Frames of a video file, a network stream or a camera, one every N seconds, through PyAV (FFmpeg's libraries).

Every frame is decoded (a P-frame needs the ones before it) but only the first frame at or after each sampling
time is handed on, and with a change threshold only one that differs enough from the last one handed on: a
parked camera then costs one caption, not one per interval. Torch-free: the runtime-only install runs it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from edgecap.errors import ImageError

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mkv", ".webm", ".mov", ".avi", ".mpg", ".mpeg", ".ts", ".flv", ".wmv")
STREAM_PREFIXES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "udp://", "tcp://", "srt://", "/dev/video")


def is_video(source: str) -> bool:
    """A video file by its suffix, a stream URL, or a V4L2 camera device."""
    return source.lower().endswith(VIDEO_SUFFIXES) or source.startswith(STREAM_PREFIXES)


def change(previous: Image.Image, current: Image.Image) -> float:
    """How different two frames look, 0 (same) to 1: mean absolute difference of 32 x 32 grayscale thumbnails."""
    a, b = (np.asarray(f.convert("L").resize((32, 32), Image.Resampling.BOX), np.float32) for f in (previous, current))
    return float(np.abs(a - b).mean() / 255.0)


def _open(source: str):
    import av

    try:
        return av.open(source, format="v4l2" if source.startswith("/dev/video") else None, timeout=10.0)
    except av.error.FileNotFoundError:
        raise ImageError(f"{source}: no such file or device; check the path") from None
    except av.error.InvalidDataError:
        raise ImageError(f"{source}: not a video FFmpeg can read, or a damaged one; re-copy it or convert it to MP4 "
                         "(H.264)") from None
    except (av.error.FFmpegError, OSError) as err:
        raise ImageError(f"{source}: cannot open it ({err}); check the URL, the device or the file") from None


def sample_frames(source: str, every_s: float, change_threshold: float = 0.0) -> Iterator[tuple[float, Image.Image]]:
    """(seconds since the first frame, RGB frame) about every ``every_s`` seconds; frames whose ``change`` from the last
    one yielded is below ``change_threshold`` are skipped. Damaged data after some frames ends the iteration with an
    ImageError naming where, after the frames before it were yielded."""
    import av

    if not every_s > 0 or not 0 <= change_threshold <= 1:
        raise ImageError(f"--every must be > 0 and --change-threshold in [0, 1], got {every_s} and {change_threshold}")
    with _open(source) as container:
        if not container.streams.video:
            raise ImageError(f"{source}: has no video stream (audio only?); pass a video")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"  # FFmpeg's own frame threads
        due, last, seconds, origin = 0.0, None, 0.0, None
        try:
            for frame in container.decode(stream):
                if frame.time is None:
                    continue
                origin = frame.time if origin is None else origin  # streams and MPEG-TS start at any timestamp
                if frame.time - origin + 1e-6 < due:
                    continue
                seconds = frame.time - origin
                due = (math.floor(seconds / every_s + 1e-6) + 1) * every_s
                image = frame.to_image()
                if change_threshold and last is not None and change(last, image) < change_threshold:
                    continue
                last = image
                yield seconds, image
        except av.error.FFmpegError as err:
            raise ImageError(f"{source}: damaged after {seconds:.1f} s ({err}); the captions before it stand") from None


def video_seconds(source: str) -> float | None:
    """The length of a video file in seconds, when its container says; None for a stream or a camera."""
    if not Path(source).is_file():
        return None
    with _open(source) as container:
        return container.duration / 1e6 if container.duration else None
