"""Image file -> normalised float32 CHW array: THE one preprocessing for training, calibration and the runtime.

numpy + pillow only (the torch-free runtime imports it). Every odd input a user
may have is either converted correctly (grayscale, palette, alpha, CMYK, 16-bit,
float, 1-bit, EXIF-rotated, very large) or refused with an ImageError of one line
naming the file and the fix.

Decisions:
- Images are squashed to S x S (no crop): the shared Flickr8k photos were squashed
  to 224 x 224, and training and inference must see the same geometry.
- Truncated files are refused (Pillow's default), not padded with grey: a half-grey
  photo would silently yield a wrong caption or poison training and calibration data.
- 16-bit and float grayscale is stretched by its actual range, since scientific and
  depth images often use a small part of the range and would otherwise read as black.
  Pillow reads 16-bit RGB PNGs by their high byte, which is the right 8-bit value
  for a photo that uses the range.
- Embedded ICC profiles are not applied: Pillow's CMYK conversion (which honours
  Adobe's inverted CMYK) is close enough for captioning and needs no colour engine.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from edgecap.errors import ImageError

SAMPLE_IMAGES = Path(__file__).resolve().parent / "assets" / "samples"  # bundled photos: demo, export check, bench

# Larger images are refused. 150 MP covers 100-megapixel cameras; a non-JPEG this big already
# needs ~0.5 GB per decoded copy (JPEGs are decoded at 1/2-1/8 scale and stay cheap).
# Above 2 * PIL.Image.MAX_IMAGE_PIXELS (~179 MP) Pillow itself refuses before the size is known.
MAX_PIXELS = 150_000_000

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")  # what a folder offers
_HIGH_DEPTH_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")
_ALPHA_MODES = ("RGBA", "LA", "PA")
_SIGNATURES = {b"\xff\xd8\xff": "JPEG", b"\x89PNG": "PNG", b"GIF8": "GIF"}  # distinctive enough to trust


@dataclass(frozen=True)
class Preprocessing:
    image_size: int = 224  # square side fed to the encoder (images are squashed, as the Flickr8k photos were)
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)  # ImageNet channel means (RGB, 0-1 scale)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)  # ImageNet channel standard deviations

    def __post_init__(self) -> None:
        if self.image_size < 1:
            raise ValueError(f"image_size must be positive, got {self.image_size}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"mean and std need 3 values each and std > 0, got mean={self.mean} std={self.std}")

    def to_json(self) -> dict:
        return {"image_size": self.image_size, "mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_json(cls, data: dict) -> Preprocessing:
        return cls(image_size=int(data["image_size"]), mean=tuple(float(v) for v in data["mean"]),
                   std=tuple(float(v) for v in data["std"]))


def _stretch_to_8bit(image: Image.Image) -> Image.Image:
    """16-bit / 32-bit / float grayscale -> L, scaled by the finite value range (NaN and inf become black)."""
    values = np.asarray(image, dtype=np.float32)
    finite = np.isfinite(values)
    gray = np.zeros(values.shape, np.uint8)
    if finite.any():
        low, high = float(values[finite].min()), float(values[finite].max())
        scale = 255.0 / (high - low) if high > low else 0.0
        gray[finite] = np.rint((values[finite] - low) * scale).astype(np.uint8)
    return Image.fromarray(gray, "L")


def _to_8bit_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode -> a new 8-bit RGB image; transparency is composited onto white, as viewers show it."""
    if image.mode in _HIGH_DEPTH_MODES:
        return _stretch_to_8bit(image).convert("RGB")
    if image.mode in _ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _unidentified_message(name: Path | str, head: bytes) -> str:
    """The error for data Pillow cannot identify (``head``: its first 16 bytes): say what it looks like, so the fix
    fits the file."""
    for signature, kind in _SIGNATURES.items():
        if head.startswith(signature):
            return f"{name}: damaged {kind} file (its header cannot be parsed); re-copy it or re-export it"
    if head[4:8] == b"ftyp":  # ISO media: HEIC from phones, AVIF without Pillow support, MP4
        what = f"{head[8:12].decode('ascii', 'replace').strip().upper()} container"
    elif head.startswith(b"%PDF"):
        what = "PDF document"
    else:
        what = "unknown binary format" if b"\x00" in head else "text file"
    return f"{name}: not an image PIL can read ({what}); convert it to JPEG or PNG"


def _refuse_oversize(name: Path | str, image: Image.Image) -> None:
    """An ImageError naming ``name`` when ``image`` has more pixels than edgecap decodes (``MAX_PIXELS``)."""
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise ImageError(f"{name}: {width}x{height} pixels is over edgecap's limit of {MAX_PIXELS / 1e6:g} "
                         "megapixels; downscale it (e.g. to 4000 px wide) first")


def _decode(name: Path | str, image: Image.Image, target_size: int | None) -> Image.Image:
    """An opened file -> a new 8-bit RGB image (so the file may be closed), upright, size checked first."""
    _refuse_oversize(name, image)
    if target_size:
        image.draft("RGB", (target_size, target_size))  # no-op for formats other than JPEG
    ImageOps.exif_transpose(image, in_place=True)
    return _to_8bit_rgb(image)


def read_rgb(path: Path | str, *, target_size: int | None = None) -> Image.Image:
    """Decode an image file to 8-bit RGB with EXIF orientation applied; raise ImageError for anything unusable.

    ``target_size`` lets JPEG decoding shrink by a power of two first (``draft``), keeping
    both sides >= target_size, so huge photos are cheap when only a small input is needed.
    """
    path = Path(path)
    try:
        if path.is_dir():
            raise ImageError(f"{path}: is a directory, not an image; pass image files")
        with path.open("rb") as f:
            head = f.read(16)
            if not head:
                raise ImageError(f"{path}: empty file; re-copy or re-download the image")
            f.seek(0)
            return _open_rgb(path, f, head, target_size)
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file; check the path") from None
    except PermissionError:
        raise ImageError(f"{path}: permission denied; make the file readable (chmod +r)") from None


def decode_rgb(data: bytes, name: str, *, target_size: int | None = None) -> Image.Image:
    """``read_rgb`` of an encoded image already in memory (a request's body); ``name`` labels errors."""
    if not data:
        raise ImageError(f"{name}: empty image; send the bytes of a JPEG, PNG or WebP file")
    return _open_rgb(name, io.BytesIO(data), data[:16], target_size)


def _open_rgb(name: Path | str, source: BinaryIO, head: bytes, target_size: int | None) -> Image.Image:
    try:
        # edgecap applies its own MAX_PIXELS, so Pillow's softer warning below ~179 MP is noise.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(source) as image:
                return _decode(name, image, target_size)
    except UnidentifiedImageError:
        raise ImageError(_unidentified_message(name, head)) from None
    except Image.DecompressionBombError as err:
        reason = str(err).rstrip(".")
        raise ImageError(f"{name}: too large to decode safely ({reason}); downscale it first") from None
    except (OSError, SyntaxError, ValueError, EOFError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ImageError(f"{name}: damaged or truncated image ({reason}); re-copy it or re-export it "
                         "as JPEG or PNG") from None


def to_array(image: Image.Image, prep: Preprocessing) -> np.ndarray:
    """PIL image -> float32 (3, S, S): squashed to S x S with bilinear filtering and normalised."""
    if image.mode != "RGB":
        image = _to_8bit_rgb(image)
    # reducing_gap first box-reduces by an integer factor: much faster on large images, same look.
    resized = image.resize((prep.image_size, prep.image_size), Image.Resampling.BILINEAR, reducing_gap=3.0)
    pixels = np.asarray(resized, dtype=np.float32) / 255.0
    pixels = (pixels - np.asarray(prep.mean, np.float32)) / np.asarray(prep.std, np.float32)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def frame_to_array(frame: Image.Image | np.ndarray, prep: Preprocessing, *, name: str = "frame") -> np.ndarray:
    """float32 (3, S, S) of a picture already in memory: a PIL image, or a uint8 array (H, W), (H, W, 3) RGB or
    (H, W, 4) RGBA, e.g. a camera or video frame. Resized and normalised as files are; ``name`` labels errors."""
    if isinstance(frame, np.ndarray):
        shape_ok = frame.ndim == 2 or (frame.ndim == 3 and frame.shape[2] in (3, 4))
        if frame.dtype != np.uint8 or not shape_ok or 0 in frame.shape:
            raise ImageError(f"{name}: expected a uint8 array (H, W), (H, W, 3) RGB or (H, W, 4) RGBA, got "
                             f"{frame.dtype} {frame.shape}; convert 0-1 floats with (x * 255).round().astype('uint8'), "
                             "BGR frames (OpenCV) with x[..., ::-1]")
        frame = Image.fromarray(np.ascontiguousarray(frame))
    elif not isinstance(frame, Image.Image):
        raise ImageError(f"{name}: expected a PIL image or a numpy array, got {type(frame).__name__}")
    _refuse_oversize(name, frame)
    return to_array(frame, prep)


def image_files(paths: Sequence[Path]) -> list[Path]:
    """The files to caption: a folder stands for the image files directly inside it, sorted by name."""
    files = []
    for path in paths:
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not found:
            raise ImageError(f"{path}: folder with no image files ({' '.join(IMAGE_SUFFIXES)}); pass image files "
                             "or a folder that holds some")
        files += found
    return files


def load_image(path: Path | str, prep: Preprocessing) -> np.ndarray:
    """float32 (3, S, S) of one image file."""
    return to_array(read_rgb(path, target_size=prep.image_size), prep)


def load_image_bytes(data: bytes, name: str, prep: Preprocessing) -> np.ndarray:
    """float32 (3, S, S) of an encoded image in memory (a request's body); ``name`` labels errors."""
    return to_array(decode_rgb(data, name, target_size=prep.image_size), prep)


def load_images(paths: Sequence[Path | str], prep: Preprocessing) -> np.ndarray:
    """float32 (N, 3, S, S) of image files (N may be 0), decoded on up to 8 threads.

    Pillow releases the GIL while it decodes and resizes, so threads keep a GPU that
    trains the encoder fed; the first unreadable file's ImageError is raised.
    """
    batch = np.empty((len(paths), 3, prep.image_size, prep.image_size), np.float32)

    def fill(i: int) -> None:
        batch[i] = load_image(paths[i], prep)

    workers = min(8, os.cpu_count() or 1, len(paths))
    if workers <= 1:
        for i in range(len(paths)):
            fill(i)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(fill, range(len(paths))))
    return batch
