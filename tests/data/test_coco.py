import json

import pytest

from edgecap.data.coco import read_coco
from edgecap.errors import DataError


def _captions_file(path, images, annotations):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"info": {}, "licenses": [], "images": images, "annotations": annotations}))
    return path


def _message(*args) -> str:
    with pytest.raises(DataError) as err:
        read_coco(*args)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_coco_mini_root_reads_both_official_files(coco_mini_dir):
    dataset = read_coco(coco_mini_dir)
    train, dev = dataset.split("train"), dataset.split("dev")
    assert (len(train), len(dev)) == (80, 79)
    assert set(dataset.splits) == {"train", "dev"}
    for split, records in (("train2017", train), ("val2017", dev)):
        for record in records:
            assert record.path.is_file() and record.path.parent.name == split
            assert int(record.path.stem) == int(record.image_id)
            assert 5 <= len(record.captions) <= 7 and all(c and c == c.strip() for c in record.captions)
    assert sum(len(r.captions) for r in train) == 400 and sum(len(r.captions) for r in dev) == 395


def test_coco_mini_single_file_and_explicit_image_root(coco_mini_dir):
    val = coco_mini_dir / "annotations" / "captions_val2017.json"
    dev = read_coco(coco_mini_dir).split("dev")
    single = read_coco(val)
    assert set(single.splits) == {"dev"} and single.split("dev") == dev
    assert read_coco(val, coco_mini_dir / "val2017").split("dev") == dev  # the image folder itself
    assert read_coco(val, coco_mini_dir).split("dev") == dev  # or the root holding val2017/


def test_flat_layout_and_uncaptioned_images(tmp_path):
    (tmp_path / "test2017").mkdir()
    (tmp_path / "test2017" / "7.jpg").write_bytes(b"jpeg")
    path = _captions_file(tmp_path / "captions_test2017.json",
                          [{"id": 7, "file_name": "7.jpg"}, {"id": 8, "file_name": "8.jpg"}],
                          [{"id": 1, "image_id": 7, "caption": "A cat. "}, {"id": 2, "image_id": 7, "caption": "Cat"}])
    (record,) = read_coco(path).split("test")
    assert (record.image_id, record.captions, record.path) == ("7", ("A cat.", "Cat"), tmp_path / "test2017" / "7.jpg")


def test_bad_files_name_the_file_and_the_fix(tmp_path):
    bad = tmp_path / "captions_val2017.json"
    bad.write_text(json.dumps({"images": []}))
    assert _message(bad) == f"{bad}: missing field 'annotations'; expected COCO captions format (images, annotations)"
    bad.write_text("{oops")
    assert "not valid JSON" in _message(bad)
    _captions_file(bad, [{"id": 1}], [{"image_id": 1, "caption": "x"}])
    assert "missing field 'file_name'" in _message(bad)
    _captions_file(bad, [{"id": 1, "file_name": "1.jpg"}], [{"image_id": 1, "caption": "x"}])
    assert "first image 1.jpg not found" in _message(bad) and f"coco:{bad}:IMAGE_ROOT" in _message(bad)
    _captions_file(bad, [{"id": 1, "file_name": "1.jpg"}], [])
    assert "no captioned images" in _message(bad)
    other = _captions_file(tmp_path / "instances_val2017.json", [], [])
    assert "cannot tell the split" in _message(other)
    assert "not found" in _message(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    assert "no annotations/captions_*.json" in _message(tmp_path / "empty")


def test_root_with_two_years_of_the_same_split_is_refused(tmp_path):
    for name in ("captions_train2014.json", "captions_train2017.json"):
        _captions_file(tmp_path / "annotations" / name, [], [])
    assert "pass one file as coco:FILE.json" in _message(tmp_path)
