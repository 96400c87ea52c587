"""Where generated datasets and feature caches live: ``$EDGECAP_CACHE`` or ``~/.cache/edgecap``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("EDGECAP_CACHE", Path.home() / ".cache" / "edgecap"))
