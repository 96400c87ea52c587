"""Image file -> normalised float32 CHW array: THE one preprocessing for training, calibration and the runtime.

numpy + pillow only (the torch-free runtime imports it). Every odd input a user
may have is either converted correctly (grayscale, palette, alpha, CMYK, 16-bit,
float, EXIF-rotated, very large) or refused with one line naming the file and the fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from edgecap.errors import ImageError

MAX_PIXELS = 200_000_000  # larger images are refused (decoding them needs GBs of memory)


@dataclass(frozen=True)
class Preprocessing:
    image_size: int = 224  # square side fed to the encoder (images are squashed, as the Flickr8k photos were)
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)  # ImageNet channel means (RGB, 0-1 scale)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)  # ImageNet channel standard deviations

    def to_json(self) -> dict:
        return {"image_size": self.image_size, "mean": list(self.mean), "std": list(self.std)}

    @classmethod
    def from_json(cls, data: dict) -> Preprocessing:
        return cls(int(data["image_size"]), tuple(data["mean"]), tuple(data["std"]))


def _to_8bit_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB 8-bit; high-bit-depth images are scaled by their actual range, not clipped."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        values = np.asarray(image, dtype=np.float64)
        low, high = float(values.min()), float(values.max())
        scaled = (values - low) / (high - low) * 255.0 if high > low else np.zeros_like(values)
        return Image.fromarray(scaled.round().astype(np.uint8), "L").convert("RGB")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def read_rgb(path: Path | str, *, target_size: int = 0) -> Image.Image:
    """Decode an image file to 8-bit RGB with EXIF orientation applied.

    ``target_size`` lets JPEG decoding shrink by a power of two first (``draft``),
    which makes huge photos cheap to read when only a small input is needed.
    """
    path = Path(path)
    if not path.exists():
        raise ImageError(f"{path}: no such file; check the path")
    if path.is_dir():
        raise ImageError(f"{path}: is a directory, not an image; pass image files")
    if path.stat().st_size == 0:
        raise ImageError(f"{path}: empty file; re-copy or re-download the image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(path)
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise ImageError(f"{path}: {width}x{height} pixels is larger than edgecap reads "
                                 f"({MAX_PIXELS // 1_000_000} megapixels); downscale it first")
            if target_size and image.format == "JPEG":
                image.draft("RGB", (target_size, target_size))
            image = ImageOps.exif_transpose(image)
            return _to_8bit_rgb(image)
    except PermissionError:
        raise ImageError(f"{path}: permission denied; make the file readable") from None
    except UnidentifiedImageError:
        raise ImageError(f"{path}: not an image PIL can read; convert it to JPEG or PNG") from None
    except Image.DecompressionBombError:
        raise ImageError(f"{path}: too many pixels to decode safely; downscale it first") from None
    except (OSError, SyntaxError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ImageError(f"{path}: damaged or unsupported image ({reason}); re-export it as JPEG or PNG") from None


def to_array(image: Image.Image, prep: Preprocessing) -> np.ndarray:
    """RGB image -> float32 (3, S, S), squashed to S x S and normalised."""
    resized = image.resize((prep.image_size, prep.image_size), Image.BILINEAR, reducing_gap=3.0)
    pixels = np.asarray(resized, dtype=np.float32) / 255.0
    pixels = (pixels - np.asarray(prep.mean, np.float32)) / np.asarray(prep.std, np.float32)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def load_image(path: Path | str, prep: Preprocessing) -> np.ndarray:
    """float32 (3, S, S) of one image file."""
    return to_array(read_rgb(path, target_size=prep.image_size), prep)


def load_images(paths: Sequence[Path | str], prep: Preprocessing) -> np.ndarray:
    """float32 (N, 3, S, S) of image files."""
    return np.stack([load_image(p, prep) for p in paths])

