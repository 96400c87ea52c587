import threading

import pytest
import torch

from edgecap.checkpoint import read_checkpoint, save_atomic
from edgecap.errors import ModelError


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "run" / "last.pt"
    save_atomic({"format": "edgecap-checkpoint/1", "x": torch.ones(2)}, path)
    save_atomic({"format": "edgecap-checkpoint/1", "x": torch.zeros(2)}, path)
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]
    assert read_checkpoint(path)["x"].sum() == 0


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    save_atomic({"format": "edgecap-checkpoint/1", "x": torch.ones(2)}, path)
    with pytest.raises(TypeError):
        save_atomic({"format": "edgecap-checkpoint/1", "x": threading.Lock()}, path)  # not picklable
    assert read_checkpoint(path)["x"].sum() == 2
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.parametrize(("content", "message"), [(b"", "not a readable checkpoint"),
                                                  (b"garbage", "not a readable checkpoint")])
def test_corrupt_checkpoint_is_a_one_line_error(tmp_path, content, message):
    (tmp_path / "best.pt").write_bytes(content)
    with pytest.raises(ModelError, match=message) as err:
        read_checkpoint(tmp_path)
    assert "\n" not in str(err.value)


def test_other_format_and_missing_file(tmp_path):
    torch.save({"format": "something/9"}, tmp_path / "x.pt")
    with pytest.raises(ModelError, match="something/9"):
        read_checkpoint(tmp_path / "x.pt")
    with pytest.raises(ModelError, match="no checkpoint"):
        read_checkpoint(tmp_path / "missing")
