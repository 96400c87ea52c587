"""User-facing errors: one line that names the file and the fix.

The CLI prints ``error: <message>`` and exits with status 2 for these; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class EdgecapError(Exception):
    """Bad input from the user (a file, a flag, a dataset); never a bug."""

    exit_code = 2


class DataError(EdgecapError):
    """A dataset spec, annotation file or split that cannot be read."""


class ImageError(EdgecapError):
    """An image file that is missing, unreadable or not an image."""


class ModelError(EdgecapError):
    """A checkpoint, run directory or export directory that cannot be used."""


class BackendUnavailableError(EdgecapError):
    """A backend whose libraries or device this machine lacks (TensorRT, cuda-python, an NVIDIA GPU)."""
