"""A command as the user can run it where the message appears (issue 30).

Every message that tells the user to run one of h3bridge's commands builds it here, so it runs as
shown: `h3bridge model download DIR` where the console scripts are installed and on PATH (a pip
install in an activated environment); otherwise the Python that runs h3bridge now with `-m`
(`/opt/comfy/venv/bin/python -m h3bridge model download DIR`), which is what a ComfyUI install
from `requirements.txt` has; and for a checkout loaded by path (ComfyUI's custom_nodes clone), whose
package no other Python can import, that Python with the checkout's folder (its `__main__.py`).

Nothing here runs a command: the result is text for a message, never given to a shell.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path

# console script -> the module `python -m` runs for it (pyproject.toml [project.scripts])
MODULE_OF_SCRIPT: dict[str, str] = {
    "h3bridge": "h3bridge",
    "h3-sim": "h3bridge.sim",
    "h3-sim-model": "h3bridge.sim.fixture_cli",
    "h3-sim-lib": "h3bridge.sim.library",
    "hf": "huggingface_hub.cli.hf",     # huggingface_hub's own command line (2.x; 0.x called it huggingface-cli)
}

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent     # the folder that holds the h3bridge package


def script_runs_here(script: str) -> bool:
    """True when `script` on PATH is the one installed beside this Python (so it runs this h3bridge).
    Not cached: PATH may change while a host runs (a cached answer made under another PATH named a
    command that did not run, or the long form where the short one runs)."""
    found = shutil.which(script)
    beside = Path(sys.executable).parent / script
    if found is None or not beside.is_file():
        return False
    try:
        return os.path.samefile(found, beside)
    except OSError:
        return False


@lru_cache(maxsize=None)
def _importable_by_any_python() -> bool:
    """True when the h3bridge package sits where this Python finds it without help (site-packages,
    or an editable install's path entry): `python -m h3bridge` then works from any folder."""
    install_dirs = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    if _PACKAGE_ROOT in install_dirs:
        return True
    # an editable install (pip install -e) leaves a .pth file naming the checkout
    for folder in install_dirs:
        try:
            for pth in folder.glob("*.pth"):
                if str(_PACKAGE_ROOT) in pth.read_text(encoding="utf-8", errors="replace").splitlines():
                    return True
                if "h3bridge" in pth.name and "__editable__" in pth.name:
                    return True
        except OSError:
            continue
    return False


def command_words(script: str, *arguments: str | os.PathLike[str]) -> list[str]:
    """The argument vector that runs `script arguments...` here (see the module docstring)."""
    words = [os.fspath(argument) for argument in arguments]
    if script_runs_here(script):
        return [script, *words]
    module = MODULE_OF_SCRIPT[script]
    if module.startswith("h3bridge") and not _importable_by_any_python() \
            and (_PACKAGE_ROOT / "__main__.py").is_file():
        # a checkout loaded by path: its root's __main__.py puts the checkout on sys.path first
        return [sys.executable, str(_PACKAGE_ROOT), *([] if module == "h3bridge" else ["--module", module]), *words]
    return [sys.executable, "-m", module, *words]


def command(script: str, *arguments: str | os.PathLike[str]) -> str:
    """`command_words` as one line to show (each word quoted as a POSIX shell needs it)."""
    return shlex.join(command_words(script, *arguments))


def h3bridge_command(*arguments: str | os.PathLike[str]) -> str:
    """`h3bridge ARGUMENTS` as the user can run it here."""
    return command("h3bridge", *arguments)


__all__ = ["MODULE_OF_SCRIPT", "command", "command_words", "h3bridge_command", "script_runs_here"]
