import pytest

from edgecap.data import load_dataset
from edgecap.errors import DataError


def test_reads_the_shared_flickr8k(flickr8k_dir):
    dataset = load_dataset(f"flickr8k:{flickr8k_dir}")
    train, dev = dataset.split("train"), dataset.split("dev")
    assert (len(train), len(dev)) == (6000, 1000)
    assert all(len(r.captions) == 5 for r in dev)
    assert dev[0].path.is_file()
    assert not {r.image_id for r in train} & {r.image_id for r in dev}


def test_missing_split_names_the_available_ones(flickr8k_dir):
    with pytest.raises(DataError, match="available: train, dev"):
        load_dataset(f"flickr8k:{flickr8k_dir}").split("test")


def test_reads_original_layout_and_rejects_bad_lines(tmp_path):
    (tmp_path / "Flicker8k_Dataset").mkdir()
    (tmp_path / "Flicker8k_Dataset" / "1.jpg").write_bytes(b"")
    (tmp_path / "Flickr8k.token.txt").write_text("1.jpg#0\tA dog .\n1.jpg#1\tA brown dog\n")
    (tmp_path / "Flickr_8k.trainImages.txt").write_text("1.jpg\n")
    dataset = load_dataset(f"flickr8k:{tmp_path}")
    assert dataset.split("train")[0].captions == ("A dog .", "A brown dog")
    (tmp_path / "Flickr8k.token.txt").write_text("no tab here\n")
    with pytest.raises(DataError, match=r"Flickr8k.token.txt:1"):
        load_dataset(f"flickr8k:{tmp_path}")


@pytest.mark.parametrize("spec", ["nope:abc", "flickr8k:/does/not/exist", "flickr8k"])
def test_bad_specs_are_one_line_errors(spec):
    with pytest.raises(DataError) as err:
        load_dataset(spec)
    assert "\n" not in str(err.value)
