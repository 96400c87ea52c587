"""Reader for raw COCO caption files (``captions_train2017.json`` and friends).

A COCO root holds ``annotations/captions_<set>.json`` with the images of each set in ``<root>/<set>/``
(``captions_val2017.json`` -> ``val2017/``). The split comes from the file name: train -> ``train``,
val -> ``dev``, test -> ``test``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from edgecap.data.records import CaptionDataset, ImageRecord
from edgecap.errors import DataError

SPLIT_PREFIXES = {"captions_train": "train", "captions_val": "dev", "captions_test": "test"}
FORMAT_HINT = "expected COCO captions format (images, annotations)"


def _split_of(path: Path) -> str:
    for prefix, split in SPLIT_PREFIXES.items():
        if path.stem.startswith(prefix):
            return split
    raise DataError(f"{path}: cannot tell the split from the name; expected captions_train*, captions_val* "
                    "or captions_test*.json")


def _caption_files(path: Path) -> dict[str, Path]:
    """Split -> captions JSON: ``path`` itself, or the ``captions_*.json`` in ``path/annotations`` (or ``path``)."""
    if path.is_file():
        return {_split_of(path): path}
    if not path.is_dir():
        raise DataError(f"{path}: not found; pass coco:DIR (a COCO root) or coco:FILE.json")
    files = sorted((path / "annotations").glob("captions_*.json")) or sorted(path.glob("captions_*.json"))
    if not files:
        raise DataError(f"{path}: no annotations/captions_*.json; pass a COCO root or a captions JSON")
    by_split: dict[str, Path] = {}
    for file in files:
        split = _split_of(file)
        if split in by_split:  # e.g. 2014 and 2017 files side by side: their images overlap across splits
            raise DataError(f"{path}: both {by_split[split].name} and {file.name}; pass one file as coco:FILE.json")
        by_split[split] = file
    return by_split


def _read_file(path: Path) -> list[tuple[str, str, tuple[str, ...]]]:
    """(image id, file name, captions) of each captioned image, in the file's image order."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err}); {FORMAT_HINT}") from None
    try:
        captions: dict[object, list[str]] = defaultdict(list)
        for annotation in data["annotations"]:
            captions[annotation["image_id"]].append(annotation["caption"].strip())
        return [(str(image["id"]), image["file_name"], tuple(captions[image["id"]]))
                for image in data["images"] if image["id"] in captions]
    except KeyError as err:
        raise DataError(f"{path}: missing field {err}; {FORMAT_HINT}") from None
    except (TypeError, AttributeError):
        raise DataError(f"{path}: unexpected field types; {FORMAT_HINT}") from None


def _image_folder(file: Path, image_root: Path | None, first: str) -> Path:
    """The folder holding ``first``: ``<root>/<set>/`` or the root itself, with root the given one or the
    folder above ``annotations/``."""
    image_set = file.stem.removeprefix("captions_")
    roots = [image_root] if image_root is not None else [file.parent.parent, file.parent]
    candidates = [folder for root in roots for folder in (root / image_set, root)]
    for folder in candidates:
        if (folder / first).is_file():
            return folder.resolve()
    raise DataError(f"{file}: first image {first} not found in {' or '.join(map(str, candidates))}; "
                    f"pass the image folder as coco:{file}:IMAGE_ROOT")


def read_coco(path: Path, image_root: Path | None = None) -> CaptionDataset:
    """A COCO root (``annotations/captions_*.json`` + ``train2017/`` ...) or one captions JSON.

    Image ids are the COCO ids; images without captions are left out. Only the first image of each
    file is checked on disk.
    """
    splits: dict[str, tuple[ImageRecord, ...]] = {}
    for split, file in _caption_files(path).items():
        images = _read_file(file)
        if not images:
            raise DataError(f"{file}: no captioned images; {FORMAT_HINT}")
        folder = _image_folder(file, image_root, images[0][1])
        splits[split] = tuple(ImageRecord(image_id=image_id, path=folder / name, captions=captions)
                              for image_id, name, captions in images)
    return CaptionDataset(name="coco", source=f"coco:{path}", splits=splits)
