"""Building upstream h3.c's own engine (the command `h3bridge build-engine SOURCE` is cli/build.py).

`build` (this package's build.py) turns an h3.c clone or source tarball into an `h3` program and a
shared libh3: on macOS with upstream's own `make` (and the dylib link of
`engines/library_build.py`); elsewhere by compiling upstream's unmodified C files against
`portable/`, h3bridge's host-memory stand-in for upstream's Metal, Foundation and Accelerate
layer, so that upstream's CLI, C API, validation, messages and phase order can run (and be
tested) on Linux. Built engines are cached by source hash under the user cache directory.
"""
from __future__ import annotations

from typing import Any

__all__ = ["BuiltEngine", "build_engine"]


def __getattr__(name: str) -> Any:
    # build.py (compilers, archives) loads on first use: messages that only need the pinned commit
    # (engine_build.record, imported wherever an engine is looked for) do not pay for it
    if name in __all__:
        from . import build
        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
