"""Where h3bridge keeps its per-user files: the checksum cache, the engine lock, the warm session's home."""
from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE_ENV = "H3BRIDGE_CACHE_DIR"


def cache_dir() -> Path:
    """`$H3BRIDGE_CACHE_DIR`, else `platform_cache_dir()`: checksums, logs, the session's home."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else platform_cache_dir()


def platform_cache_dir() -> Path:
    """The platform's per-user cache directory + `h3bridge`, whatever H3BRIDGE_CACHE_DIR says.

    The engine lock lives here (only H3BRIDGE_LOCK_PATH moves it): two programs started with
    different cache directories must still find the same lock, or both would load the model."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "h3bridge"
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "h3bridge"
