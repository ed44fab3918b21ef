"""The machine-wide engine lock between real accounts (engines/lock.py): two unprivileged uids
share one machine folder, as two people on one Mac do. Needs root, to start processes as other
uids; skipped otherwise."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

import h3bridge
from h3bridge.engines.lock import LOCK_PATH_ENV
from h3bridge.userdirs import MACHINE_DIR_ENV

REPOSITORY = Path(h3bridge.__file__).resolve().parent.parent
# The stand-in engines of this file: `sleep` with this argument, each leading its own process
# group as h3 does, so the process table tells exactly how many run. The fraction is this test
# process's pid: a suite run in parallel (pytest-xdist) or a second checkout's suite on the same
# machine has stand-ins of its own, which this file must neither count nor kill.
ENGINE_MARK = f"86399.{os.getpid()}"
# Everything here ends within seconds; a job not done after this is stuck (the deadlock).
JOB_BOUND = 60.0


def _free_uids(count: int) -> list[int]:
    """Uids no account and no process uses: accounts of their own for this test."""
    used = {entry.pw_uid for entry in pwd.getpwall()}
    used |= {process.info["uids"].real for process in psutil.process_iter(["uids"]) if process.info["uids"]}
    return [uid for uid in range(23000, 24000) if uid not in used][:count]


def _child_environment(shared: Path) -> dict[str, str]:
    import site
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(
                [str(REPOSITORY), *site.getsitepackages()]),
            "HOME": str(shared), MACHINE_DIR_ENV: str(shared / "machine"), "PYTHONDONTWRITEBYTECODE": "1"}


def _interpreter_for(uid: int, shared: Path) -> str | None:
    """A Python another account can run that imports h3bridge (this one may live in a private HOME)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), f"/usr/bin/{version}",
                  f"/usr/local/bin/{version}", shutil.which(version) or ""]
    for candidate in dict.fromkeys(filter(None, candidates)):
        try:
            done = subprocess.run([candidate, "-c", "import h3bridge.engines.lock, psutil, filelock"],
                                  user=uid, group=uid, extra_groups=[], env=_child_environment(shared),
                                  cwd=shared, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return candidate
    return None


class Accounts:
    """Two accounts (uids without a name) and a folder both can use, holding the machine folder."""

    def __init__(self, shared: Path, uids: list[int], python: str) -> None:
        self.shared, self.uids, self.python = shared, uids, python
        self.log = shared / "log.txt"
        self.log.touch()
        os.chmod(self.log, 0o666)
        self.children: list[subprocess.Popen] = []

    def run(self, uid: int, script: str, *args: str) -> subprocess.Popen:
        child = subprocess.Popen([self.python, "-c", script, *args], user=uid, group=uid, extra_groups=[],
                                 env=_child_environment(self.shared), cwd=self.shared,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.children.append(child)
        return child

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def wait_for_line(self, line: str, timeout: float = JOB_BOUND) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if line in self.lines():
                return
            failed = [child for child in self.children if child.poll() not in (None, 0)]
            if failed:
                raise AssertionError(f"waiting for {line!r}, a child failed: {failed[0].stdout.read()}")
            time.sleep(0.02)
        raise AssertionError(f"{line!r} never came; the log: {self.lines()}")


@pytest.fixture
def accounts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Accounts]:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("starting processes as other accounts needs root")
    uids = _free_uids(2)
    shared = Path(tempfile.mkdtemp(prefix="h3b-accounts-"))
    os.chmod(shared, 0o1777)      # like /var/tmp, where the machine folder goes
    python = _interpreter_for(uids[0], shared) if len(uids) == 2 else None
    if python is None:
        shutil.rmtree(shared)
        pytest.skip("no Python interpreter other accounts can run h3bridge with")
    # This test process may look at the lock too: the same machine folder, no private lock file.
    monkeypatch.delenv(LOCK_PATH_ENV, raising=False)
    monkeypatch.setenv(MACHINE_DIR_ENV, str(shared / "machine"))
    made = Accounts(shared, uids, python)
    try:
        yield made
    finally:
        for child in made.children:
            child.kill()
            child.wait(10)
        for process in _engines():
            process.kill()
        shutil.rmtree(shared, ignore_errors=True)


def _engines() -> list[psutil.Process]:
    """The stand-in engines running now (zombies do not count: they hold no memory)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["cmdline"] == ["sleep", ENGINE_MARK] and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


# A job of one account: take the machine's lock, start an engine (its own process group), record
# it, render a little, stop it. As "orphan", it never ends: the test kills it, leaving its engine.
_JOB = textwrap.dedent(f"""
    import subprocess, sys, time
    from h3bridge.engines.lock import engine_lock
    name, log, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    def note(text):
        with open(log, "a") as handle:
            handle.write(f"{{name}} {{text}}\\n")
    waited = []
    def on_wait(seconds):
        if not waited:
            waited.append(seconds)
            note("waiting")
    with engine_lock(on_wait=on_wait, poll_interval=0.02) as lock:
        engine = subprocess.Popen(["sleep", "{ENGINE_MARK}"], start_new_session=True, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lock.record_engine(engine.pid)
        note("running")
        if mode == "orphan":
            time.sleep(3600)
        time.sleep(0.3)
        engine.kill()
        engine.wait()
        lock.clear_engine()
    note("done")
""")


def _orphan(accounts: Accounts, uid: int, *, before_it_dies=None) -> psutil.Process:
    """Account `uid`'s host dies while its engine runs: the engine, left behind, still holds the
    machine; the kernel freed the lock with the host. `before_it_dies` runs while the host lives."""
    host = accounts.run(uid, _JOB, "orphan-host", str(accounts.log), "orphan")
    accounts.wait_for_line("orphan-host running")
    [engine] = _engines()
    if before_it_dies is not None:
        before_it_dies()
    host.send_signal(signal.SIGKILL)
    host.wait(10)
    accounts.children.remove(host)      # killed on purpose
    assert engine.is_running() and engine.status() != psutil.STATUS_ZOMBIE
    return engine


ORDERS = ["other-waiting-when-the-host-dies", "other-then-owner", "owner-then-other", "both-at-once"]


@pytest.mark.parametrize("order", ORDERS)
def test_two_accounts_and_an_orphan_never_deadlock_nor_run_two_engines(accounts: Accounts, order: str) -> None:
    """Account A's host dies while its engine runs. Another account's job cannot stop that engine
    (it is A's), and must not keep the lock while it waits for it: A's next job, the only one that
    may stop it, needs the lock. In every order of arrival both jobs finish, and sampling the
    process table every 50 ms never finds two engines."""
    owner, other = accounts.uids
    jobs: dict[str, subprocess.Popen] = {}

    def start(name: str, uid: int) -> None:
        jobs[name] = accounts.run(uid, _JOB, name, str(accounts.log), "job")

    if order == "other-waiting-when-the-host-dies":
        orphan = _orphan(accounts, owner, before_it_dies=lambda: (start("other", other),
                                                                  accounts.wait_for_line("other waiting")))
        start("owner", owner)
    elif order == "other-then-owner":
        orphan = _orphan(accounts, owner)
        start("other", other)
        accounts.wait_for_line("other waiting")
        start("owner", owner)
    elif order == "owner-then-other":
        orphan = _orphan(accounts, owner)
        start("owner", owner)
        accounts.wait_for_line("owner running")
        start("other", other)
    else:
        orphan = _orphan(accounts, owner)
        start("owner", owner)
        start("other", other)
    most = 0
    deadline = time.monotonic() + JOB_BOUND
    while any(job.poll() is None for job in jobs.values()) and time.monotonic() < deadline:
        most = max(most, len(_engines()))
        time.sleep(0.05)
    outputs = {name: job.stdout.read() if job.poll() is not None else "(still running)" for name, job in jobs.items()}
    assert all(job.poll() == 0 for job in jobs.values()), f"jobs stuck or failed: {outputs}; log {accounts.lines()}"
    assert most == 1, f"{most} engines ran at once"
    assert not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE
    lines = accounts.lines()
    assert "owner done" in lines and "other done" in lines
    # The orphan's owner stopped it (the other account has no right to), before any job's engine ran.
    assert lines.index("owner running") < lines.index("other running")


def test_another_accounts_live_engine_is_waited_for_not_killed_and_the_wait_is_cancellable(
        accounts: Accounts) -> None:
    """While the orphan runs, the other account's job waits, reporting, naming it in the log,
    without the lock (anyone may take it meanwhile), and a cancel ends that wait."""
    owner, other = accounts.uids
    orphan = _orphan(accounts, owner)
    script = textwrap.dedent("""
        import logging, sys
        from h3bridge.cancel import CancelToken
        from h3bridge.errors import GenerationCancelled
        from h3bridge.engines.lock import EngineLock, engine_lock
        logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
        token, waits = CancelToken(), []
        def on_wait(seconds):
            waits.append(seconds)
            if len(waits) == 5:
                probe = EngineLock()            # the lock is free while this job waits
                if probe._try_acquire(timeout=1):
                    print("lock was free")
                probe.release()
                token.cancel()
        try:
            with engine_lock(cancel=token, on_wait=on_wait, poll_interval=0.02):
                print("ran beside the orphan")
        except GenerationCancelled as error:
            print("cancelled:", error)
    """)
    job = accounts.run(other, script)
    output = job.communicate(timeout=JOB_BOUND)[0]
    assert job.returncode == 0, output
    assert "lock was free" in output and "cancelled: cancelled while waiting for the engine" in output
    assert "ran beside the orphan" not in output
    assert f"waiting for the engine of user uid {owner} (process {orphan.pid})" in output
    assert orphan.is_running() and orphan.status() != psutil.STATUS_ZOMBIE     # not theirs to stop


# ----------------------------------------------------------------------------- squatting a record's name

_RECORD_PATHS = textwrap.dedent("""
    from h3bridge.engines.lock import EngineLock
    lock = EngineLock()
    print(lock._record_path)
    print(lock._record_path.parent)
    print(lock.path.parent)
""")

_SQUAT = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from h3bridge.engines.lock import engine_lock
    with engine_lock():      # the machine folder exists, as after anyone's first job
        pass
    target, form, shared = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    if form == "file":
        target.write_text("{}")
        os.chmod(target, 0o666)
    elif form == "folder":
        target.mkdir()
        os.chmod(target, 0o777)
    else:
        mine = shared / "squatter-folder"
        mine.mkdir(mode=0o777)
        os.chmod(mine, 0o777)
        target.symlink_to(mine)
    print("squatted", target)
""")


# The job, exiting 3 with the message and its fix when h3bridge refuses with an EngineError.
_GUARDED_JOB = textwrap.dedent("""
    import sys
    from h3bridge.errors import EngineError
    try:
        exec(compile(sys.argv.pop(1), "job", "exec"))
    except EngineError as error:
        print(error.message)
        print("fix:", error.hint)
        sys.exit(3)
""")


@pytest.mark.parametrize("form", ["file", "folder", "symlink"])
def test_a_record_name_another_account_took_is_a_clear_error_before_any_engine(accounts: Accounts,
                                                                              form: str) -> None:
    """In the shared sticky folder another account can create the name of this account's engine
    record first. The job must not run an engine nobody could find after a crash: it stops with
    an EngineError naming the file and the fix, before its engine starts."""
    owner, squatter = accounts.uids
    paths = accounts.run(owner, _RECORD_PATHS)
    record, folder, machine = paths.communicate(timeout=JOB_BOUND)[0].split()
    # The name only this account may use: its record folder, or (without one) the record itself.
    target = folder if folder != machine else record
    squat = accounts.run(squatter, _SQUAT, target, form, str(accounts.shared))
    assert squat.wait(JOB_BOUND) == 0, squat.stdout.read()
    job = accounts.run(owner, _GUARDED_JOB, _JOB, "owner", str(accounts.log), "job")
    output = job.communicate(timeout=JOB_BOUND)[0]
    assert job.returncode == 3, output
    assert target in output and "belonging to uid" in output and f"rm -r {target}" in output
    assert "owner running" not in accounts.lines() and _engines() == []


def test_an_accounts_record_folder_is_its_own_and_only_it_writes_there(accounts: Accounts) -> None:
    """The record lives where only its account can write: another account can neither replace
    the record nor plant one there, and reads it to wait for the engine it names."""
    owner, other = accounts.uids
    orphan = _orphan(accounts, owner)
    paths = accounts.run(owner, _RECORD_PATHS)
    record, folder, _ = map(Path, paths.communicate(timeout=JOB_BOUND)[0].split())
    info = os.lstat(folder)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == owner and stat.S_IMODE(info.st_mode) == 0o755
    assert os.lstat(record).st_uid == owner
    attack = accounts.run(other, textwrap.dedent("""
        import os, sys
        record = sys.argv[1]
        for attempt in (lambda: os.unlink(record), lambda: open(record, "w"),
                        lambda: open(record + ".planted", "w"), lambda: os.rename(record, record + ".gone")):
            try:
                attempt()
                print("allowed")
            except PermissionError:
                print("refused")
    """), str(record))
    assert attack.communicate(timeout=JOB_BOUND)[0].split() == ["refused"] * 4
    assert orphan.is_running()
