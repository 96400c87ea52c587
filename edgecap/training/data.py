"""Training inputs: tokenised caption pairs, references for CIDEr-D, and image features on demand."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edgecap.config import EncoderConfig
from edgecap.data.features import cached_features
from edgecap.data.records import ImageRecord
from edgecap.models.caption_model import CaptionModel
from edgecap.preprocess import Preprocessing, load_images
from edgecap.vocab import BOS, EOS, PAD, Vocab, tokenize


@dataclass(frozen=True)
class CaptionPairs:
    """Every (image, caption) pair of a split: image_index (P,), tokens (P, T+2) as bos w1..wn eos pad..."""

    image_index: np.ndarray
    tokens: np.ndarray

    def batch(self, rows: np.ndarray, mirrored: np.ndarray, mirror_table: np.ndarray) -> np.ndarray:
        """Tokens of ``rows`` (a copy), the ``mirrored`` ones read through ``mirror_table`` (left <-> right)."""
        tokens = self.tokens[rows]
        tokens[mirrored] = mirror_table[tokens[mirrored]]
        return tokens


def caption_pairs(records: Sequence[ImageRecord], vocab: Vocab, *, max_length: int) -> CaptionPairs:
    rows, index = [], []
    for i, record in enumerate(records):
        for caption in record.captions:
            ids = vocab.encode(caption, max_length=max_length)
            if ids:
                rows.append([BOS, *ids, EOS])
                index.append(i)
    tokens = np.full((len(rows), max_length + 2), PAD, dtype=np.int64)
    for r, ids in enumerate(rows):
        tokens[r, : len(ids)] = ids
    return CaptionPairs(np.asarray(index, dtype=np.int64), tokens)


def epoch_order(image_index: np.ndarray, *, captions_per_image: int, mirror_share: float,
                seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One cross-entropy epoch: every caption pair once, in training order, and which pairs see their photo flipped
    (indexed by pair).

    ``captions_per_image`` 1 draws every pair on its own. k > 1 keeps up to k captions of a photo together in the
    order, with one flip for them all, so that a batch encodes each photo once for several captions.
    """
    shuffle, draws = np.random.default_rng(seed), np.random.default_rng(seed + 2000)
    order = shuffle.permutation(len(image_index))
    if captions_per_image == 1:
        return order, draws.random(len(order)) < mirror_share
    by_photo = order[np.argsort(image_index[order], kind="stable")]  # photo by photo, captions shuffled within
    photo = image_index[by_photo]
    first = np.searchsorted(photo, photo)  # where each photo's captions start
    groups, group = np.unique(photo * len(photo) + (np.arange(len(photo)) - first) // captions_per_image,
                              return_inverse=True)
    position = shuffle.permutation(len(groups))[group]
    flipped = np.zeros(len(order), bool)
    flipped[by_photo] = (draws.random(len(groups)) < mirror_share)[group]
    return by_photo[np.argsort(position, kind="stable")], flipped


MIRRORED_WORDS = (("left", "right"),)  # words whose meaning flips with the photo
_MIRRORED_WORD = {word: other for pair in MIRRORED_WORDS for word, other in (pair, pair[::-1])}


def mirrored_token_table(vocab: Vocab) -> np.ndarray:
    """Id -> id of the caption of the mirrored photo: "left" and "right" trade places, every other word stays."""
    table = np.arange(len(vocab), dtype=np.int64)
    for word, other in _MIRRORED_WORD.items():
        if word in vocab.index and other in vocab.index:
            table[vocab.index[word]] = vocab.index[other]
    return table


def tokenised_references(records: Sequence[ImageRecord], *, mirrored: bool = False) -> dict[str, list[list[str]]]:
    """image_id -> tokenised references, the corpus CIDEr-D takes its document frequencies from.

    With ``mirrored`` the corpus also holds every photo's flipped view, under ``mirrored_id``, with "left" and
    "right" swapped in its references; both views count as documents.
    """
    references = {r.image_id: [tokenize(c) for c in r.captions] for r in records}
    if mirrored:
        references |= {mirrored_id(image_id): [[_MIRRORED_WORD.get(w, w) for w in ref] for ref in refs]
                       for image_id, refs in list(references.items())}
    return references


def mirrored_id(image_id: str) -> str:
    """The key of a photo's flipped view in a mirrored reference corpus."""
    return f"{image_id} (mirrored)"


class ImageFeatures:
    """Grid features of a split: from the fp16 disk cache when the encoder is frozen, else computed per batch.

    With ``mirrored``, ``get`` can also return rows of the photos flipped left-right: one more cache for a frozen
    encoder, flipped pixels for a trained one.
    """

    def __init__(self, records: Sequence[ImageRecord], model: CaptionModel, encoder_config: EncoderConfig,
                 prep: Preprocessing, *, cache_dir: Path | None, label: str, mirrored: bool = False):
        self.records = records
        self.model = model
        self.prep = prep
        self.mirrored = mirrored
        self.cached: dict[bool, np.ndarray | torch.Tensor] = {}
        if not encoder_config.finetune:
            self.cached = {flip: cached_features(records, encoder_config, prep, directory=cache_dir,
                                                 label=f"{label} (mirrored)" if flip else label, mirrored=flip)
                           for flip in ((False, True) if mirrored else (False,))}
            self.cached = _on_gpu_if_room(self.cached, next(model.parameters()).device)

    def __len__(self) -> int:
        return len(self.records)

    def get(self, indices: np.ndarray, flipped: np.ndarray | None = None) -> torch.Tensor:
        """(len(indices), L, C) float32 on the model's device; differentiable through a fine-tuned encoder.

        ``flipped`` (bool, one per index) picks the rows taken from the flipped photo.
        """
        device = next(self.model.parameters()).device
        flipped = np.zeros(len(indices), bool) if flipped is None else np.asarray(flipped, bool)
        if flipped.any() and not self.mirrored:
            raise ValueError("mirrored rows were asked for, but this split was built without the mirrored photos")
        if self.cached:
            rows = torch.empty((len(indices), *self.cached[False].shape[1:]), dtype=torch.float32, device=device)
            for flip in (False, True):
                chosen = np.flatnonzero(flipped == flip)
                if len(chosen):
                    rows[torch.from_numpy(chosen).to(device)] = _gather(self.cached[flip], indices[chosen], device)
            return rows
        pixels = torch.from_numpy(load_images([self.records[i].path for i in indices], self.prep))
        chosen = torch.from_numpy(flipped)
        pixels[chosen] = pixels[chosen].flip(-1)
        return self.model.encode(pixels.to(device))


    def shared(self, indices: np.ndarray, flipped: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``get`` of each distinct (photo, flip) among ``indices`` once -> (features of the views, each index's view
        (len(indices),)): what a model's ``forward(..., rows=)`` takes."""
        views, view_of = np.unique(np.asarray(indices) * 2 + np.asarray(flipped, bool), return_inverse=True)
        features = self.get(views // 2, views % 2 == 1)
        return features, torch.from_numpy(view_of).to(features.device)


def _on_gpu_if_room(cached: dict[bool, np.ndarray], device: torch.device) -> dict[bool, np.ndarray | torch.Tensor]:
    """The caches as fp16 tensors on a CUDA ``device`` when they take under half its free memory: each batch is then
    gathered there instead of read, converted and copied by the CPU, which would starve the GPU. Else as they are."""
    if device.type != "cuda" or sum(c.nbytes for c in cached.values()) > torch.cuda.mem_get_info(device)[0] / 2:
        return cached
    return {flip: torch.from_numpy(np.array(c)).to(device) for flip, c in cached.items()}


def _gather(cache: np.ndarray | torch.Tensor, indices: np.ndarray, device: torch.device) -> torch.Tensor:
    """cache[indices] as float32 on ``device``; a memmap is read in ascending order (sequentially), returned in the
    asked order."""
    if isinstance(cache, torch.Tensor):
        return cache[torch.from_numpy(indices).to(cache.device)].float()
    return torch.from_numpy(cache[np.sort(indices)][np.argsort(np.argsort(indices))]).to(device).float()
