"""Reader for Karpathy-split JSON (``dataset_coco.json``, ``dataset_flickr8k.json``, ``dataset_flickr30k.json``)."""

from __future__ import annotations

import json
from pathlib import Path

from edgecap.data.records import CaptionDataset, ImageRecord
from edgecap.errors import DataError

SPLITS = {"train": "train", "restval": "train", "val": "dev", "test": "test"}


def _load_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: not found; check the karpathy:FILE.json path") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err.__class__.__name__}); expected a Karpathy split file") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f"{path}: no \"images\" list; expected Karpathy split format (dataset_coco.json style)")
    return data


def _captions(entry: dict, index: int, path: Path) -> tuple[str, ...]:
    sentences = entry.get("sentences")
    if not sentences:
        raise DataError(f"{path}: image {index} has no \"sentences\"; expected Karpathy split format")
    out = []
    for sentence in sentences:
        raw = sentence.get("raw") or " ".join(sentence.get("tokens", []))
        if not raw:
            raise DataError(f"{path}: image {index} has a sentence with neither \"raw\" nor \"tokens\"")
        out.append(raw.strip())
    return tuple(out)


def read_karpathy(json_path: Path, image_root: Path | None = None) -> CaptionDataset:
    """Splits train (+restval), dev (val) and test; images at ``image_root/[filepath/]filename``."""
    data = _load_json(json_path)
    if image_root is None:
        image_root = json_path.parent / "images" if (json_path.parent / "images").is_dir() else json_path.parent
    splits: dict[str, list[ImageRecord]] = {"train": [], "dev": [], "test": []}
    for index, entry in enumerate(data["images"]):
        for key in ("filename", "split"):
            if key not in entry:
                raise DataError(f"{json_path}: image {index} has no \"{key}\"; expected Karpathy split format")
        split = SPLITS.get(entry["split"])
        if split is None:
            raise DataError(f"{json_path}: image {index} has split '{entry['split']}'; "
                            f"expected one of {', '.join(SPLITS)}")
        path = image_root / entry.get("filepath", "") / entry["filename"]
        image_id = str(entry.get("cocoid", entry.get("imgid", Path(entry["filename"]).stem)))
        captions = _captions(entry, index, json_path)
        splits[split].append(ImageRecord(image_id=image_id, path=path.resolve(), captions=captions))
    first = next((records[0] for records in splits.values() if records), None)
    if first is None:
        raise DataError(f"{json_path}: no images; expected Karpathy split format")
    if not first.path.is_file():
        raise DataError(f"{first.path}: image not found; pass the image folder as karpathy:{json_path}:IMAGE_ROOT")
    name = str(data.get("dataset", json_path.stem))
    return CaptionDataset(name=name, source=f"karpathy:{json_path}",
                          splits={k: tuple(v) for k, v in splits.items() if v})
