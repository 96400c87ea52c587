"""``folder:DIR``: your own photos beside a captions.csv, split by a column or by a stable hash of the names."""

import json

import numpy as np
import pytest
from PIL import Image

from edgecap.data import load_dataset
from edgecap.errors import DataError
from tests.helpers import invoke


def _folder(root, rows, header="image,caption", photos=None):
    root.mkdir(parents=True, exist_ok=True)
    for name in photos if photos is not None else {row.split(",")[0] for row in rows}:
        colour = np.random.default_rng(len(name)).integers(0, 255, 3, dtype=np.uint8)
        Image.fromarray(np.broadcast_to(colour, (40, 40, 3)).copy()).save(root / name)
    (root / "captions.csv").write_text("\n".join([header, *rows]) + "\n")
    return root


def test_rows_become_records_with_every_caption_of_a_photo(tmp_path):
    rows = [f"p{i}.jpg,a photo number {i}" for i in range(30)] + ['p0.jpg,"a second caption, with a comma"']
    dataset = load_dataset(f"folder:{_folder(tmp_path / 'mine', rows)}")
    records = {r.image_id: r for split in dataset.splits.values() for r in split}
    assert len(records) == 30 and records["p0.jpg"].captions == ("a photo number 0", "a second caption, with a comma")
    assert records["p0.jpg"].path == (tmp_path / "mine" / "p0.jpg").resolve()
    assert 0 < len(dataset.split("dev")) < 10 and len(dataset.split("train")) + len(dataset.split("dev")) == 30
    again = load_dataset(f"folder:{tmp_path / 'mine'}")
    assert again.splits == dataset.splits  # the hashed split is the same every time


def test_a_split_column_is_obeyed(tmp_path):
    rows = ["a.jpg,a dog,train", "b.jpg,a cat,dev", "c.jpg,a cup,test", "a.jpg,a brown dog,train"]
    dataset = load_dataset(f"folder:{_folder(tmp_path, rows, header='image,caption,split')}")
    assert [r.image_id for r in dataset.split("train")] == ["a.jpg"] and len(dataset.split("train")[0].captions) == 2
    assert [r.image_id for r in dataset.split("dev")] == ["b.jpg"] and [r.image_id for r in dataset.split("test")] == [
        "c.jpg"]


def test_two_photos_without_a_split_column_still_give_one_to_dev(tmp_path):
    dataset = load_dataset(f"folder:{_folder(tmp_path, ['a.jpg,a dog', 'b.jpg,a cat'])}")
    assert len(dataset.split("train")) == len(dataset.split("dev")) == 1


@pytest.mark.parametrize(("header", "rows", "photos", "named"), [
    ("image,text", ["a.jpg,a dog"], ["a.jpg"], "no caption column"),
    ("image,caption", ["a.jpg,"], ["a.jpg"], "captions.csv:2: an empty image or caption"),
    ("image,caption,split", ["a.jpg,a dog,valid"], ["a.jpg"], "split 'valid'"),
    ("image,caption,split", ["a.jpg,a dog,train", "a.jpg,a cat,dev"], ["a.jpg"], "captions.csv:3: a.jpg is in split"),
    ("image,caption", ["gone.jpg,a dog"], [], "gone.jpg: listed in"),
])
def test_a_bad_captions_file_is_one_error_naming_the_file_and_line(tmp_path, header, rows, photos, named):
    with pytest.raises(DataError, match=named):
        load_dataset(f"folder:{_folder(tmp_path, rows, header=header, photos=photos)}")


def test_a_folder_without_captions_csv_says_what_it_needs(tmp_path):
    with pytest.raises(DataError, match="captions.csv: not found; folder:DIR needs"):
        load_dataset(f"folder:{tmp_path}")


@pytest.mark.slow
def test_a_model_trains_on_a_folder_of_photos_and_captions_them(tmp_path):
    shapes = load_dataset("shapes").split("train")[:24]  # real generated scenes with their captions
    root = tmp_path / "photos"
    root.mkdir()
    rows = []
    for record in shapes:
        Image.open(record.path).save(root / f"{record.image_id}.jpg")
        rows += [f'{record.image_id}.jpg,"{caption}"' for caption in record.captions]
    (root / "captions.csv").write_text("image,caption\n" + "\n".join(rows) + "\n")
    run = tmp_path / "run"
    code, output = invoke("train", "--data", f"folder:{root}", "--preset", "tiny", "--out", str(run),
                          "--max-steps", "20")
    assert code == 0, output
    assert json.loads((run / "config.json").read_text())["data"] == f"folder:{root}"
    code, output = invoke("caption", str(root / f"{shapes[0].image_id}.jpg"), "--model", str(run))
    assert code == 0 and output.strip().split(": ", 1)[1], output
