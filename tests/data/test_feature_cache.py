"""The frozen-encoder feature cache under runs started side by side on the same photos."""

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from edgecap.data.shapes import generate_shapes

CACHING_RUN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    import edgecap.data.features as features
    from edgecap.config import EncoderConfig
    from edgecap.data import load_dataset
    from edgecap.preprocess import Preprocessing

    json_path, cache, go, ready = sys.argv[1:]
    records = load_dataset(f"karpathy:{json_path}").split("train")
    load_images = features.load_images
    features.load_images = lambda paths, prep: time.sleep(0.2) or load_images(paths, prep)  # a slow encoder
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.01)
    torch.manual_seed(0)
    cached = features.cached_features(records, EncoderConfig(name="small_cnn", image_size=64, channels=8),
                                      Preprocessing(image_size=64), directory=Path(cache), batch_size=2)
    print(float(abs(cached.astype("float32")).sum()))
""")


@pytest.mark.skipif(sys.platform == "win32", reason="the cache lock is POSIX advisory locking (fcntl)")
def test_two_runs_caching_the_same_photos_at_once_write_one_file_and_read_the_same_features(tmp_path):
    json_path = generate_shapes(tmp_path / "shapes", n_train=16, n_dev=2, n_test=0)
    cache, go = tmp_path / "cache", tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    runs = [subprocess.Popen([sys.executable, "-c", CACHING_RUN, str(json_path), str(cache), str(go), str(flag)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for flag in ready]
    deadline = time.time() + 120
    while not all(flag.exists() for flag in ready) and time.time() < deadline:
        time.sleep(0.05)
    go.touch()  # both start together; each needs 8 chunks of 0.2 s, so their caching overlaps
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert sum("waiting for another process" in err for _, err in outputs) == 1  # one wrote, the other waited
    assert outputs[0][0] == outputs[1][0]
    assert [p.suffix for p in cache.iterdir()] == [".npy"]  # no partial file, progress or lock left
    assert np.load(next(cache.glob("*.npy"))).shape[0] == 16
