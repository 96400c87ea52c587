"""The dataset records every reader produces: images with their human captions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgecap.errors import DataError

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class ImageRecord:
    """One image and its reference captions (raw text, as the annotators wrote it)."""

    image_id: str  # unique within the dataset (file stem or COCO id)
    path: Path  # absolute path of the image file
    captions: tuple[str, ...]  # human references, untokenised


@dataclass(frozen=True)
class CaptionDataset:
    """Named splits of image records; split names are ``train``, ``dev``, ``test``."""

    name: str  # e.g. "flickr8k", "shapes", "coco"
    source: str  # the spec or path it was read from, for messages
    splits: dict[str, tuple[ImageRecord, ...]] = field(default_factory=dict)

    def split(self, name: str) -> tuple[ImageRecord, ...]:
        """The records of one split, or a DataError naming the splits that exist."""
        records = self.splits.get(name)
        if not records:
            have = ", ".join(k for k, v in self.splits.items() if v) or "none"
            raise DataError(f"{self.source}: no '{name}' split (available: {have}); pass --split with one of those")
        return records
