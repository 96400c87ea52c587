"""Calibration feeds: the inputs the fp32 graphs really see, saved as ``.npz`` so an INT8 build is repeatable.

Encoder feeds are preprocessed calibration photos. Step activations depend on the words fed, so step feeds are
recorded while the fp32 graphs caption those photos through the runtime's own beam search, then
subsampled to a few hundred rows. A saved row is self-contained: its state is gathered by ``reorder`` on the host
(what the graph would gather itself), so rows from different steps and images can be batched with an identity
``reorder``; rows that carry ``<pad>`` (finished or dead beams, whose outputs the search discards) are left out.
Memory tensors are stored once per image, since every beam row of an image reads the same memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgecap import spec
from edgecap.data.records import ImageRecord
from edgecap.preprocess import Preprocessing, load_images
from edgecap.runtime.backends.ort import OrtBackend, OrtStepSession
from edgecap.runtime.decoding import decode
from edgecap.runtime.manifest import Manifest
from edgecap.runtime.search import SearchOptions
from edgecap.vocab import PAD, Vocab

CALIB_DIR = "calib"  # beside the graphs in the export directory
ENCODER_FEEDS = "encoder.npz"
STEP_FEEDS = "step.npz"
IMAGE_INDEX = "row_image"  # step.npz: per row, the index of its image's memory


class RecordingSession:
    """A StepSession that keeps the feed of every step it runs; the search cannot tell it from the session it wraps."""

    def __init__(self, session: OrtStepSession):
        self.session = session
        self.feeds: list[dict[str, np.ndarray]] = []  # one per step: every step-graph input, N rows

    def tile(self, beam_size: int) -> None:
        self.session.tile(beam_size)

    def step(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.feeds.append(self.session.feed(tokens, reorder, position))
        return self.session.step(tokens, reorder, position)


def _live_rows(feeds: list[dict[str, np.ndarray]]) -> list[tuple[int, int]]:
    """(step, row) of every row that decodes a real word: pad rows belong to finished or dead beams."""
    return [(s, int(r)) for s, feed in enumerate(feeds) for r in np.flatnonzero(feed[spec.TOKENS] != PAD)]


def _gathered_row(feed: dict[str, np.ndarray], row: int) -> dict[str, np.ndarray]:
    """One row's tokens, position and state with the graph's reorder applied on the host."""
    parent = int(feed[spec.REORDER][row])
    out = {spec.TOKENS: feed[spec.TOKENS][row], spec.STEP: feed[spec.STEP]}
    out.update({name: value[parent] for name, value in feed.items() if spec.role_of(name) == spec.ROLE_STATE})
    return out


def record_feeds(directory: Path, manifest: Manifest, records: Sequence[ImageRecord], *, beam_size: int = 3,
                 max_rows: int = 256, batch_size: int = 16, seed: int = 0, progress: bool = True) -> tuple[Path, Path]:
    """Write ``calib/encoder.npz`` (pixels of ``records``) and ``calib/step.npz``; returns their paths.

    Captions are decoded with the fp32 graphs of ``directory`` and ``SearchOptions(beam_size=beam_size)``;
    ``max_rows`` live step rows are kept, drawn evenly at random (``seed``) over images, steps and beams.
    """
    prep = Preprocessing.from_json(manifest.preprocessing)
    backend = OrtBackend(directory, manifest, precision="fp32")
    options = SearchOptions(beam_size=beam_size)
    vocab = Vocab.from_json(manifest.vocab)
    pixels = np.empty((len(records), 3, prep.image_size, prep.image_size), np.float32)
    rows: list[dict[str, np.ndarray]] = []  # gathered step rows, with "image" index
    memory: dict[str, list[np.ndarray]] = {}
    starts = range(0, len(records), batch_size)
    for start in tqdm(starts, desc="recording calibration feeds", unit="batch", disable=not progress):
        chunk = records[start:start + batch_size]
        pixels[start:start + len(chunk)] = load_images([r.path for r in chunk], prep)
        session = RecordingSession(backend.encode(pixels[start:start + len(chunk)]))
        decode(session, len(chunk), options, vocab)
        for name, value in session.feeds[0].items():  # memory is tiled to the beams: keep one row per image
            if spec.role_of(name) == spec.ROLE_MEMORY:
                memory.setdefault(name, []).extend(value[::beam_size])
        for step, row in _live_rows(session.feeds):
            rows.append({**_gathered_row(session.feeds[step], row), IMAGE_INDEX: start + row // beam_size})
    if not rows:
        raise ValueError(f"{directory}: decoding {len(records)} calibration images produced no step rows")
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(len(rows), size=min(max_rows, len(rows)), replace=False))
    out = directory / CALIB_DIR
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / ENCODER_FEEDS, pixels=pixels, image_ids=np.array([r.image_id for r in records]))
    kept = [rows[i] for i in keep]
    used = sorted({int(r[IMAGE_INDEX]) for r in kept})  # store memory only for images that have a kept row
    remap = {image: i for i, image in enumerate(used)}
    arrays = {name: np.stack([r[name] for r in kept]) for name in kept[0] if name != IMAGE_INDEX}
    arrays[IMAGE_INDEX] = np.array([remap[int(r[IMAGE_INDEX])] for r in kept], dtype=np.int64)
    arrays.update({name: np.stack([values[i] for i in used]) for name, values in memory.items()})
    np.savez_compressed(out / STEP_FEEDS, **arrays)
    return out / ENCODER_FEEDS, out / STEP_FEEDS


def load_encoder_feeds(path: Path, *, batch_size: int = 8) -> list[dict[str, np.ndarray]]:
    """Encoder feeds ``{"pixels": float32 (B, 3, S, S)}`` from ``encoder.npz``, in saved order."""
    with np.load(path) as data:
        pixels = data["pixels"]
    return [{spec.PIXELS: pixels[i:i + batch_size]} for i in range(0, len(pixels), batch_size)]


def load_step_feeds(path: Path, *, batch_size: int = 32) -> list[dict[str, np.ndarray]]:
    """Step feeds from ``step.npz``: rows grouped by position (``step`` is a scalar input), identity ``reorder``."""
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    image = arrays.pop(IMAGE_INDEX)
    memory = {n: arrays.pop(n) for n in list(arrays) if spec.role_of(n) == spec.ROLE_MEMORY}
    positions = arrays.pop(spec.STEP)
    feeds = []
    for position in np.unique(positions):
        rows = np.flatnonzero(positions == position)
        for start in range(0, len(rows), batch_size):
            take = rows[start:start + batch_size]
            feed = {name: value[take] for name, value in arrays.items()}
            feed.update({name: value[image[take]] for name, value in memory.items()})
            feed[spec.STEP] = np.array(position, dtype=np.int64)
            feed[spec.REORDER] = np.arange(len(take), dtype=np.int64)
            feeds.append(feed)
    return feeds
