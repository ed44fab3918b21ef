"""Background priority for the engine (`--background`, `serve --background`, the storyboard key
`background`, the ComfyUI input `background`): the engine yields the machine to whatever the user
does meanwhile, and renders at full speed when nothing else wants the cores.

- Linux: nice 19 (the lowest CPU priority) and the idle I/O class (its reads wait while anything
  else reads), applied to the engine's process right after it is spawned (process.py), so what it
  spawns (FFmpeg) inherits both. The engine leads a session of its own (process.py), and with the
  kernel's autogroup scheduling (sched_autogroup_enabled, on by default on desktop kernels) a
  process's nice only ranks it within its session's group: the group's own nice
  (/proc/PID/autogroup) is what ranks the engine against the user's programs, so it is set to 19 too
  (measured: without it, nice 19 alone left a competing job no faster; bench/bench_background.py).
- macOS: the background QoS band, setpriority(PRIO_DARWIN_PROCESS, pid, PRIO_DARWIN_BG): low CPU
  priority, throttled I/O and GPU, as `taskpolicy -b` does (used when setpriority is refused). This
  path cannot be exercised on the Linux machines the tests run on.
- elsewhere: nice 19 only.

The choice belongs to an engine, given where it is opened (engines/factory.py open_engine's
`background`, which the CLI's --background, ComfyUI's `background` input and the storyboard key all
reach): each child it spawns from then on is lowered as it starts (process.EngineProcess), and
turning it on for a warm engine whose child already runs lowers that child too (WarmEngine's
`background`). Lowering is one-way: an unprivileged process cannot raise a priority back, so a warm
child made background stays so until it is restarted.
"""
from __future__ import annotations

import os
import subprocess
import sys

# <sys/resource.h> on macOS; Python's os module has no names for them.
PRIO_DARWIN_PROCESS = 4
PRIO_DARWIN_BG = 0x1000
BACKGROUND_NICE = 19


def lower_group(pgid: int) -> str | None:
    """Lower every live process of group `pgid` (a warm engine's child and what it spawned) to
    background priority; what the leader got (None: the group is gone)."""
    from .groups import live_group_members
    given = None
    for pid in live_group_members(pgid):
        said = lower_to_background(pid)
        if pid == pgid:
            given = said
    return given


def platform_background() -> str:
    """What `--background` gives on this platform (doctor)."""
    if sys.platform == "darwin":
        return "macOS background QoS (PRIO_DARWIN_BG: low CPU priority, throttled I/O and GPU)"
    if sys.platform.startswith("linux"):
        return f"nice {BACKGROUND_NICE}, also for its autogroup, and the idle I/O priority class"
    return f"nice {BACKGROUND_NICE} (no I/O priority on this platform)"


def lower_to_background(pid: int) -> str:
    """Lower process `pid` to background priority; returns what the platform gave. A process that
    has already gone is no error (a one-shot engine that failed at once)."""
    if sys.platform == "darwin":
        return _darwin_background(pid)
    import psutil
    given = []
    try:
        process = psutil.Process(pid)
        process.nice(BACKGROUND_NICE)
        given.append(f"nice {BACKGROUND_NICE}")
        if _lower_autogroup(pid):
            given.append("its autogroup too")
        if hasattr(process, "ionice") and hasattr(psutil, "IOPRIO_CLASS_IDLE"):
            process.ionice(psutil.IOPRIO_CLASS_IDLE)
            given.append("idle I/O")
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "engine gone"
    except psutil.AccessDenied:
        given.append("(lowering refused)")
    return ", ".join(given)


def _lower_autogroup(pid: int) -> bool:
    """The nice of the scheduling autogroup of `pid`'s session, when `pid` leads it (an engine: its
    own session) and the kernel groups by session; True if set."""
    autogroup = f"/proc/{pid}/autogroup"
    try:
        if os.getsid(pid) != pid or not os.path.exists(autogroup):
            return False
        with open(autogroup, "w", encoding="ascii") as handle:
            handle.write(str(BACKGROUND_NICE))
        return True
    except OSError:         # no autogroup scheduling in this kernel, or not ours to set
        return False


def autogroup_nice(pid: int) -> int | None:
    """The nice of `pid`'s scheduling autogroup (None: no autogroups here)."""
    try:
        with open(f"/proc/{pid}/autogroup", encoding="ascii") as handle:
            return int(handle.read().rsplit("nice", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def _darwin_background(pid: int) -> str:
    try:
        os.setpriority(PRIO_DARWIN_PROCESS, pid, PRIO_DARWIN_BG)
        return "PRIO_DARWIN_BG"
    except ProcessLookupError:
        return "engine gone"
    except OSError:
        pass
    try:
        subprocess.run(["taskpolicy", "-b", "-p", str(pid)], check=True, capture_output=True, timeout=5)
        return "taskpolicy -b"
    except (OSError, subprocess.SubprocessError):
        os.setpriority(os.PRIO_PROCESS, pid, BACKGROUND_NICE)
        return f"nice {BACKGROUND_NICE}"


def probe_background() -> tuple[bool, str]:
    """Lower a short-lived child as an engine would be and read back what it got (doctor): whether
    background priority works here, and what it gives ("nice 19 ... and the idle I/O class")."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        given = lower_to_background(child.pid)
        if sys.platform == "darwin":
            return given != "engine gone", f"{given} ({platform_background()})"
        import psutil
        process = psutil.Process(child.pid)
        niceness = process.nice()
        io_class = process.ionice().ioclass if hasattr(process, "ionice") else None
        idle_io = io_class is not None and io_class == getattr(psutil, "IOPRIO_CLASS_IDLE", -1)
        group_nice = autogroup_nice(child.pid)
        ok = niceness == BACKGROUND_NICE and group_nice in (None, BACKGROUND_NICE)
        return ok, (f"nice {niceness}"
                    + ("" if group_nice is None else f" (its session's autogroup: nice {group_nice})")
                    + (" and the idle I/O class" if idle_io else " (no idle I/O class here)"))
    finally:
        child.kill()
        child.wait()
