"""What the bench scripts share (they run as `python bench/NAME.py`, so this folder is on sys.path)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path


def sim_path() -> str:
    """The h3-sim console script of the running Python (its venv first), else on PATH."""
    beside = Path(sys.executable).with_name("h3-sim")
    found = str(beside) if beside.exists() else shutil.which("h3-sim")
    if not found:
        sys.exit("h3-sim is not installed: pip install -e '.[test]'")
    return found
