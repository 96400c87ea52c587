"""One-time on-disk cache of frozen-encoder grid features (fp16), so decoder epochs are fast on a CPU.

A cache file is keyed by the image list, the encoder (and its weights file's content), the preprocessing and the
view of the photos (``edgecap.data.views``: flipped, zoomed), so a change of any of them makes a new file instead of
reusing stale features. It is filled in chunks with its progress recorded beside
it: a killed run resumes where it stopped and only a finished file gets the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from edgecap.cache import cache_root
from edgecap.config import EncoderConfig
from edgecap.data.records import ImageRecord
from edgecap.data.views import View
from edgecap.models.encoder import build_encoder, encoder_weights_file, grid_features
from edgecap.preprocess import Preprocessing, load_images
from edgecap.runtime.manifest import file_sha256

FEATURE_FIELDS = ("name", "image_size", "weights", "finetune", "channels")
"""The encoder config fields a cache key hashes: the ones that existed when caches were first written. A field
added later that does not change the features (a training option) must not rename every cache."""


def _cache_key(records: Sequence[ImageRecord], encoder: EncoderConfig, prep: Preprocessing, view: View | None) -> str:
    digest = hashlib.sha256()
    described = {"encoder": {name: getattr(encoder, name) for name in FEATURE_FIELDS}, "prep": asdict(prep),
                 **(view.describe() if view else {})}
    if encoder.weights:  # the file's content, not its name, decides what the features are
        described["weights_sha256"] = file_sha256(encoder_weights_file(encoder))
    digest.update(json.dumps(described, sort_keys=True).encode())
    for record in records:
        digest.update(str(record.path).encode() + b"\0")
    return digest.hexdigest()[:16]


@torch.no_grad()
def cached_features(records: Sequence[ImageRecord], encoder_config: EncoderConfig, prep: Preprocessing, *,
                    directory: Path | None = None, batch_size: int = 32, label: str = "features",
                    view: View | None = None) -> np.ndarray:
    """Grid features (len(records), L, C) as a read-only fp16 memmap, computing what is missing.

    ``view`` encodes every photo flipped or zoomed: another view of the training photos that a frozen encoder
    cannot produce from the first.
    """
    directory = directory or cache_root() / "features"
    directory.mkdir(parents=True, exist_ok=True)
    key = _cache_key(records, encoder_config, prep, view)
    final = directory / f"{encoder_config.name}-{prep.image_size}{f'-{view.name}' if view else ''}-{key}.npy"
    if final.exists():
        return np.load(final, mmap_mode="r")
    partial, progress = final.with_suffix(".partial.npy"), final.with_suffix(".progress")
    encoder = build_encoder(encoder_config).eval()
    done = int(progress.read_text()) if progress.exists() and partial.exists() else 0
    if done:
        out = np.load(partial, mmap_mode="r+")
    else:
        probe = grid_features(encoder, torch.zeros(1, 3, prep.image_size, prep.image_size))
        out = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float16, shape=(len(records), *probe.shape[1:]))
    with tqdm(total=len(records), initial=done, desc=f"caching {label}", unit="img") as bar:
        for start in range(done, len(records), batch_size):
            chunk = records[start:start + batch_size]
            pixels = torch.from_numpy(load_images([r.path for r in chunk], prep))
            if view:
                pixels = view.apply(pixels)
            out[start:start + len(chunk)] = grid_features(encoder, pixels).numpy().astype(np.float16)
            out.flush()
            progress.write_text(str(start + len(chunk)))
            bar.update(len(chunk))
    del out
    os.replace(partial, final)
    progress.unlink()
    return np.load(final, mmap_mode="r")
