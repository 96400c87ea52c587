"""Reader for Karpathy-split JSON (``dataset_coco.json``, ``dataset_flickr8k.json``, ``dataset_flickr30k.json``).

Each entry of ``images`` holds ``filename``, an optional ``filepath`` (COCO: ``train2014``/``val2014``), a
``split`` and its ``sentences``. Only the first image is checked on disk: stat-ing 123k COCO files would
cost more than reading the JSON, and the first one is enough to catch a wrong image root.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgecap.data.records import CaptionDataset, ImageRecord
from edgecap.errors import DataError

# restval is the part of COCO val2014 that Karpathy's split gives to training.
SPLITS = {"train": "train", "restval": "train", "val": "dev", "test": "test"}
FORMAT_HINT = "expected Karpathy split format"


def _load_json(path: Path) -> dict:
    """The parsed file, checked to hold a non-empty ``images`` list."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: not found; check the karpathy:FILE.json path") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err}); {FORMAT_HINT}") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f"{path}: no \"images\" list; {FORMAT_HINT} (dataset_coco.json style)")
    if not data["images"]:
        raise DataError(f"{path}: \"images\" is empty; {FORMAT_HINT}")
    return data


def _relative_path(entry: object, index: int, path: Path) -> Path:
    """``[filepath/]filename`` of one entry, the part below the image root."""
    if not isinstance(entry, dict):
        raise DataError(f"{path}: image {index} is not an object; {FORMAT_HINT}")
    if not isinstance(entry.get("filename"), str):
        raise DataError(f"{path}: image {index} has no \"filename\"; {FORMAT_HINT}")
    return Path(entry.get("filepath") or "", entry["filename"])


def _captions(entry: dict, index: int, path: Path) -> tuple[str, ...]:
    """The ``raw`` text of each sentence, or its ``tokens`` joined when ``raw`` is absent."""
    sentences = entry.get("sentences")
    if not isinstance(sentences, list) or not sentences:
        raise DataError(f"{path}: image {index} has no \"sentences\"; {FORMAT_HINT}")
    captions = []
    for sentence in sentences:
        text = ""
        if isinstance(sentence, dict):
            raw, tokens = sentence.get("raw"), sentence.get("tokens")
            text = raw if isinstance(raw, str) else " ".join(map(str, tokens)) if isinstance(tokens, list) else ""
        if not text.strip():
            raise DataError(f"{path}: image {index} has a sentence with neither \"raw\" nor \"tokens\"; {FORMAT_HINT}")
        captions.append(text.strip())
    return tuple(captions)


def _split(entry: dict, index: int, path: Path) -> str:
    if "split" not in entry:
        raise DataError(f"{path}: image {index} has no \"split\"; {FORMAT_HINT}")
    split = SPLITS.get(entry["split"])
    if split is None:
        raise DataError(f"{path}: image {index} has split '{entry['split']}'; expected one of {', '.join(SPLITS)}")
    return split


def _image_root(json_path: Path, image_root: Path | None, first: Path) -> Path:
    """The given root, or the JSON's folder or its ``images/`` subfolder, whichever holds the first image."""
    candidates = [image_root] if image_root is not None else [json_path.parent, json_path.parent / "images"]
    for root in candidates:
        if (root / first).is_file():
            return root.resolve()
    tried = " or ".join(str(root) for root in candidates)
    raise DataError(f"{json_path}: first image {first} not found under {tried}; "
                    f"pass the image folder as karpathy:{json_path}:IMAGE_ROOT")


def read_karpathy(json_path: Path, image_root: Path | None = None) -> CaptionDataset:
    """Splits ``train`` (train + restval), ``dev`` (val) and ``test``; images at ``image_root/[filepath/]filename``.

    Image ids are the COCO id where the entry has one, else the file stem (as the Flickr8k reader names them).
    """
    data = _load_json(json_path)
    # Every entry is checked before the image root, so a malformed file is reported as such.
    parsed = []
    for index, entry in enumerate(data["images"]):
        relative = _relative_path(entry, index, json_path)
        image_id = str(entry["cocoid"]) if "cocoid" in entry else relative.stem
        parsed.append((_split(entry, index, json_path), image_id, relative, _captions(entry, index, json_path)))
    root = _image_root(json_path, image_root, parsed[0][2])
    splits: dict[str, list[ImageRecord]] = {"train": [], "dev": [], "test": []}
    for split, image_id, relative, captions in parsed:
        splits[split].append(ImageRecord(image_id=image_id, path=root / relative, captions=captions))
    name = str(data.get("dataset") or json_path.stem)
    return CaptionDataset(name=name, source=f"karpathy:{json_path}",
                          splits={k: tuple(v) for k, v in splits.items() if v})
