"""Fixed views of a training photo, flipped or zoomed into a corner, that a frozen encoder caches once each.

Self-critical training fits its reward on the training photos far faster than that carries to new photos (on
Flickr8k the shipped SAT's sampled reward reached 100 against a dev CIDEr-D of 56): every view is another photo of
the same scene, with the same references ("left" and "right" swapped in a flipped one), that the decoder has not
yet learnt pixel by pixel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class View:
    name: str  # in the cache file's name and the progress bar
    mirrored: bool = False  # flipped left-right
    crop: tuple[float, float, float] | None = None  # (top, left, side) as fractions of the image side, scaled back up

    def apply(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels (N, 3, S, S) as preprocessed -> this view of them, the same shape."""
        if self.mirrored:
            pixels = pixels.flip(-1)
        if self.crop:
            size = pixels.shape[-1]
            top, left, side = (round(fraction * size) for fraction in self.crop)
            region = pixels[..., top:top + side, left:left + side]
            pixels = F.interpolate(region, size=(size, size), mode="bilinear", align_corners=False)
        return pixels

    def describe(self) -> dict:
        """What a feature cache key records of the view: nothing for the photo itself, so its caches keep their
        names (and ``mirrored`` alone for the flipped view, as its caches were keyed before crops existed)."""
        return {**({"mirrored": True} if self.mirrored else {}), **({"crop": list(self.crop)} if self.crop else {})}


MIRRORED = View("mirrored", mirrored=True)

ZOOM_SIDE = 0.8  # a corner crop keeps 64% of the photo's area, and with it the centre, where its subject mostly is
ZOOMED = tuple(View(f"zoomed-{corner}", crop=(top, left, ZOOM_SIDE))
               for corner, top, left in (("top-left", 0.0, 0.0), ("top-right", 0.0, 1 - ZOOM_SIDE),
                                         ("bottom-left", 1 - ZOOM_SIDE, 0.0),
                                         ("bottom-right", 1 - ZOOM_SIDE, 1 - ZOOM_SIDE)))
