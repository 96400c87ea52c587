"""Reader for your own photos: a folder of images beside a ``captions.csv`` (``folder:DIR``).

``captions.csv`` has a header row ``image,caption`` and, optionally, ``split``. ``image`` is a file name (or a path
below DIR), ``caption`` one human caption; a photo with several captions has several rows. ``split`` is ``train``,
``dev`` or ``test``; without the column, photos are split by a hash of their name, about one in ten to ``dev`` (at
least one), so the same folder always splits the same way and a photo added later leaves the others where they were.
"""

from __future__ import annotations

import csv
import hashlib
from collections import defaultdict
from pathlib import Path

from edgecap.data.records import SPLITS, CaptionDataset, ImageRecord
from edgecap.errors import DataError

CAPTIONS_FILE = "captions.csv"
DEV_SHARE = 10  # one photo in this many goes to dev when the file has no split column


def _hashed_split(name: str) -> str:
    return "dev" if int(hashlib.sha256(name.encode()).hexdigest(), 16) % DEV_SHARE == 0 else "train"


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            missing = {"image", "caption"} - set(reader.fieldnames or ())
            if missing:
                raise DataError(f"{path}: no {' or '.join(sorted(missing))} column; the first row must name the "
                                "columns: image,caption[,split]")
            return [{**row, "line": str(reader.line_num)} for row in reader]
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text; save it as a UTF-8 CSV file") from None


def read_folder(root: Path) -> CaptionDataset:
    """The photos of ``root`` listed in its ``captions.csv``, by split."""
    path = root / CAPTIONS_FILE
    if not path.is_file():
        raise DataError(f"{path}: not found; folder:DIR needs DIR/{CAPTIONS_FILE} with rows image,caption")
    captions: dict[str, list[str]] = defaultdict(list)
    chosen: dict[str, str] = {}
    for row in _rows(path):
        image, caption, split = row["image"].strip(), (row["caption"] or "").strip(), (row.get("split") or "").strip()
        if not image or not caption:
            raise DataError(f"{path}:{row['line']}: an empty image or caption; every row needs both")
        if split and split not in SPLITS:
            raise DataError(f"{path}:{row['line']}: split '{split}'; expected one of {', '.join(SPLITS)}")
        if chosen.setdefault(image, split) != split:
            raise DataError(f"{path}:{row['line']}: {image} is in split '{split}' here and '{chosen[image]}' above")
        captions[image].append(caption)
    if not captions:
        raise DataError(f"{path}: no rows; add one row per caption: image,caption")
    splits: dict[str, list[ImageRecord]] = defaultdict(list)
    for image, texts in captions.items():
        file = (root / image).resolve()
        if not file.is_file():
            raise DataError(f"{file}: listed in {path} but not found; fix the name or add the photo")
        splits[chosen[image] or _hashed_split(image)].append(ImageRecord(Path(image).as_posix(), file, tuple(texts)))
    if not splits["dev"] and len(splits["train"]) > 1 and not any(chosen.values()):
        splits["dev"].append(splits["train"].pop())  # a small folder still has a photo to select on
    return CaptionDataset(name=f"folder {root.name}", source=f"folder:{root}",
                          splits={name: tuple(records) for name, records in splits.items() if records})
