"""Process groups: the engine child and everything it starts (FFmpeg) run in a group of their
own; these find its live members, say whether a pause has stopped them all, signal it, and stop
it (SIGTERM, then SIGKILL after a grace), waiting through waiting.wait_until. Used by process.py,
child.py and priority.py; imports nothing else of engines/.
"""
from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from .waiting import NOTHING, Deadline, wait_until

if TYPE_CHECKING:
    import psutil

TERMINATE_GRACE_SECONDS = 0.4


def signal_name(signum: int) -> str:
    """"SIGSEGV" for 11; "signal 40" for numbers Python has no name for (Linux real-time
    signals: `signal.Signals(40)` raises ValueError although 40 is a valid signal)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def live_group_members(pgid: int) -> list[int]:
    """PIDs in process group `pgid` that are still running (not zombies)."""
    import psutil

    members: list[int] = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (OSError, psutil.Error):
            continue
    return members


def all_stopped(processes: "list[psutil.Process]") -> bool:
    """Whether every one of `processes` (an engine's group) shows a pause's stop: stopped, or held
    in vfork by a child of its own that the stop caught before that child's exec.

    The second is Linux's: Python's subprocess (and glibc's posix_spawn) starts a program with
    vfork, whose parent waits, uninterruptibly ("disk-sleep", in kernel_clone), until the child
    execs. A SIGSTOP to the group in that moment stops the child first; the parent, blocked, cannot
    take its stop until the child goes on, and does nothing meanwhile: it is paused all the same,
    and SIGCONT continues both. (The child before its exec still shares its parent's memory, so it
    shows the parent's command line.) An empty list is not stopped."""
    import psutil

    if not processes:
        return False
    try:
        states = {process.pid: process.status() for process in processes}
        for process in processes:
            if states[process.pid] == psutil.STATUS_STOPPED:
                continue
            if states[process.pid] != psutil.STATUS_DISK_SLEEP:
                return False
            command = process.cmdline()
            if not any(states.get(child.pid) == psutil.STATUS_STOPPED and child.cmdline() == command
                       for child in process.children()):
                return False
    except psutil.Error:
        return False            # one just ended or changed: not a settled stop yet (ask again)
    return True


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` still runs.

    Members that already died but wait to be reaped (zombies: an orphaned FFmpeg is reaped
    by init, which can take a moment in containers) do not count.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(live_group_members(pgid))


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def terminate_group(pgid: int, grace: float = TERMINATE_GRACE_SECONDS) -> None:
    """SIGTERM the whole group, SIGKILL whatever still runs after `grace` seconds, and wait
    (at most a second more) until none of it runs. Works for groups that are not our children."""
    if not group_alive(pgid):
        return

    def gone(timeout: float, kill: bool = False) -> "bool | object":
        if not group_alive(pgid):
            return True
        if kill:
            signal_group(pgid, signal.SIGKILL)
        time.sleep(timeout)
        return NOTHING

    signal_group(pgid, signal.SIGTERM)
    # A paused group (SIGSTOP, engines/child.py) acts on SIGTERM only once continued.
    signal_group(pgid, signal.SIGCONT)
    if wait_until(gone, deadline=Deadline(grace), on_expired=lambda: False, interval=0.01):
        return
    wait_until(lambda timeout: gone(timeout, kill=True), deadline=Deadline(1.0), on_expired=lambda: False,
               interval=0.01)


__all__ = ["TERMINATE_GRACE_SECONDS", "group_alive", "live_group_members", "signal_group", "signal_name", "terminate_group"]
