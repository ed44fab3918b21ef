"""The machine-wide engine lock (h3bridge/lock.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from core_helpers import wait_until
from h3bridge.cancel import CancelToken
from h3bridge.errors import GenerationCancelled
from h3bridge.engines.lock import (
    LOCK_PATH_ENV,
    EngineLock,
    default_lock_path,
    engine_lock,
    has_in_process_waiters,
    register_yield_hook,
    unregister_yield_hook,
)


@pytest.fixture
def lock_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "locks" / "engine.lock"
    monkeypatch.setenv(LOCK_PATH_ENV, str(path))
    return path


def test_env_override_and_default_location(lock_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default is one lock per machine: no per-user setting (HOME, XDG_CACHE_HOME,
    H3BRIDGE_CACHE_DIR) moves it; only H3BRIDGE_LOCK_PATH and H3BRIDGE_MACHINE_DIR do."""
    from h3bridge.userdirs import MACHINE_DIR_ENV
    assert default_lock_path() == lock_path
    monkeypatch.delenv(LOCK_PATH_ENV)
    monkeypatch.setenv(MACHINE_DIR_ENV, "/shared/place")
    assert default_lock_path() == Path("/shared/place/engine.lock")
    monkeypatch.delenv(MACHINE_DIR_ENV)
    machine = Path("/Users/Shared/h3bridge") if sys.platform == "darwin" else Path("/var/tmp/h3bridge")
    assert default_lock_path() == machine / "engine.lock"
    for variable, value in (("XDG_CACHE_HOME", "/somewhere/cache"), ("HOME", "/home/someone-else"),
                            ("H3BRIDGE_CACHE_DIR", "/elsewhere")):
        monkeypatch.setenv(variable, value)
        assert default_lock_path() == machine / "engine.lock"


def test_uncontended_lock_creates_parent_and_does_not_wait(lock_path: Path) -> None:
    waits: list[float] = []
    with engine_lock(on_wait=waits.append) as held:
        assert held.is_held
        assert lock_path.parent.is_dir()
        assert held.waited == 0.0
    assert waits == []
    assert not held.is_held


def test_unusable_lock_location_is_a_typed_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from h3bridge.errors import EngineError
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(LOCK_PATH_ENV, str(blocker / "engine.lock"))
    with pytest.raises(EngineError, match="cannot use the engine lock file") as caught:
        with engine_lock():
            pass
    assert LOCK_PATH_ENV in caught.value.hint


def test_second_holder_in_same_process_waits_and_reports(lock_path: Path) -> None:
    first = EngineLock()
    first.acquire()
    waits: list[float] = []
    got_it = threading.Event()

    def second() -> None:
        with engine_lock(on_wait=waits.append, poll_interval=0.02):
            got_it.set()

    thread = threading.Thread(target=second)
    thread.start()
    deadline = time.monotonic() + 5
    while not waits and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waits, "the waiting holder never reported waiting"
    assert has_in_process_waiters()
    assert not got_it.is_set()
    first.release()
    thread.join(5)
    assert got_it.is_set()
    assert not has_in_process_waiters()
    # Reports are the seconds waited so far, never decreasing.
    assert waits == sorted(waits)


def test_cancel_while_waiting_raises_and_leaves_holder_intact(lock_path: Path) -> None:
    holder = EngineLock()
    holder.acquire()
    token = CancelToken()
    waits: list[float] = []

    def cancel_on_third_report(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            token.cancel()

    with pytest.raises(GenerationCancelled, match="waiting for the engine"):
        with engine_lock(cancel=token, on_wait=cancel_on_third_report, poll_interval=0.01):
            pytest.fail("must not get the lock while it is held")
    assert len(waits) == 3
    assert holder.is_held
    holder.release()


def test_already_cancelled_token_never_takes_the_lock(lock_path: Path) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(GenerationCancelled):
        with engine_lock(cancel=token):
            pass
    with engine_lock() as held:   # and nothing was left behind
        assert held.is_held


def test_release_from_another_thread_frees_the_lock(lock_path: Path) -> None:
    """A session acquires on its job thread and releases from its idle timer thread."""
    holder = EngineLock()
    holder.acquire()
    thread = threading.Thread(target=holder.release)
    thread.start()
    thread.join()
    assert not holder.is_held
    with engine_lock(on_wait=lambda s: pytest.fail("lock was not released")):
        pass


def test_yield_hook_lets_an_idle_in_process_holder_step_aside(lock_path: Path) -> None:
    idle_holder = EngineLock()
    idle_holder.acquire()
    calls: list[str] = []

    def step_aside() -> None:
        calls.append("asked")
        idle_holder.release()

    hook_id = register_yield_hook(step_aside)
    try:
        with engine_lock(poll_interval=0.01) as held:
            assert held.is_held
    finally:
        unregister_yield_hook(hook_id)
    assert calls == ["asked"]


_QUEUE_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from h3bridge.engines.lock import engine_lock
    name, log, release_flag = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    def note(text):
        with open(log, "a") as handle:
            handle.write(f"{name} {text}\\n")
    reported = []
    def on_wait(seconds):
        if not reported:
            reported.append(seconds)
            note("waiting")
    with engine_lock(on_wait=on_wait, poll_interval=0.02):
        note("acquired")
        while not release_flag.exists():
            time.sleep(0.01)
        note("releasing")
""")


def _queue_child(name: str, log: Path, release_flag: Path, lock_path: Path) -> subprocess.Popen:
    """A process that takes the engine lock at `lock_path`, logs to `log`, holds until `release_flag`."""
    return subprocess.Popen([sys.executable, "-c", _QUEUE_CHILD, name, str(log), str(release_flag)],
                            env={**os.environ, LOCK_PATH_ENV: str(lock_path)})


def _wait_for_line(log: Path, line: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and line in log.read_text().splitlines():
            return
        time.sleep(0.01)
    raise AssertionError(f"{line!r} never appeared in {log.read_text() if log.exists() else '(no log)'}")


def test_two_processes_queue_in_order_without_overlap(lock_path: Path, tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    flag_a, flag_b = tmp_path / "release-a", tmp_path / "release-b"
    first = _queue_child("A", log, flag_a, lock_path)
    try:
        _wait_for_line(log, "A acquired")
        second = _queue_child("B", log, flag_b, lock_path)
        try:
            _wait_for_line(log, "B waiting")
            flag_a.touch()
            _wait_for_line(log, "B acquired")
            flag_b.touch()
            assert second.wait(20) == 0
        finally:
            second.kill()
        assert first.wait(20) == 0
    finally:
        first.kill()
    assert log.read_text().splitlines() == [
        "A acquired", "B waiting", "A releasing", "B acquired", "B releasing"]


def test_waiters_are_served_first_come_first_served(lock_path: Path, tmp_path: Path) -> None:
    """The OS lock is not fair; the queue is: with B then C waiting, B goes next even though C
    polls just as often, and a newcomer while both wait queues behind them."""
    log = tmp_path / "log.txt"
    flags = {name: tmp_path / f"release-{name}" for name in "ABCD"}
    children = [_queue_child("A", log, flags["A"], lock_path)]
    try:
        _wait_for_line(log, "A acquired")
        for name in "BC":
            children.append(_queue_child(name, log, flags[name], lock_path))
            _wait_for_line(log, f"{name} waiting")
        flags["A"].touch()
        _wait_for_line(log, "B acquired")
        children.append(_queue_child("D", log, flags["D"], lock_path))
        _wait_for_line(log, "D waiting")
        flags["B"].touch()
        _wait_for_line(log, "C acquired")
        flags["C"].touch()
        _wait_for_line(log, "D acquired")
        flags["D"].touch()
        assert [child.wait(20) for child in children] == [0, 0, 0, 0]
    finally:
        for child in children:
            child.kill()
    acquired = [line.split()[0] for line in log.read_text().splitlines() if line.endswith("acquired")]
    assert acquired == ["A", "B", "C", "D"]


def test_lock_is_freed_when_its_holder_process_dies(lock_path: Path, tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    holder = _queue_child("A", log, tmp_path / "never", lock_path)
    try:
        _wait_for_line(log, "A acquired")
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    finally:
        holder.kill()
    with engine_lock(poll_interval=0.01) as held:   # the kernel dropped the dead holder's lock
        assert held.is_held


def test_waiters_in_other_processes_are_visible_to_the_holder(lock_path: Path, tmp_path: Path) -> None:
    holder = EngineLock()
    holder.acquire()
    try:
        assert not holder.others_waiting()
        # A waiter in this process is served by yield hooks, not counted here.
        token = CancelToken()

        def wait_in_this_process() -> None:
            with pytest.raises(GenerationCancelled):
                with engine_lock(cancel=token):
                    pass
        same_process = threading.Thread(target=wait_in_this_process)
        same_process.start()
        assert wait_until(lambda: bool(list(lock_path.parent.glob("*.wanted.*"))))   # it announced itself
        assert not holder.others_waiting()
        token.cancel()
        same_process.join()
        log = tmp_path / "log.txt"
        waiter = _queue_child("B", log, tmp_path / "go", lock_path)
        try:
            _wait_for_line(log, "B waiting")
            assert wait_until(holder.others_waiting)
            holder.release()
            _wait_for_line(log, "B acquired")
            (tmp_path / "go").touch()
            assert waiter.wait(20) == 0
        finally:
            waiter.kill()
        assert not holder.others_waiting()        # the waiter withdrew its marker
        assert not list(lock_path.parent.glob("*.wanted.*"))
    finally:
        holder.release()




# ----------------------------------------------------------------------------- an engine left running

def _engine_like_group() -> subprocess.Popen:
    """A stand-in engine: leads its own process group and has a grandchild, as h3 has FFmpeg."""
    return subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private stand-in for the system temporary folder, where h3bridge's work folders go."""
    import tempfile
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _work_folder() -> Path:
    """A work folder made exactly as the one-shot engine makes it (engines/output.py job_files)."""
    from h3bridge.engines.scratch import make_work_folder
    return make_work_folder()


def test_the_next_holder_stops_an_engine_its_dead_holder_left_and_removes_its_files(lock_path: Path,
                                                                                    tmp_path: Path,
                                                                                    scratch: Path) -> None:
    from h3bridge.engines.output import staging_path
    from h3bridge.engines.process import group_alive
    engine = _engine_like_group()
    staged = staging_path(tmp_path / "clip.mp4")
    staged.write_bytes(b"half an mp4")
    workdir = _work_folder()
    (workdir / "frames").mkdir(parents=True)
    (workdir / "frames" / "frame-0001.ppm").write_bytes(b"P6")
    try:
        holder = EngineLock()
        holder.acquire()
        holder.record_engine(engine.pid, leftovers=[staged, workdir])
        holder._file_lock.release(force=True)   # what the kernel does when the holder dies unannounced
        assert group_alive(engine.pid)
        with engine_lock():
            assert not group_alive(engine.pid)
            assert not staged.exists() and not workdir.exists()
        assert engine.wait(5) == -signal.SIGTERM
        assert list(holder._record_path.parent.iterdir()) == []
    finally:
        engine.kill()


def test_a_recorded_pid_now_used_by_another_program_is_left_alone(lock_path: Path, scratch: Path) -> None:
    from h3bridge.engines.process import group_alive
    from h3bridge.engines.lock import EngineRecord, write_engine_record
    bystander = _engine_like_group()
    leftover = _work_folder() / "partial.ppm"
    leftover.write_bytes(b"P6")
    try:
        # The recorded engine died long ago and its pid was reused: same pid, other start time.
        lock_path.parent.mkdir(parents=True)
        record_path = EngineLock(lock_path)._record_path
        write_engine_record(record_path, EngineRecord(pid=bystander.pid, started=1.0, leftovers=(str(leftover),)))
        with engine_lock():
            assert group_alive(bystander.pid)
        assert not leftover.exists()          # the dead engine's file still goes
        assert not record_path.exists()
    finally:
        bystander.kill()
        bystander.wait(5)


def test_a_holder_that_finishes_leaves_no_record(lock_path: Path) -> None:
    engine = _engine_like_group()
    with engine_lock() as lock:
        lock.record_engine(engine.pid)
        assert lock._record_path.is_file() and lock._record_path.parent.parent == lock_path.parent
        engine.kill()
        engine.wait(5)
        lock.clear_engine()
    # The account's record folder stays (so no other account can take its name between jobs), empty.
    assert sorted(lock_path.parent.iterdir()) == [lock_path, lock._record_path.parent]
    assert list(lock._record_path.parent.iterdir()) == []


def test_the_cache_directory_setting_does_not_move_the_lock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Two programs with different H3BRIDGE_CACHE_DIR must still share one lock (one engine)."""
    monkeypatch.delenv(LOCK_PATH_ENV, raising=False)
    monkeypatch.delenv("H3BRIDGE_CACHE_DIR", raising=False)
    shared = default_lock_path()
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert default_lock_path() == shared


def test_leftover_forms_folder_only_if_empty_and_glob(lock_path: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead session's h3 folder: its partial clips go, the folder only if nothing else is there."""
    import h3bridge.engines.scratch as scratch_module
    from h3bridge.engines.lock import EngineRecord, write_engine_record, stop_orphaned_engine
    monkeypatch.setattr(scratch_module, "SESSION_DIR_PARENT", str(tmp_path))   # h3's /tmp, privately
    lock_path.parent.mkdir(parents=True)
    record_path = EngineLock(lock_path)._record_path
    folders = {}
    for name, extra in (("h3-bare01", None), ("h3-shared", "notes.txt")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "video-0003.mp4").write_bytes(b"partial")
        if extra:
            (folder / extra).write_text("not ours")
        folders[name] = folder
        write_engine_record(record_path, EngineRecord(pid=2**22 + 12345, started=1.0, leftovers=(
            str(folder / "video-[0-9]*.mp4"), f"{folder}{os.sep}")))
        assert stop_orphaned_engine(record_path) is False      # no such process: nothing to stop
    assert not folders["h3-bare01"].exists()
    assert sorted(p.name for p in folders["h3-shared"].iterdir()) == ["notes.txt"]


def test_folder_names_in_leftovers_are_literal(tmp_path: Path) -> None:
    """A user's output folder named `out [1]` is removed as written, not read as a pattern."""
    from h3bridge.engines.scratch import remove_leftovers
    folder = tmp_path / "out [1]"
    folder.mkdir()
    (folder / "video-0001.mp4").write_bytes(b"partial")
    (folder / "video-x.mp4").write_bytes(b"not a clip number")
    remove_leftovers([str(folder / "video-[0-9]*.mp4")])
    assert sorted(p.name for p in folder.iterdir()) == ["video-x.mp4"]
    (folder / "video-x.mp4").unlink()
    remove_leftovers([f"{folder}{os.sep}"])
    assert not folder.exists()


# ----------------------------------------------------------------------------- one lock per machine, shared safely

def _machine_lock(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Use the machine-wide default (the conftest points H3BRIDGE_MACHINE_DIR at a private folder)."""
    from h3bridge.userdirs import machine_dir
    monkeypatch.delenv(LOCK_PATH_ENV)
    return machine_dir() / "engine.lock"


def test_the_machine_wide_folder_is_open_to_every_account_and_its_lock_lockable_by_all(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import stat
    lock = _machine_lock(monkeypatch)
    previous = os.umask(0o077)            # a cautious user's umask must not shut other accounts out
    try:
        with engine_lock() as held:
            assert held.path == lock
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.lstat(lock.parent).st_mode) == 0o1777     # sticky: no one replaces another's file
    info = os.lstat(lock)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o666


def test_a_symlink_planted_as_the_shared_folder_or_its_lock_is_refused(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    from h3bridge.errors import EngineError
    lock = _machine_lock(monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lock.parent.symlink_to(elsewhere)
    with pytest.raises(EngineError, match="is a symbolic link"):
        with engine_lock():
            pass
    assert list(elsewhere.iterdir()) == []
    lock.parent.unlink()
    lock.parent.mkdir(mode=0o1777)
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's file")
    lock.symlink_to(victim)
    with pytest.raises(EngineError, match="symbolic link") as caught:
        with engine_lock():
            pass
    assert victim.read_text() == "someone's file" and LOCK_PATH_ENV in (caught.value.hint or "")


def test_a_folder_another_account_planted_that_is_not_open_to_all_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import h3bridge.engines.lock as lock_module
    from h3bridge.errors import EngineError
    from h3bridge.engines.lock import _user_name
    lock = _machine_lock(monkeypatch)
    lock.parent.mkdir(mode=0o755)
    os.chmod(lock.parent, 0o755)
    monkeypatch.setattr(lock_module, "account_uid", lambda: os.geteuid() + 4242)    # we are another account
    with pytest.raises(EngineError, match=f"belongs to {_user_name(os.geteuid())}") as caught:
        with engine_lock():
            pass
    assert "chmod 1777" in (caught.value.hint or "")
    assert list(lock.parent.iterdir()) == []


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_a_planted_engine_record_deletes_nothing_and_kills_nothing(lock_path: Path, tmp_path: Path, scratch: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The record sits in a folder every account can write to. Whatever it names, h3bridge
    removes only its own scratch and stops only its own engine."""
    import json
    from h3bridge.engines.process import group_alive
    from h3bridge.engines.scratch import WORKDIR_PREFIX
    precious = tmp_path / "any" / "folder"
    (precious / "inside").mkdir(parents=True)
    (precious / "inside" / "thesis.txt").write_text("years of work")
    mp4 = tmp_path / "holiday.mp4"
    mp4.write_bytes(b"a clip of theirs")
    disguised = scratch / f"{WORKDIR_PREFIX}abcd1234"            # named like our work folder, but a symlink
    disguised.symlink_to(precious)
    lookalike = tmp_path / f"{WORKDIR_PREFIX}efgh5678"           # named like it, but not in the temp folder
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("mine")
    climbing = f"{_work_folder()}/../../any/folder"
    bystander = _engine_like_group()                             # a live program of this user's
    planted = [{"pid": _dead_pid(), "started": 0,
                "leftovers": [str(precious), str(mp4), str(disguised), str(lookalike), climbing, "/"]},
               {"pid": bystander.pid, "started": 0, "leftovers": [str(precious / "inside")]}]
    lock_path.parent.mkdir(parents=True)
    names = [EngineLock(lock_path)._record_path, lock_path.with_name("engine.lock.engine")]
    names[0].parent.mkdir(mode=0o755)
    try:
        for record in planted:
            for name in names:
                name.write_text(json.dumps(record))
            with engine_lock():
                assert group_alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait(5)
    assert (precious / "inside" / "thesis.txt").read_text() == "years of work"
    assert mp4.read_bytes() == b"a clip of theirs" and disguised.is_symlink()
    assert (lookalike / "notes.txt").read_text() == "mine"
    assert f"not removing {precious}" in caplog.text


def test_dead_scratch_is_removed_only_when_provably_ours_and_dead(tmp_path: Path, scratch: Path) -> None:
    """remove_dead_scratch: a probe or work folder named for a process that no longer runs goes;
    one named for a live process, one of another account, a symlink or a file of another kind
    named like one, and a work folder outside the temporary folder stay."""
    from h3bridge.engines.scratch import remove_dead_scratch
    dead = _dead_pid()
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    gone = [outputs / f".h3bridge-probe-{dead}-abcd_123", scratch / f".h3bridge-probe-{dead}-efgh_456"]
    for path in gone:
        path.write_bytes(b"h3bridge")
    gone.append(scratch / f"h3bridge-{dead}-ijkl_789")
    (gone[-1] / "frames").mkdir(parents=True)
    kept = [outputs / f".h3bridge-probe-{os.getpid()}-mnop_012",      # a live process's
            outputs / f"h3bridge-{dead}-qrst_345",                   # a work folder outside the temp folder
            scratch / f".h3bridge-probe-{dead}-uvwx_678",            # a folder named like a probe
            scratch / f"h3bridge-{dead}-yzab_901"]                   # a symlink named like a work folder
    kept[0].write_bytes(b"h3bridge")
    kept[1].mkdir()
    kept[2].mkdir()
    kept[3].symlink_to(outputs)
    if os.geteuid() == 0:
        theirs = outputs / f".h3bridge-probe-{dead}-cdef_234"       # another account's
        theirs.write_bytes(b"h3bridge")
        os.chown(theirs, 65534, 65534)
        kept.append(theirs)
    remove_dead_scratch(outputs)
    remove_dead_scratch(scratch)
    assert [path for path in gone if os.path.lexists(path)] == []
    assert [path for path in kept if not os.path.lexists(path)] == []
