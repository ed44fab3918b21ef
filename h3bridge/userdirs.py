"""Where h3bridge keeps its per-user files: the checksum cache, the engine lock, the warm session's home."""
from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE_ENV = "H3BRIDGE_CACHE_DIR"


def cache_dir() -> Path:
    """`$H3BRIDGE_CACHE_DIR`, else the platform's per-user cache directory + `h3bridge`."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "h3bridge"
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "h3bridge"
