"""One-time on-disk cache of frozen-encoder grid features (fp16), so decoder epochs are fast on a CPU.

A cache file is keyed by the image list, the encoder (and its weights file's content), the preprocessing and whether
the photos are flipped left-right, so a change of any of them makes a new file instead of reusing stale features. It
is filled in chunks with its progress recorded beside it: a killed run resumes where it stopped and only a finished
file gets the final name. Runs started side by side on the same photos take turns on a lock file, so the second
reads what the first wrote instead of both writing it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from edgecap.cache import cache_root
from edgecap.config import EncoderConfig
from edgecap.data.records import ImageRecord
from edgecap.models.encoder import build_encoder, encoder_weights_file, grid_features
from edgecap.preprocess import Preprocessing, load_images
from edgecap.runtime.manifest import file_sha256

FEATURE_FIELDS = ("name", "image_size", "weights", "finetune", "channels")
"""The encoder config fields a cache key hashes: the ones that existed when caches were first written. A field
added later that does not change the features (a training option) must not rename every cache."""


def _cache_key(records: Sequence[ImageRecord], encoder: EncoderConfig, prep: Preprocessing, mirrored: bool) -> str:
    digest = hashlib.sha256()
    described = {"encoder": {name: getattr(encoder, name) for name in FEATURE_FIELDS}, "prep": asdict(prep),
                 **({"mirrored": True} if mirrored else {})}
    if encoder.weights:  # the file's content, not its name, decides what the features are
        described["weights_sha256"] = file_sha256(encoder_weights_file(encoder))
    digest.update(json.dumps(described, sort_keys=True).encode())
    for record in records:
        digest.update(str(record.path).encode() + b"\0")
    return digest.hexdigest()[:16]


@contextmanager
def _held(lock: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``lock``; the OS releases it when its holder exits or is killed."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks, so concurrent caching of the same photos is unguarded
        yield
        return
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            tqdm.write(f"waiting for another process that is caching {lock.with_suffix('.npy')}", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@torch.no_grad()
def cached_features(records: Sequence[ImageRecord], encoder_config: EncoderConfig, prep: Preprocessing, *,
                    directory: Path | None = None, batch_size: int = 32, label: str = "features",
                    mirrored: bool = False) -> np.ndarray:
    """Grid features (len(records), L, C) as a read-only fp16 memmap, computing what is missing.

    ``mirrored`` encodes every photo flipped left-right: another view of the training photos that a frozen encoder
    cannot produce from the first.
    """
    directory = directory or cache_root() / "features"
    directory.mkdir(parents=True, exist_ok=True)
    key = _cache_key(records, encoder_config, prep, mirrored)
    final = directory / f"{encoder_config.name}-{prep.image_size}{'-mirrored' if mirrored else ''}-{key}.npy"
    if not final.exists():
        lock = final.with_suffix(".lock")
        with _held(lock):
            if not final.exists():  # another run may have finished it while this one waited
                _fill(final, records, encoder_config, prep, batch_size, label, mirrored)
                lock.unlink(missing_ok=True)  # runs still waiting on it find the finished file when they wake
    return np.load(final, mmap_mode="r")


def _fill(final: Path, records: Sequence[ImageRecord], encoder_config: EncoderConfig, prep: Preprocessing,
          batch_size: int, label: str, mirrored: bool) -> None:
    partial, progress = final.with_suffix(".partial.npy"), final.with_suffix(".progress")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the same features, minutes sooner
    encoder = build_encoder(encoder_config).eval().to(device)
    done = int(progress.read_text()) if progress.exists() and partial.exists() else 0
    if done:
        out = np.load(partial, mmap_mode="r+")
    else:
        probe = grid_features(encoder, torch.zeros(1, 3, prep.image_size, prep.image_size, device=device))
        out = np.lib.format.open_memmap(partial, mode="w+", dtype=np.float16, shape=(len(records), *probe.shape[1:]))
    with tqdm(total=len(records), initial=done, desc=f"caching {label}", unit="img") as bar:
        for start in range(done, len(records), batch_size):
            chunk = records[start:start + batch_size]
            pixels = torch.from_numpy(load_images([r.path for r in chunk], prep))
            if mirrored:
                pixels = pixels.flip(-1)
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # fp32 convolutions, as on a CPU
                features = grid_features(encoder, pixels.to(device))
            out[start:start + len(chunk)] = features.cpu().numpy().astype(np.float16)
            out.flush()
            progress.write_text(str(start + len(chunk)))
            bar.update(len(chunk))
    del out
    os.replace(partial, final)
    progress.unlink()
