"""Process groups: the engine child and everything it starts (FFmpeg) run in a group of their
own; these find its live members, signal it, and stop it (SIGTERM, then SIGKILL after a grace),
waiting through waiting.wait_until. Used by process.py, child.py and priority.py; imports nothing
else of engines/.
"""
from __future__ import annotations

import os
import signal
import time

from .waiting import NOTHING, Deadline, wait_until

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
