"""Who holds the engine lock, as a waiter says it ("waiting for the engine: held by h3bridge serve
(process 4242 of user ana)"): the engine its holder recorded, the program that started it, its
process and user; never a prompt or another argument.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Callable

from ..progress import ProgressCallback, ProgressEvent, WAITING_PHASE
from .lock import EngineLock, recorded_process, _user_name, read_engine_record


# How often a waiter looks again at who holds the engine (it reads records and asks psutil).
HOLDER_REFRESH_SECONDS = 2.0


def describe_engine_holder(path: Path | None = None) -> str:
    """Who holds the engine, for a waiter to say: the running engine a holder recorded beside
    the lock (`record_engine`), as its program, the program that started it, its process and
    user; prompts and other arguments are never shown. A holder that
    has not started its engine yet (or keeps no record) is "another program"."""
    import psutil
    lock = EngineLock(path)
    for record_path in [lock._record_path, *lock._other_records()]:
        loaded = read_engine_record(record_path)
        if loaded is None:
            continue
        owner, record = loaded
        process = recorded_process(record, owner)
        if process is None:
            continue
        try:
            what = process.name()
            parent = process.parent()
            started_by = _program_words(parent) if parent is not None else None
        except psutil.Error:
            what, started_by = "an engine", None
        return (f"{what}" + (f" started by {started_by}" if started_by else "")
                + f" (process {record.pid} of user {_user_name(owner)})")
    return "another program (its engine has not started yet)"


def _program_words(process) -> str:
    """`h3bridge serve`, `main.py` (ComfyUI), or the program's name: what a user recognises,
    without the rest of its command line (a prompt is private)."""
    import psutil
    try:
        arguments = process.cmdline()
    except psutil.Error:
        arguments = []
    names = [os.path.basename(argument) for argument in arguments]
    for index, name in enumerate(names):
        if name == "h3bridge" or (name == "h3bridge.cli" and index and names[index - 1] == "-m"):
            following = [n for n in names[index + 1:] if not n.startswith("-")]
            return "h3bridge" + (f" {following[0]}" if following else "")
    if len(names) > 1 and names[0].startswith("python") and names[1].endswith(".py"):
        return names[1]
    try:
        return process.name()
    except psutil.Error:
        return "another program"


def waiting_reporter(on_progress: ProgressCallback | None,
                     path: Path | None = None) -> Callable[[float], None] | None:
    """An `on_wait` for lock.engine_lock that reports WAITING_PHASE through `on_progress`, with
    who holds the engine lock at `path` (default: the machine-wide one), looked at again every
    HOLDER_REFRESH_SECONDS."""
    if on_progress is None:
        return None
    holder: str | None = None
    read_at = -math.inf

    def report(waited: float) -> None:
        nonlocal holder, read_at
        now = time.monotonic()
        if now - read_at >= HOLDER_REFRESH_SECONDS:
            try:
                holder = describe_engine_holder(path)
            except Exception:  # noqa: BLE001 - who holds it is a courtesy; the wait goes on
                holder = None
            read_at = now
        on_progress(ProgressEvent(phase=WAITING_PHASE, done=0, total=0, fraction=0.0, elapsed=waited,
                                  detail=holder))
    return report


__all__ = ["HOLDER_REFRESH_SECONDS", "describe_engine_holder", "waiting_reporter"]
