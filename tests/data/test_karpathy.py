import json

import pytest

from edgecap.data.karpathy import read_karpathy
from edgecap.errors import DataError

ENTRIES = [
    {"filename": "a.jpg", "imgid": 0, "split": "train", "sentences": [{"raw": " A dog runs. ", "tokens": ["dog"]}]},
    {"filename": "b.jpg", "imgid": 1, "split": "restval", "sentences": [{"tokens": ["a", "cat", "sits"]}]},
    {"filename": "c.jpg", "imgid": 2, "split": "val", "sentences": [{"raw": "A bird."}, {"raw": "A small bird."}]},
    {"filename": "d.jpg", "imgid": 3, "split": "test", "sentences": [{"raw": "A fish."}]},
]


def _write(folder, images, *, image_dir=None, dataset="test"):
    """A Karpathy JSON in ``folder`` and an empty file for each image under ``image_dir`` (default: ``folder``)."""
    for entry in images:
        image = (image_dir or folder) / entry.get("filepath", "") / entry["filename"]
        image.parent.mkdir(parents=True, exist_ok=True)
        image.write_bytes(b"jpeg")
    path = folder / "dataset_test.json"
    path.write_text(json.dumps({"dataset": dataset, "images": images}))
    return path


def _message(path, **kwargs) -> str:
    with pytest.raises(DataError) as err:
        read_karpathy(path, **kwargs)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_splits_captions_and_paths_round_trip(tmp_path):
    dataset = read_karpathy(_write(tmp_path, ENTRIES, image_dir=tmp_path / "images"))
    assert dataset.name == "test" and dataset.source.startswith("karpathy:")
    assert {name: [r.image_id for r in records] for name, records in dataset.splits.items()} == {
        "train": ["a", "b"], "dev": ["c"], "test": ["d"]}
    train = dataset.split("train")
    assert train[0].captions == ("A dog runs.",)  # raw text wins over tokens, stripped
    assert train[1].captions == ("a cat sits",)  # tokens-only sentences are joined
    assert dataset.split("dev")[0].captions == ("A bird.", "A small bird.")
    assert dataset.split("dev")[0].path == (tmp_path / "images" / "c.jpg").resolve()


def test_coco_style_filepath_cocoid_and_explicit_root(tmp_path):
    entries = [{"filepath": "val2014", "filename": "COCO_val2014_000000000042.jpg", "imgid": 0, "cocoid": 42,
                "split": "val", "sentences": [{"raw": "A train."}]}]
    json_dir, image_root = tmp_path / "karpathy", tmp_path / "coco"
    json_dir.mkdir()
    path = _write(json_dir, entries, image_dir=image_root)
    assert "IMAGE_ROOT" in _message(path)
    record = read_karpathy(path, image_root).split("dev")[0]
    assert record.image_id == "42"
    assert record.path == (image_root / "val2014" / "COCO_val2014_000000000042.jpg").resolve()
    assert record.path.is_file()


@pytest.mark.parametrize(("images", "expected"), [
    ([{"filename": "a.jpg", "split": "train"}], 'image 0 has no "sentences"'),
    ([{"filename": "a.jpg", "split": "train", "sentences": []}], 'image 0 has no "sentences"'),
    ([{"split": "train", "sentences": [{"raw": "x"}]}], 'image 0 has no "filename"'),
    ([{"filename": "a.jpg", "sentences": [{"raw": "x"}]}], 'image 0 has no "split"'),
    ([{"filename": "a.jpg", "split": "holdout", "sentences": [{"raw": "x"}]}], "split 'holdout'"),
    ([{"filename": "a.jpg", "split": "train", "sentences": [{"raw": "x"}]},
      {"filename": "b.jpg", "split": "train", "sentences": [{"id": 3}]}], 'image 1 has a sentence with neither "raw"'),
    (["a.jpg"], "image 0 is not an object"),
    ([], '"images" is empty'),
])
def test_missing_fields_name_the_file_and_the_image(tmp_path, images, expected):
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps({"images": images}))
    message = _message(path)
    assert message.startswith(f"{path}: ") and expected in message


def test_malformed_entries_are_reported_before_a_missing_image(tmp_path):
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps({"images": [{"filename": "a.jpg", "split": "train", "sentences": [{"raw": "x"}]},
                                           {"filename": "b.jpg", "split": "train"}]}))
    assert 'image 1 has no "sentences"' in _message(path)


def test_bad_json_missing_file_and_wrong_shape(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    assert "not valid JSON" in _message(tmp_path / "bad.json")
    assert "not found" in _message(tmp_path / "absent.json")
    (tmp_path / "list.json").write_text("[]")
    assert 'no "images" list' in _message(tmp_path / "list.json")


def test_missing_image_root_names_the_roots_and_the_spec(tmp_path):
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps({"images": [{"filename": "x.jpg", "split": "train", "sentences": [{"raw": "x"}]}]}))
    message = _message(path)
    assert "first image x.jpg not found" in message and str(tmp_path / "images") in message
    assert f"karpathy:{path}:IMAGE_ROOT" in message
    assert "not found under" in _message(path, image_root=tmp_path / "elsewhere")
