"""Reader for the Flickr8k distribution: ``Flickr8k.token.txt`` plus split lists."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from edgecap.data.records import CaptionDataset, ImageRecord
from edgecap.errors import DataError

TOKEN_FILE = "Flickr8k.token.txt"
SPLIT_FILES = {"train": "Flickr_8k.trainImages.txt", "dev": "Flickr_8k.devImages.txt",
               "test": "Flickr_8k.testImages.txt"}
IMAGE_DIRS = ("images", "Flicker8k_Dataset", "Flickr8k_Dataset")


def _image_dir(root: Path) -> Path:
    for name in IMAGE_DIRS:
        if (root / name).is_dir():
            return root / name
    raise DataError(f"{root}: no image folder; expected one of {', '.join(IMAGE_DIRS)} beside {TOKEN_FILE}")


def _read_captions(token_file: Path) -> dict[str, list[str]]:
    captions: dict[str, list[str]] = defaultdict(list)
    for line_no, line in enumerate(token_file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, caption = line.partition("\t")
        if not sep or "#" not in key:
            raise DataError(f"{token_file}:{line_no}: expected 'IMAGE.jpg#k<TAB>caption'; "
                            "is this a Flickr8k token file?")
        captions[key.split("#", 1)[0]].append(caption.strip())
    return captions


def read_flickr8k(root: Path) -> CaptionDataset:
    """The splits whose list files exist under ``root`` (train/dev/test)."""
    token_file = root / TOKEN_FILE
    if not token_file.is_file():
        raise DataError(f"{token_file}: not found; pass flickr8k:DIR where DIR holds {TOKEN_FILE} and the split lists")
    captions = _read_captions(token_file)
    images = _image_dir(root)
    splits: dict[str, tuple[ImageRecord, ...]] = {}
    for split, file_name in SPLIT_FILES.items():
        list_file = root / file_name
        if not list_file.is_file():
            continue
        names = [n.strip() for n in list_file.read_text(encoding="utf-8").splitlines() if n.strip()]
        missing = [n for n in names if n not in captions]
        if missing:
            raise DataError(f"{list_file}: {len(missing)} images have no captions in {TOKEN_FILE} "
                            f"(first: {missing[0]})")
        splits[split] = tuple(
            ImageRecord(image_id=Path(n).stem, path=(images / n).resolve(), captions=tuple(captions[n])) for n in names
        )
    if not splits:
        raise DataError(f"{root}: no split lists found; expected {', '.join(SPLIT_FILES.values())}")
    return CaptionDataset(name="flickr8k", source=f"flickr8k:{root}", splits=splits)
