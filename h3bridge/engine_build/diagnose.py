"""What a failed build of upstream h3.c means, told from the compiler's own words.

Known failures (upstream issues and pull requests at the pinned 8974cc0):
  - macOS SDK older than 26 (Xcode 16 / macOS 15 command line tools): h3_metal.m uses
    `MTLGPUFamilyMetal4`, which first appears in the macOS 26 SDK; the `@available(macOS 26.0, *)`
    guard is a run-time check and cannot hide a name the headers never declare (h3.c issue 66).
    The same SDKs also miss `SSIZE_MAX` in h3_ffmpeg.c (no `<limits.h>`). Both are fixed by the
    open pull request 59 ("Build against SDKs older than macOS 26": `<limits.h>`, and the probe
    gated on `__MAC_OS_X_VERSION_MAX_ALLOWED >= 260000`).
  - no active developer directory (`xcrun: error: invalid active developer path`): the command
    line tools are not installed.

clang says `use of undeclared identifier 'X'`, gcc `'X' undeclared` (with typographic quotes in a UTF-8
locale); both are recognised.
"""
from __future__ import annotations

import re
from pathlib import Path
from ..runnable import h3bridge_command

PR_59_PATCH = "https://github.com/antirez/h3.c/pull/59.diff"
_QUOTE = "['\u2018\u2019]"        # gcc quotes with U+2018/U+2019 in a UTF-8 locale
_UNDECLARED = r"(?:use of undeclared identifier {q}{name}{q}|{q}{name}{q} undeclared)"
_OLD_SDK = re.compile("|".join(_UNDECLARED.format(name=name, q=_QUOTE) for name in ("MTLGPUFamilyMetal4", "SSIZE_MAX")))
_NO_TOOLS = re.compile(r"xcrun: error: invalid active developer path")


def diagnose(output: str, source: Path) -> tuple[str, str] | None:
    """(what went wrong, what to do) for a known failure in `output`, else None."""
    if _OLD_SDK.search(output):
        name = "MTLGPUFamilyMetal4" if "MTLGPUFamilyMetal4" in output else "SSIZE_MAX"
        return (f"this Mac's SDK is older than macOS 26: `{name}` is undeclared (h3.c issue 66; upstream's "
                "h3_metal.m needs the macOS 26 SDK to compile)",
                "either install the macOS 26 SDK (Xcode 26 or its command line tools from Software Update; "
                "`xcrun --show-sdk-version` must say 26 or later), or apply upstream's open fix, pull request 59: "
                f"`curl -fsSL {PR_59_PATCH} | git -C {source} apply`; then run "
                f"`{h3bridge_command('build-engine', source)}` again")
    if _NO_TOOLS.search(output):
        return ("Apple's command line tools are not installed (xcrun has no developer directory)",
                f"install them with `xcode-select --install`, then run `{h3bridge_command('build-engine', source)}` again")
    return None
