import json

import pytest

from edgecap.data import load_dataset
from edgecap.data.coco import read_coco
from edgecap.data.karpathy import read_karpathy
from edgecap.data.shapes import generate_shapes, load_shapes
from edgecap.errors import DataError


def _karpathy(tmp_path, images):
    (tmp_path / "images").mkdir(exist_ok=True)
    for entry in images:
        (tmp_path / "images" / entry["filename"]).write_bytes(b"jpeg")
    path = tmp_path / "dataset_test.json"
    path.write_text(json.dumps({"dataset": "test", "images": images}))
    return path


def test_karpathy_splits_and_caption_text(tmp_path):
    path = _karpathy(tmp_path, [
        {"filename": "a.jpg", "imgid": 0, "split": "train", "sentences": [{"raw": "A dog.", "tokens": ["a", "dog"]}]},
        {"filename": "b.jpg", "imgid": 1, "split": "restval", "sentences": [{"tokens": ["a", "cat"]}]},
        {"filename": "c.jpg", "imgid": 2, "split": "val", "sentences": [{"raw": "A bird."}]},
        {"filename": "d.jpg", "imgid": 3, "split": "test", "sentences": [{"raw": "A fish."}]},
    ])
    dataset = load_dataset(f"karpathy:{path}")
    assert [len(dataset.split(s)) for s in ("train", "dev", "test")] == [2, 1, 1]
    assert dataset.split("train")[1].captions == ("a cat",)
    assert dataset.split("dev")[0].path == (tmp_path / "images" / "c.jpg").resolve()


@pytest.mark.parametrize(("images", "message"), [
    ([{"filename": "a.jpg", "split": "train"}], "no \"sentences\""),
    ([{"split": "train", "sentences": [{"raw": "x"}]}], "no \"filename\""),
    ([{"filename": "a.jpg", "split": "holdout", "sentences": [{"raw": "x"}]}], "split 'holdout'"),
])
def test_karpathy_missing_fields_name_the_file_and_image(tmp_path, images, message):
    path = tmp_path / "dataset.json"
    path.write_text(json.dumps({"images": images}))
    with pytest.raises(DataError, match=message) as err:
        read_karpathy(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_karpathy_bad_json_and_missing_images(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        read_karpathy(tmp_path / "bad.json")
    (tmp_path / "ok.json").write_text(json.dumps({"images": [{"filename": "x.jpg", "split": "train",
                                                              "sentences": [{"raw": "x"}]}]}))
    with pytest.raises(DataError, match="IMAGE_ROOT"):
        read_karpathy(tmp_path / "ok.json")


def test_coco_mini_reads_both_official_files(coco_mini_dir):
    root = coco_mini_dir
    dataset = read_coco(root)
    train, dev = dataset.split("train"), dataset.split("dev")
    assert (len(train), len(dev)) == (80, 79)
    assert all(r.path.is_file() and len(r.captions) >= 5 for r in train + dev)
    single = load_dataset(f"coco:{root / 'annotations' / 'captions_val2017.json'}")
    assert [r.image_id for r in single.split("dev")] == [r.image_id for r in dev]


def test_coco_missing_fields(tmp_path):
    (tmp_path / "captions_val2017.json").write_text(json.dumps({"images": []}))
    with pytest.raises(DataError, match="missing field 'annotations'"):
        read_coco(tmp_path / "captions_val2017.json")


def test_shapes_is_deterministic_by_seed(tmp_path):
    a = generate_shapes(tmp_path / "a", n_train=20, n_dev=4, n_test=4, seed=1)
    b = generate_shapes(tmp_path / "b", n_train=20, n_dev=4, n_test=4, seed=1)
    c = generate_shapes(tmp_path / "c", n_train=20, n_dev=4, n_test=4, seed=2)
    assert a.read_text() == b.read_text() != c.read_text()
    for image in sorted((tmp_path / "a" / "images").iterdir()):
        assert image.read_bytes() == (tmp_path / "b" / "images" / image.name).read_bytes()


def test_shapes_is_generated_once_and_captions_name_what_is_drawn(tmp_path):
    dataset = load_shapes(tmp_path, n_train=30, n_dev=5, n_test=5)
    json_file = next(tmp_path.glob("shapes-*/dataset_shapes.json"))
    stamp = json_file.stat().st_mtime_ns
    load_shapes(tmp_path, n_train=30, n_dev=5, n_test=5)
    assert json_file.stat().st_mtime_ns == stamp
    assert [len(dataset.split(s)) for s in ("train", "dev", "test")] == [30, 5, 5]
    for record in dataset.split("train"):
        assert len(record.captions) == 5 and len(set(record.captions)) == 5
        colours = [{w for w in c.split() if w in ("red", "green", "blue", "yellow", "purple", "orange")}
                   for c in record.captions]
        assert all(c == colours[0] for c in colours)
