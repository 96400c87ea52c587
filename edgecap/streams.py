"""``edgecap caption VIDEO --every S``: timestamped captions of a video file, stream or camera as they come, to the
terminal and optionally to SubRip (.srt) or JSON Lines files written caption by caption."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from edgecap.errors import EdgecapError, ImageError
from edgecap.model_source import ModelSource
from edgecap.runtime.search import SearchOptions
from edgecap.video import sample_frames, video_seconds


def clock(seconds: float, *, comma: bool = False) -> str:
    """HH:MM:SS.mmm (SubRip's HH:MM:SS,mmm with ``comma``)."""
    millis = round(seconds * 1000)
    text = f"{millis // 3_600_000:02d}:{millis // 60_000 % 60:02d}:{millis // 1000 % 60:02d}.{millis % 1000:03d}"
    return text.replace(".", ",") if comma else text


class SubRip:
    """An .srt file, one cue per caption, each shown until the next caption (or ``every`` seconds for the last)."""

    def __init__(self, file: TextIO, every_s: float):
        self.file, self.every_s, self.pending, self.count = file, every_s, None, 0

    def add(self, seconds: float, text: str) -> None:
        self._flush(seconds)
        self.pending = (seconds, text)

    def close(self) -> None:
        if self.pending:
            self._flush(self.pending[0] + self.every_s)

    def _flush(self, until: float) -> None:
        if self.pending is None:
            return
        start, text = self.pending
        self.count += 1
        self.file.write(f"{self.count}\n{clock(start, comma=True)} --> {clock(until, comma=True)}\n{text}\n\n")
        self.file.flush()


def caption_stream(source: ModelSource, video: str, options: SearchOptions, every_s: float, *,
                   change_threshold: float = 0.0, srt: Path | None = None, jsonl: Path | None = None,
                   say: Callable[[str], None] = print, warn: Callable[[str], None] = print) -> int:
    """Caption ``video`` every ``every_s`` seconds; 0 when it played to its end, 2 when it broke off (the captions
    before the break are kept in every output)."""
    if source.backend == "torch":
        raise EdgecapError(f"{video}: video runs an export (ort or openvino); drop --backend torch, or export the "
                           "model first (edgecap export)")
    captioner = source.load(options)
    length = video_seconds(video)
    srt_file = srt.open("w", encoding="utf-8") if srt else None
    jsonl_file = jsonl.open("w", encoding="utf-8") if jsonl else None
    subrip = SubRip(srt_file, every_s) if srt_file else None
    started, captioned, status, last = time.perf_counter(), 0, 0, 0.0
    try:
        for seconds, frame in sample_frames(video, every_s, change_threshold):
            caption = captioner.caption_frames([frame], options)[0]
            captioned, last = captioned + 1, seconds
            say(f"{clock(seconds)}  {caption.text}")
            if subrip:
                subrip.add(seconds, caption.text)
            if jsonl_file:
                jsonl_file.write(json.dumps({"time_s": round(seconds, 3), "caption": caption.text,
                                             "logprob": round(float(caption.hypothesis.logprob), 4)}) + "\n")
                jsonl_file.flush()
    except ImageError as err:
        warn(f"error: {err}")
        status = 2
    finally:
        if subrip:
            subrip.close()
        for file in (srt_file, jsonl_file):
            if file:
                file.close()
    if status and not captioned:
        return status
    wall = time.perf_counter() - started
    played = length if length and status == 0 else last
    warn(f"{captioned} frames captioned over {played:.1f} s of video in {wall:.1f} s: real-time factor "
         f"{played / wall:.1f}x" if wall > 0 else f"{captioned} frames captioned")
    return status
