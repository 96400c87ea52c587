"""``Captioner.from_dir``: image files or in-memory frames in, captions out, through an export directory, no torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from edgecap.errors import ImageError, ModelError
from edgecap.preprocess import Preprocessing, frame_to_array, load_images
from edgecap.runtime.backends.base import Backend
from edgecap.runtime.backends.ort import OrtBackend
from edgecap.runtime.decoding import decode
from edgecap.runtime.manifest import Manifest
from edgecap.runtime.search import Hypothesis, SearchOptions
from edgecap.vocab import Vocab


def open_backend(directory: Path, manifest: Manifest, *, backend: str = "ort", precision: str = "fp32",
                 device: str = "cpu") -> Backend:
    """The runtime backend named ``backend`` on an export directory: ``ort`` (ONNX Runtime on ``device``),
    ``openvino`` (the same graphs through OpenVINO on ``device``) or ``trt`` (the TensorRT engines built there by
    ``edgecap export --trt``)."""
    if backend == "ort":
        return OrtBackend(directory, manifest, precision=precision, device=device)
    if backend == "openvino":
        from edgecap.runtime.backends.openvino import OpenvinoBackend

        return OpenvinoBackend(directory, manifest, precision=precision, device=device.upper())
    if backend == "trt":
        from edgecap.runtime.backends.trt import TrtBackend

        return TrtBackend(directory, manifest, precision=precision)
    raise ValueError(f"backend '{backend}' is not available in the runtime; use 'ort', 'openvino' or 'trt'")


@dataclass(frozen=True)
class Caption:
    """One image's caption, from any backend."""

    image: Path | None  # the file; None for a frame passed in memory
    text: str
    hypothesis: Hypothesis
    alternatives: tuple[str, ...] = ()  # with n_best > 1: the next best captions, best first
    unmet_words: tuple[str, ...] = ()  # require_words no caption the search found could hold

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(self.text.split())

    @property
    def attention(self) -> np.ndarray:
        """(len(words) + 1, L): one attention map per word and the end token."""
        return self.hypothesis.attention

    @property
    def logprob(self) -> float:
        return self.hypothesis.logprob


def check_options(manifest: Manifest, options: SearchOptions, directory: Path | None = None) -> None:
    """Refuse a search the export cannot run exactly: too few candidates per step, or a KV cache too short."""
    where = f"{directory}: " if directory is not None else ""
    if options.k > manifest.topk:
        top_k = f" top_k {options.top_k}" if options.sample and options.top_k else ""
        raise ModelError(f"{where}beam {options.beam_size}{top_k} needs {options.k} candidates per step but the step "
                         f"graph returns {manifest.topk}; re-export with --beam {math.ceil(options.k / 2)}")
    cache = manifest.model_config.get("max_positions")  # a static KV cache: steps 0..max_positions-1
    if cache is not None and options.max_length >= cache:
        raise ModelError(f"{where}max_length {options.max_length} needs decoding steps 0..{options.max_length} but the "
                         f"step graph's KV cache holds {cache} (model max_positions); use max_length < {cache}")


class Captioner:
    """Preprocess -> encoder graph -> beam search over the step graph -> words, batched over images."""

    def __init__(self, backend: Backend, manifest: Manifest, directory: Path | None = None):
        self.backend = backend
        self.manifest = manifest
        self.directory = directory  # named in errors
        self.vocab = Vocab.from_json(manifest.vocab)
        self.prep = Preprocessing.from_json(manifest.preprocessing)

    @classmethod
    def from_dir(cls, directory: Path | str, *, backend: str = "ort", precision: str | None = None,
                 device: str = "cpu") -> Captioner:
        """``precision`` None: what ``edgecap export --target`` chose for the export, else fp32."""
        directory = Path(directory)
        manifest = Manifest.read(directory)
        precision = precision or manifest.default_precision
        return cls(open_backend(directory, manifest, backend=backend, precision=precision, device=device), manifest,
                   directory)

    def search(self, pixels: np.ndarray, options: SearchOptions) -> list[Hypothesis]:
        """Best hypothesis per image of preprocessed pixels (N, 3, H, W)."""
        return [found[0] for found in self.search_n(pixels, options)]

    def search_n(self, pixels: np.ndarray, options: SearchOptions) -> list[list[Hypothesis]]:
        """``options.n_best`` hypotheses per image of preprocessed pixels (N, 3, H, W), best first."""
        check_options(self.manifest, options, self.directory)
        return decode(self.backend.encode(pixels), len(pixels), options, self.vocab)

    def caption(self, paths: Sequence[Path | str], options: SearchOptions, *, batch_size: int = 16) -> list[Caption]:
        """One caption per image file, ``batch_size`` images decoded and searched at a time."""
        paths = [Path(p) for p in paths]
        out = []
        for start in range(0, len(paths), batch_size):
            chunk = paths[start:start + batch_size]
            out += self._caption_batch(chunk, load_images(chunk, self.prep), options)
        return out

    def caption_frames(self, frames: Sequence[Image.Image | np.ndarray], options: SearchOptions, *,
                       batch_size: int = 16) -> list[Caption]:
        """One caption per picture already in memory (a camera or video frame: see ``frame_to_array``).

        ``frames`` is a sequence of frames (or one (N, H, W, 3) array of them); a single frame is refused rather
        than captioned row by row.
        """
        if isinstance(frames, Image.Image) or (isinstance(frames, np.ndarray) and frames.ndim != 4):
            raise ImageError(f"caption_frames takes a sequence of frames, got one {type(frames).__name__}"
                             f"{f' of shape {frames.shape}' if isinstance(frames, np.ndarray) else ''}; pass [frame]")
        out = []
        for start in range(0, len(frames), batch_size):
            chunk = frames[start:start + batch_size]
            pixels = np.stack([frame_to_array(f, self.prep, name=f"frame {start + i}") for i, f in enumerate(chunk)])
            out += self._caption_batch([None] * len(chunk), pixels, options)
        return out

    def _caption_batch(self, images: Sequence[Path | None], pixels: np.ndarray,
                       options: SearchOptions) -> list[Caption]:
        return [caption_of(image, found, self.vocab, options.require_words)
                for image, found in zip(images, self.search_n(pixels, options), strict=True)]


def caption_of(image: Path | None, found: Sequence[Hypothesis], vocab: Vocab, required: Sequence[str] = ()) -> Caption:
    """The best of an image's hypotheses as its caption, the others as its alternatives, and the ``required`` words
    it lacks."""
    text = vocab.decode(found[0].tokens)
    unmet = tuple(w for w in required if w not in text.split())
    return Caption(image, text, found[0], tuple(vocab.decode(h.tokens) for h in found[1:]), unmet)
