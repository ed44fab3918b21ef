"""engines/groups.py all_stopped: what a pause's stop looks like for an engine's process group,
including the one state that is not `stopped` although nothing runs: a parent held in vfork by a
child the stop caught before its exec (Linux; Python's subprocess starts programs with vfork). The
fresh-clone CI once saw it: [(engine, 'disk-sleep'), (its child, 'stopped')] for a whole minute.

That state is made here on purpose, not waited for: a small C program vforks and its child stops
itself before its exec, so the parent is held exactly as in that run."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from h3bridge.engines.groups import all_stopped, live_group_members

HELD_IN_VFORK_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    pid_t child = vfork();
    if (child == 0) {
        raise(SIGSTOP);                 /* stopped before its exec: the parent stays in vfork */
        execl("/bin/true", "true", (char *)0);
        _exit(127);
    }
    int status;
    waitpid(child, &status, 0);
    return 0;
}
"""

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="vfork's hold is Linux's")


def _settle(condition, what: str, seconds: float = 60.0):
    """Poll a state that, once reached, stays (no race: nothing here changes it back)."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return value


@linux_only
def test_a_parent_held_in_vfork_by_its_stopped_child_counts_as_stopped(tmp_path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the vfork program")
    program = tmp_path / "held-in-vfork"
    source = tmp_path / "held-in-vfork.c"
    source.write_text(HELD_IN_VFORK_C)
    subprocess.run([compiler, "-o", str(program), str(source)], check=True, capture_output=True, timeout=120)
    parent = subprocess.Popen([str(program)], start_new_session=True)
    try:
        def held() -> list[psutil.Process] | None:
            members = [psutil.Process(pid) for pid in live_group_members(parent.pid)]
            states = sorted((member.pid == parent.pid, member.status()) for member in members)
            return members if states == [(False, psutil.STATUS_STOPPED), (True, psutil.STATUS_DISK_SLEEP)] else None

        members = _settle(held, "the vfork child never stopped with its parent held")
        child = next(member for member in members if member.pid != parent.pid)
        assert child.cmdline() == psutil.Process(parent.pid).cmdline()      # not exec'd: the parent's memory
        assert all_stopped(members)
        # the hold counts only with the stopped child in the group, and a running group is not stopped
        assert not all_stopped([psutil.Process(parent.pid)])
        assert not all_stopped([])
        os.kill(child.pid, signal.SIGCONT)       # the child execs /bin/true, the parent goes on and ends
        assert parent.wait(timeout=60) == 0
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()


@linux_only
def test_a_running_group_is_not_stopped_and_a_stopped_one_is() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        process = psutil.Process(sleeper.pid)
        assert not all_stopped([process])          # sleeping ("sleeping"): not a pause's stop
        os.killpg(sleeper.pid, signal.SIGSTOP)
        _settle(lambda: process.status() == psutil.STATUS_STOPPED, "the SIGSTOP never took effect")
        assert all_stopped([process])
    finally:
        os.killpg(sleeper.pid, signal.SIGKILL)
        sleeper.wait()
