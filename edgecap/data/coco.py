"""Reader for raw COCO caption files (``captions_train2017.json`` and friends)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from edgecap.data.records import CaptionDataset, ImageRecord
from edgecap.errors import DataError

SPLIT_PREFIXES = (("captions_train", "train"), ("captions_val", "dev"), ("captions_test", "test"))


def _split_of(path: Path) -> tuple[str, str]:
    """(split, image folder name) from ``captions_val2017.json`` -> ("dev", "val2017")."""
    for prefix, split in SPLIT_PREFIXES:
        if path.stem.startswith(prefix):
            return split, path.stem.removeprefix("captions_")
    raise DataError(f"{path}: cannot tell the split from the name; expected captions_train*/captions_val*.json")


def _read_file(path: Path, image_root: Path) -> tuple[ImageRecord, ...]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        images, annotations = data["images"], data["annotations"]
        captions: dict[int, list[str]] = defaultdict(list)
        for ann in annotations:
            captions[ann["image_id"]].append(ann["caption"].strip())
        return tuple(ImageRecord(image_id=str(image["id"]), path=(image_root / image["file_name"]).resolve(),
                                 captions=tuple(captions[image["id"]]))
                     for image in images if captions[image["id"]])
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DataError(f"{path}: not valid JSON; expected a COCO captions file") from None
    except (KeyError, TypeError) as err:
        raise DataError(f"{path}: missing field {err}; expected COCO captions format (images, annotations)") from None


def read_coco(path: Path, image_root: Path | None = None) -> CaptionDataset:
    """A COCO root (``annotations/captions_*.json`` + ``train2017/`` ...) or one captions JSON."""
    files = sorted((path / "annotations").glob("captions_*.json")) if path.is_dir() else [path]
    if not files:
        raise DataError(f"{path}: no annotations/captions_*.json; pass a COCO root or a captions JSON")
    root = path if path.is_dir() else path.parent.parent
    splits: dict[str, tuple[ImageRecord, ...]] = {}
    for file in files:
        split, folder = _split_of(file)
        records = _read_file(file, image_root or root / folder)
        if records and not records[0].path.is_file():
            raise DataError(f"{records[0].path}: image not found; pass the image folder as coco:{file}:IMAGE_ROOT")
        splits[split] = splits.get(split, ()) + records
    return CaptionDataset(name="coco", source=f"coco:{path}", splits=splits)
