"""A static KV cache bounds the caption length: export refuses a max length the cache cannot hold."""

from pathlib import Path

import numpy as np
import pytest

from edgecap.checkpoint import LoadedModel
from edgecap.config import EncoderConfig
from edgecap.errors import EdgecapError
from edgecap.export.onnx import export_onnx
from edgecap.models import build_model
from edgecap.models.caption_model import CaptionModel
from edgecap.models.encoder import build_encoder
from edgecap.preprocess import Preprocessing
from edgecap.vocab import SPECIALS, Vocab


def test_export_refuses_a_max_length_past_the_kv_cache(tmp_path):
    encoder_config = EncoderConfig(name="small_cnn", image_size=64, channels=8)
    decoder = build_model("a2", {"vocab_size": 10, "feature_dim": 8, "num_locations": 16, "d_model": 16, "heads": 2,
                                 "layers": 1, "ff_dim": 16, "max_positions": 12})
    loaded = LoadedModel(CaptionModel(build_encoder(encoder_config), decoder), "a2", Vocab(SPECIALS + ("a",) * 6),
                         Preprocessing(image_size=64), encoder_config, Path("unused.pt"), {})
    with pytest.raises(EdgecapError, match=r"max_length 12 needs decoding steps 0\.\.12 .* KV cache holds 12"):
        export_onnx(loaded, tmp_path / "exp", real_pixels=np.zeros((1, 3, 64, 64), np.float32), max_length=12)
    assert not (tmp_path / "exp").exists()
