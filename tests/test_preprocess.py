import numpy as np
import pytest
from PIL import Image

from edgecap import preprocess
from edgecap.errors import ImageError
from edgecap.preprocess import Preprocessing, load_image, read_rgb

PREP = Preprocessing(image_size=32)


def _gradient(w=40, h=30):
    x = np.linspace(0, 255, w)[None, :, None]
    y = np.linspace(0, 255, h)[:, None, None]
    return np.concatenate([np.broadcast_to(x, (h, w, 1)), np.broadcast_to(y, (h, w, 1)),
                           np.full((h, w, 1), 128.0)], axis=2).astype(np.uint8)


def test_rgb_jpeg_is_squashed_and_normalised(tmp_path):
    Image.fromarray(_gradient()).save(tmp_path / "a.jpg")
    pixels = load_image(tmp_path / "a.jpg", PREP)
    assert pixels.shape == (3, 32, 32) and pixels.dtype == np.float32
    assert -2.2 < pixels.min() < pixels.max() < 2.7


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "LA", "CMYK", "1"])
def test_common_modes_become_rgb(tmp_path, mode):
    path = tmp_path / ("x.jpg" if mode == "CMYK" else "x.png")
    Image.fromarray(_gradient()).convert(mode).save(path)
    image = read_rgb(path)
    assert image.mode == "RGB" and image.size == (40, 30)


def test_cmyk_colours_survive(tmp_path):
    original = Image.fromarray(_gradient())
    original.convert("CMYK").save(tmp_path / "c.jpg", quality=95)
    assert np.abs(np.asarray(read_rgb(tmp_path / "c.jpg"), float) - np.asarray(original, float)).mean() < 8


def test_sixteen_bit_is_scaled_by_its_range_not_clipped(tmp_path):
    values = np.linspace(1000, 1200, 40 * 30).reshape(30, 40).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / "d.png")
    gray = np.asarray(read_rgb(tmp_path / "d.png"))[..., 0]
    assert gray.min() == 0 and gray.max() == 255


def test_float_tiff_and_transparent_palette(tmp_path):
    Image.fromarray(np.random.default_rng(0).random((20, 20)).astype(np.float32)).save(tmp_path / "f.tif")
    assert read_rgb(tmp_path / "f.tif").mode == "RGB"
    palette = Image.fromarray(_gradient()).convert("P")
    palette.info["transparency"] = 0
    palette.save(tmp_path / "p.png", transparency=0)
    assert read_rgb(tmp_path / "p.png").mode == "RGB"


def test_exif_orientation_is_applied(tmp_path):
    image = Image.fromarray(_gradient(40, 30))
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise on display
    image.save(tmp_path / "r.jpg", exif=exif)
    assert read_rgb(tmp_path / "r.jpg").size == (30, 40)


def test_huge_jpeg_is_read_cheaply(tmp_path):
    Image.new("RGB", (8000, 6000), (10, 200, 30)).save(tmp_path / "big.jpg", quality=50)
    pixels = load_image(tmp_path / "big.jpg", PREP)
    assert pixels.shape == (3, 32, 32)


def test_too_many_pixels_is_refused(tmp_path, monkeypatch):
    Image.new("RGB", (300, 300)).save(tmp_path / "big.png")
    monkeypatch.setattr(preprocess, "MAX_PIXELS", 50_000)
    with pytest.raises(ImageError, match="downscale"):
        read_rgb(tmp_path / "big.png")


def _truncated(path):
    Image.fromarray(_gradient(200, 200)).save(path)
    path.write_bytes(path.read_bytes()[:300])


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: None, "no such file"),
    (lambda p: p.mkdir(), "directory"),
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_text("hello, not an image"), "not an image"),
    (_truncated, "damaged"),
])
def test_bad_files_are_one_line_errors_naming_the_file(tmp_path, make, message):
    path = tmp_path / "photo.jpg"
    make(path)
    with pytest.raises(ImageError, match=message) as err:
        load_image(path, PREP)
    assert "photo.jpg" in str(err.value) and "\n" not in str(err.value)


def test_json_round_trip():
    assert Preprocessing.from_json(PREP.to_json()) == PREP
