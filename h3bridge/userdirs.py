"""Where h3bridge keeps its files: per user the checksum cache, logs and the warm session's home;
per machine the folder of the engine lock (`machine_dir`), which every account shares."""
from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE_ENV = "H3BRIDGE_CACHE_DIR"
MACHINE_DIR_ENV = "H3BRIDGE_MACHINE_DIR"


def cache_dir() -> Path:
    """`$H3BRIDGE_CACHE_DIR`, else `platform_cache_dir()`: checksums, logs, the session's home."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else platform_cache_dir()


def platform_cache_dir() -> Path:
    """The platform's per-user cache directory + `h3bridge`, whatever H3BRIDGE_CACHE_DIR says."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "h3bridge"
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "h3bridge"


def machine_dir() -> Path:
    """The folder every account on this machine shares for the engine lock (engines/lock.py): one pool
    of unified memory means one engine per machine, not per user or per HOME.

    `/Users/Shared/h3bridge` on macOS (/Users/Shared is the system's folder for all accounts,
    mode 1777, and is not swept like /tmp, whose periodic cleaning could delete a lock file in
    use); `/var/tmp/h3bridge` elsewhere (machine-wide, sticky, kept across reboots). Neither
    depends on HOME, XDG_CACHE_HOME or H3BRIDGE_CACHE_DIR. `$H3BRIDGE_MACHINE_DIR` replaces it
    (a test, or a machine whose shared folder lives elsewhere): every program that should
    share the engine must then set the same value."""
    override = os.environ.get(MACHINE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path("/Users/Shared/h3bridge") if sys.platform == "darwin" else Path("/var/tmp/h3bridge")
