import json

import numpy as np
import pytest
from PIL import Image

from edgecap.cider import CiderD, best_constant_cider
from edgecap.data import shapes
from edgecap.data.karpathy import read_karpathy
from edgecap.data.shapes import COLOURS, SHAPES, generate_shapes, load_shapes
from edgecap.errors import DataError
from edgecap.vocab import tokenize

SMALL = {"n_train": 40, "n_dev": 6, "n_test": 6}
RELATIONS = {"to the left of": (0, -1), "to the right of": (0, 1), "above": (1, -1), "below": (1, 1)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return read_karpathy(generate_shapes(tmp_path_factory.mktemp("shapes") / "seed0", **SMALL))


def _centroids(path) -> dict[str, np.ndarray]:
    """(x, y) centre of the pixels close to each named colour that covers a shape-sized area."""
    pixels = np.asarray(Image.open(path).convert("RGB")).astype(float)
    out = {}
    for name, rgb in COLOURS.items():
        ys, xs = np.nonzero(np.linalg.norm(pixels - rgb, axis=-1) < 30)
        if len(xs) >= 25:
            out[name] = np.array([xs.mean(), ys.mean()])
    return out


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a, b, c = (generate_shapes(tmp_path / name, n_train=12, n_dev=2, n_test=2, seed=seed)
               for name, seed in (("a", 1), ("b", 1), ("c", 2)))
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    images = sorted(p.name for p in (tmp_path / "a" / "images").iterdir())
    assert len(images) == 16
    for name in images:
        assert (tmp_path / "a" / "images" / name).read_bytes() == (tmp_path / "b" / "images" / name).read_bytes()
    assert any((tmp_path / "a" / "images" / n).read_bytes() != (tmp_path / "c" / "images" / n).read_bytes()
               for n in images)


def test_counts_per_split_and_five_distinct_captions(dataset):
    assert dataset.name == "shapes"
    assert {k: len(v) for k, v in dataset.splits.items()} == {"train": 40, "dev": 6, "test": 6}
    assert len({r.image_id for records in dataset.splits.values() for r in records}) == 52
    for record in dataset.split("train"):
        assert len(set(record.captions)) == 5
        assert all(" a a" not in c and not c.startswith("a o") for c in record.captions)  # "an orange"
        assert Image.open(record.path).size == (96, 96)


def test_captions_name_what_is_drawn_and_where(dataset):
    relations_checked = 0
    for record in dataset.split("train"):
        drawn = _centroids(record.path)
        for caption in record.captions:
            words = caption.split()
            colours = [w for w in words if w in COLOURS]
            assert set(colours) == set(drawn), (record.path, caption)  # every colour named, no other drawn
            assert 1 <= sum(w in SHAPES for w in words) <= 2
            phrase = next((p for p in RELATIONS if p in caption), None)
            if phrase and len(set(colours)) == 2:
                axis, sign = RELATIONS[phrase]
                subject, landmark = (drawn[c][axis] for c in colours)
                assert sign * (subject - landmark) > 15, (record.path, caption)
                relations_checked += 1
    assert relations_checked > 20


def test_best_constant_caption_scores_poorly_in_cider(dataset):
    """Learnable but not trivial: any one caption for every image is far below a human-like reference."""
    records = dataset.split("train")
    ids = [r.image_id for r in records]
    references = {r.image_id: [tokenize(c) for c in r.captions] for r in records}
    best_constant = best_constant_cider(references, sorted({tuple(w) for refs in references.values() for w in refs}))
    held_out = {i: refs[1:] for i, refs in references.items()}  # each image's first caption against the other four
    reference = CiderD(held_out).score(ids, [refs[0] for refs in references.values()]).mean()
    assert best_constant < 0.3 * reference, (best_constant, reference)


def test_generated_once_then_reused(tmp_path):
    json_path = generate_shapes(tmp_path / "s", **SMALL)
    stamp = json_path.stat().st_mtime_ns
    assert generate_shapes(tmp_path / "s", **SMALL) == json_path
    assert json_path.stat().st_mtime_ns == stamp
    assert json.loads(json_path.read_text())["params"]["seed"] == 0
    generate_shapes(tmp_path / "s", **{**SMALL, "n_train": 10})  # other parameters: replaced, not mixed
    assert len(list((tmp_path / "s" / "images").iterdir())) == 22
    assert [p.name for p in tmp_path.iterdir()] == ["s"]  # no staging folders left behind


def test_failed_generation_leaves_nothing(tmp_path, monkeypatch):
    def broken(rng, size):
        raise KeyboardInterrupt

    monkeypatch.setattr(shapes, "_scene", broken)
    with pytest.raises(KeyboardInterrupt):
        generate_shapes(tmp_path / "s", **SMALL)
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_replace_a_foreign_folder(tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(DataError, match="holds no dataset_shapes.json"):
        generate_shapes(tmp_path, **SMALL)
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_load_shapes_caches_under_edgecap_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGECAP_CACHE", str(tmp_path))
    dataset = load_shapes(seed=5, **SMALL)
    (folder,) = (tmp_path / "datasets").iterdir()
    assert folder.name == f"shapes-v{shapes.VERSION}-5-40-6-6-96"
    assert dataset.name == "shapes" and dataset.split("train")[0].path.parent == folder.resolve() / "images"
    other = load_shapes(tmp_path / "other", seed=5, **SMALL)  # an explicit cache folder, same content
    assert [r.captions for r in other.split("dev")] == [r.captions for r in dataset.split("dev")]
    assert other.split("dev")[0].path.is_relative_to((tmp_path / "other").resolve())
    with pytest.raises(TypeError):
        load_shapes(tmp_path, colours=3)
