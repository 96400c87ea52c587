"""Every odd image a user may have is read correctly or refused with one line naming the file."""

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgecap import preprocess
from edgecap.errors import ImageError
from edgecap.preprocess import Preprocessing, frame_to_array, load_image, load_images, read_rgb, to_array

PREP = Preprocessing(image_size=32)
SAMPLES = Path(preprocess.__file__).parent / "assets" / "samples"


def _gradient(w: int = 40, h: int = 30) -> np.ndarray:
    """uint8 (h, w, 3): red grows left to right, green top to bottom, blue constant."""
    red = np.broadcast_to(np.linspace(0, 255, w)[None, :], (h, w))
    green = np.broadcast_to(np.linspace(0, 255, h)[:, None], (h, w))
    return np.stack([red, green, np.full((h, w), 128.0)], axis=2).round().astype(np.uint8)


def _write_png16_rgb(path: Path, rgb: np.ndarray) -> None:
    """A 48-bit RGB PNG written by hand: Pillow cannot save one."""
    h, w, _ = rgb.shape
    rows = b"".join(b"\x00" + rgb[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
                     + chunk(b"IEND", b""))


def test_rgb_png_is_squashed_and_normalised_exactly(tmp_path):
    Image.new("RGB", (50, 20), (255, 0, 128)).save(tmp_path / "a.png")
    pixels = load_image(tmp_path / "a.png", PREP)
    assert pixels.shape == (3, 32, 32) and pixels.dtype == np.float32 and pixels.flags.c_contiguous
    expected = (np.array([255, 0, 128]) / 255 - np.array(PREP.mean)) / np.array(PREP.std)
    np.testing.assert_allclose(pixels[:, 5, 7], expected, atol=1e-5)


def test_image_already_at_size_is_not_resampled(tmp_path):
    """Training photos are pre-squashed to S x S: they must reach the encoder untouched."""
    rgb = _gradient(32, 32)
    Image.fromarray(rgb).save(tmp_path / "s.png")
    expected = ((rgb / 255 - np.array(PREP.mean)) / np.array(PREP.std)).transpose(2, 0, 1)
    np.testing.assert_allclose(load_image(tmp_path / "s.png", PREP), expected, atol=1e-5)


@pytest.mark.parametrize(("mode", "suffix"), [("L", "png"), ("P", "png"), ("RGBA", "png"), ("LA", "png"),
                                              ("CMYK", "jpg"), ("1", "png"), ("I", "tif"), ("F", "tif")])
def test_every_mode_becomes_rgb_of_the_same_size(tmp_path, mode, suffix):
    path = tmp_path / f"x.{suffix}"
    Image.fromarray(_gradient()).convert(mode).save(path)
    image = read_rgb(path)
    assert image.mode == "RGB" and image.size == (40, 30)
    assert np.asarray(image).std() > 20  # the gradient survived: not a flat black or white image


def test_grayscale_becomes_three_equal_channels(tmp_path):
    Image.fromarray(_gradient()).convert("L").save(tmp_path / "g.jpg")
    rgb = np.asarray(read_rgb(tmp_path / "g.jpg"))
    assert (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()


def test_cmyk_jpeg_keeps_its_colours(tmp_path):
    original = Image.fromarray(_gradient())
    original.convert("CMYK").save(tmp_path / "c.jpg", quality=95)
    assert Image.open(tmp_path / "c.jpg").mode == "CMYK"
    difference = np.abs(np.asarray(read_rgb(tmp_path / "c.jpg"), float) - np.asarray(original, float))
    assert difference.mean() < 6


def test_transparency_is_composited_onto_white(tmp_path):
    rgba = np.zeros((10, 10, 4), np.uint8)
    rgba[:, :5] = (0, 0, 255, 255)  # opaque blue left half, fully transparent black right half
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    rgb = np.asarray(read_rgb(tmp_path / "a.png"))
    assert (rgb[:, :5] == (0, 0, 255)).all() and (rgb[:, 5:] == 255).all()

    palette = Image.new("P", (10, 10), 0)
    palette.putpalette([0, 0, 0, 200, 10, 10])
    palette.paste(1, (0, 0, 5, 10))  # red left half; index 0 (black) is transparent
    palette.save(tmp_path / "p.png", transparency=0)
    rgb = np.asarray(read_rgb(tmp_path / "p.png"))
    assert (rgb[:, :5] == (200, 10, 10)).all() and (rgb[:, 5:] == 255).all()


def test_sixteen_bit_grayscale_is_stretched_by_its_range_not_clipped(tmp_path):
    values = np.linspace(1000, 1200, 40 * 30).reshape(30, 40).astype(np.uint16)  # would be black if clipped
    Image.fromarray(values).save(tmp_path / "d.png")
    assert Image.open(tmp_path / "d.png").mode.startswith("I")
    gray = np.asarray(read_rgb(tmp_path / "d.png"))[..., 0]
    assert gray.min() == 0 and gray.max() == 255
    assert load_image(tmp_path / "d.png", PREP).std() > 0.5


def test_float_tiff_ignores_nan_and_inf(tmp_path):
    values = np.linspace(-1.0, 1.0, 100, dtype=np.float32).reshape(10, 10)
    values[0, :3] = (np.nan, np.inf, -np.inf)
    Image.fromarray(values, "F").save(tmp_path / "f.tif")
    gray = np.asarray(read_rgb(tmp_path / "f.tif"))[..., 0]
    assert gray[0, :3].tolist() == [0, 0, 0] and gray[9, 9] == 255 and gray[5, 0] > 100


def test_sixteen_bit_rgb_png_reads_as_its_high_byte(tmp_path):
    rgb16 = (_gradient().astype(np.uint16) * 257)  # a full-range 16-bit photo
    _write_png16_rgb(tmp_path / "rgb16.png", rgb16)
    np.testing.assert_array_equal(np.asarray(read_rgb(tmp_path / "rgb16.png")), _gradient())


def test_one_bit_image_is_black_and_white(tmp_path):
    Image.fromarray(_gradient()).convert("1").save(tmp_path / "b.png")
    assert set(np.unique(np.asarray(read_rgb(tmp_path / "b.png")))) == {0, 255}


def test_exif_orientation_is_applied(tmp_path):
    original = Image.fromarray(_gradient(40, 30))
    exif = original.getexif()
    exif[0x0112] = 6  # stored sideways: viewers rotate it 90 degrees clockwise
    original.save(tmp_path / "r.jpg", exif=exif, quality=95)
    upright = read_rgb(tmp_path / "r.jpg")
    assert upright.size == (30, 40)
    expected = np.asarray(original.transpose(Image.Transpose.ROTATE_270), float)
    assert np.abs(np.asarray(upright, float) - expected).mean() < 4


@pytest.fixture(scope="module")
def huge_jpeg(tmp_path_factory) -> Path:
    """108 megapixels, above Pillow's DecompressionBombWarning threshold (89 MP); flat, so quick to encode."""
    path = tmp_path_factory.mktemp("huge") / "huge.jpg"
    Image.new("RGB", (12000, 9000), (10, 200, 30)).save(path, quality=50)
    return path


@pytest.mark.filterwarnings("error")
def test_huge_jpeg_is_decoded_at_reduced_scale_without_warnings(huge_jpeg):
    assert read_rgb(huge_jpeg, target_size=32).size == (1500, 1125)  # 1/8 scale, both sides still >= 32
    pixels = load_image(huge_jpeg, PREP)
    expected = (np.array([10, 200, 30]) / 255 - np.array(PREP.mean)) / np.array(PREP.std)
    assert pixels.shape == (3, 32, 32)
    np.testing.assert_allclose(pixels.mean(axis=(1, 2)), expected, atol=0.05)


def test_image_over_the_limit_is_refused_naming_its_size(tmp_path, monkeypatch):
    Image.new("RGB", (300, 200)).save(tmp_path / "big.png")
    monkeypatch.setattr(preprocess, "MAX_PIXELS", 50_000)
    with pytest.raises(ImageError, match=r"big\.png: 300x200 pixels .*downscale") as err:
        load_image(tmp_path / "big.png", PREP)
    assert "\n" not in str(err.value)


def test_pillow_decompression_bomb_error_becomes_an_image_error(tmp_path, monkeypatch):
    Image.new("RGB", (300, 200)).save(tmp_path / "bomb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)  # Pillow refuses above twice this, at open
    with pytest.raises(ImageError, match=r"bomb\.png: too large .*60000 pixels.*downscale"):
        load_image(tmp_path / "bomb.png", PREP)


def _truncated_jpeg(path: Path, keep: float) -> None:
    Image.fromarray(_gradient(200, 200)).save(path, format="JPEG")
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: None, "no such file; check the path"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b""), "empty file"),
    (lambda p: p.write_text("hello, not an image"), r"not an image PIL can read \(text file\); convert it"),
    (lambda p: p.write_bytes(b"\x00\x00\x00\x18ftypheic" + bytes(64)), r"not an image PIL can read \(HEIC container"),
    (lambda p: p.write_bytes(b"%PDF-1.7\n" + bytes(64)), r"\(PDF document\)"),
    (lambda p: p.write_bytes(bytes(range(64))), r"\(unknown binary format\)"),
    (lambda p: p.write_bytes(b"\xff\xd8\xff" + bytes(64)), r"damaged JPEG file .*; re-copy it"),
    (lambda p: _truncated_jpeg(p, 0.5), "damaged or truncated image"),
    (lambda p: _truncated_jpeg(p, 0.05), "damaged or truncated image"),
], ids=["missing", "directory", "empty", "text", "heic", "pdf", "binary", "jpeg-garbage", "truncated-data",
        "truncated-header"])
def test_bad_files_are_one_line_errors_naming_the_file(tmp_path, make, message):
    path = tmp_path / "photo.jpg"
    make(path)
    with pytest.raises(ImageError, match=message) as err:
        load_image(path, PREP)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_permission_denied_is_an_image_error(tmp_path, monkeypatch):
    path = tmp_path / "locked.jpg"
    Image.new("RGB", (8, 8)).save(path)

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)  # chmod cannot deny root, who may run the tests
    with pytest.raises(ImageError, match=r"locked\.jpg: permission denied"):
        read_rgb(path)


def test_load_images_stacks_a_batch_and_allows_none(tmp_path):
    for i, colour in enumerate([(0, 0, 0), (255, 255, 255)]):
        Image.new("RGB", (64, 48), colour).save(tmp_path / f"{i}.png")
    batch = load_images([tmp_path / "0.png", str(tmp_path / "1.png")], PREP)
    assert batch.shape == (2, 3, 32, 32) and batch.dtype == np.float32 and batch[0].max() < batch[1].min()
    assert load_images([], PREP).shape == (0, 3, 32, 32)


def test_shipped_sample_photos_load():
    batch = load_images(sorted(SAMPLES.glob("*.jpg")), Preprocessing())
    assert batch.shape[1:] == (3, 224, 224) and len(batch) >= 1 and np.isfinite(batch).all()


def test_to_array_accepts_any_mode():
    assert to_array(Image.new("L", (10, 10), 128), PREP).shape == (3, 32, 32)


def test_json_round_trip_and_validation():
    prep = Preprocessing(image_size=64, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert Preprocessing.from_json(prep.to_json()) == prep
    with pytest.raises(ValueError, match="image_size"):
        Preprocessing(image_size=0)
    with pytest.raises(ValueError, match="std"):
        Preprocessing(std=(0.2, 0.0, 0.2))


def test_load_images_keeps_order_across_threads_and_names_a_bad_file(tmp_path):
    paths = []
    for i in range(24):
        Image.new("RGB", (40, 30), (10 * i, 10 * i, 10 * i)).save(tmp_path / f"{i}.png")
        paths.append(tmp_path / f"{i}.png")
    batch = load_images(paths, PREP)
    assert (np.diff(batch[:, 0, 0, 0]) > 0).all()  # row i holds image i
    (tmp_path / "bad.jpg").write_text("not an image")
    with pytest.raises(ImageError, match=r"bad\.jpg: not an image"):
        load_images([*paths[:10], tmp_path / "bad.jpg", *paths[10:]], PREP)


def test_frames_in_memory_are_preprocessed_as_pil_images_are():
    rgb = _gradient()
    expected = to_array(Image.fromarray(rgb), PREP)
    np.testing.assert_array_equal(frame_to_array(rgb, PREP), expected)
    np.testing.assert_array_equal(frame_to_array(np.ascontiguousarray(rgb[..., ::-1])[..., ::-1], PREP), expected)
    np.testing.assert_array_equal(frame_to_array(Image.fromarray(rgb), PREP), expected)
    gray = frame_to_array(rgb[..., 0], PREP)
    assert gray.shape == (3, 32, 32) and np.allclose(gray[0] * 0.229 + 0.485, gray[1] * 0.224 + 0.456, atol=1e-5)
    clear = np.dstack([rgb, np.zeros(rgb.shape[:2], np.uint8)])  # fully transparent: white, as viewers show it
    np.testing.assert_allclose(frame_to_array(clear, PREP), to_array(Image.new("RGB", (40, 30), "white"), PREP))


@pytest.mark.parametrize("frame, message", [
    (_gradient().astype(np.float32) / 255, r"frame 7: expected a uint8 array .* got float32 \(30, 40, 3\); convert"),
    (np.zeros((30, 40, 2), np.uint8), r"got uint8 \(30, 40, 2\)"),
    (np.zeros((0, 40, 3), np.uint8), r"got uint8 \(0, 40, 3\)"),
    ("photo.jpg", r"frame 7: expected a PIL image or a numpy array, got str"),
])
def test_frames_that_are_not_pictures_are_one_line_errors(frame, message):
    with pytest.raises(ImageError, match=message):
        frame_to_array(frame, PREP, name="frame 7")
