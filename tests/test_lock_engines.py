"""The engine lock as the one-shot engine uses it (engines/oneshot.py holds it around each run)."""
from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import pytest

from core_helpers import fast_request, model_dir, sim_engine_path, sim_invocations, sim_log, wait_until  # noqa: F401
from h3bridge import OneShotEngine
from h3bridge.cancel import CancelToken
from h3bridge.errors import GenerationCancelled
from h3bridge.engines.lock import EngineLock, engine_lock
from h3bridge.progress import WAITING_PHASE


def test_one_shot_waits_for_the_engine_and_can_be_cancelled(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                            sim_log: Path) -> None:
    engine = OneShotEngine(sim_engine_path(), model_dir)
    token = CancelToken()
    events = []

    def on_progress(event) -> None:
        events.append(event)
        if len(events) == 3:
            token.cancel()

    with engine_lock():        # another engine holds the machine
        with pytest.raises(GenerationCancelled):
            engine.generate(fast_request(), tmp_path / "a.mp4", on_progress=on_progress, cancel=token)
    assert [event.phase for event in events] == [WAITING_PHASE] * 3
    assert sim_invocations(sim_log) == []          # h3 never started
    assert [p.name for p in tmp_path.iterdir()] == []    # no output, no staged partial file


def test_one_shot_runs_once_the_holder_releases(model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    engine = OneShotEngine(sim_engine_path(), model_dir)
    holder = EngineLock()
    holder.acquire()
    phases: list[str] = []
    released = threading.Event()

    def on_progress(event) -> None:
        phases.append(event.phase)
        if event.phase == WAITING_PHASE and not released.is_set():
            released.set()
            threading.Timer(0.05, holder.release).start()

    result = engine.generate(fast_request(), tmp_path / "a.mp4", on_progress=on_progress,
                             want_frames=False, want_audio=False)
    assert result.video_path.is_file()
    waiting = [phase for phase in phases if phase == WAITING_PHASE]
    assert waiting and phases[:len(waiting)] == waiting          # all the waiting came first
    assert "denoise" in phases and not holder.is_held


def test_an_engine_whose_host_died_is_stopped_before_the_next_one_starts(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                                         sim_log: Path,  # noqa: F811
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The host (think ComfyUI) is killed while its engine is in a phase that writes nothing (the
    tiled VAE decode reports no progress, h3.c:1618), so the engine gets no SIGPIPE and keeps the
    model in memory; the kernel freed the lock with the host. The next job stops that engine and
    removes the files it was writing before starting its own."""
    import os
    import sys
    import textwrap
    from core_helpers import assert_group_gone
    from h3bridge.engines.process import group_alive
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from core_helpers import fast_request
        from h3bridge import OneShotEngine
        OneShotEngine({str(sim_engine_path())!r}, {str(model_dir)!r}).generate(
            fast_request(), {str(tmp_path / 'first.mp4')!r})
    """)
    # Killed on the progress line itself, the host would race the engine's next write (the line's
    # closing newline) and SIGPIPE would end the engine: wait until it has written its last byte.
    silent = tmp_path.parent / f"{tmp_path.name}-silent"
    host = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "H3_SIM_HANG_PHASE": "video VAE load:36",
                                 "H3_SIM_HANG_NOTICE": str(silent)})
    _sigkill_when(host, silent, "the engine never reached its silent phase")
    orphan = sim_invocations(sim_log)[0]
    frames_dir = Path(orphan["argv"][orphan["argv"].index("--frames-dir") + 1])
    assert group_alive(orphan["pid"]) and frames_dir.parent.is_dir()
    result = OneShotEngine(sim_engine_path(), model_dir).generate(fast_request(), tmp_path / "second.mp4")
    assert result.video_path.is_file()
    assert_group_gone(orphan["pid"])
    assert not frames_dir.parent.exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["second.mp4", "sim-log.jsonl"]


def test_two_homes_rendering_at_once_never_run_two_engines(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Two accounts (here: two HOMEs and cache folders) on one Mac share one pool of memory: with
    the default lock (no H3BRIDGE_LOCK_PATH), their renders take turns. The process table is
    sampled every 50 ms while both run; the machine-wide folder is this test's own
    (H3BRIDGE_MACHINE_DIR, from the conftest), not the real one."""
    import os
    import sys
    import textwrap
    import time
    import psutil
    from h3bridge.engines.lock import LOCK_PATH_ENV
    from h3bridge.userdirs import MACHINE_DIR_ENV
    monkeypatch.delenv(LOCK_PATH_ENV)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from core_helpers import fast_request
        from h3bridge import OneShotEngine
        OneShotEngine({str(sim_engine_path())!r}, {str(model_dir)!r}).generate(
            fast_request(), sys.argv[1], want_frames=False, want_audio=False)
    """)
    hosts = []
    for name in ("alice", "bob"):
        home = tmp_path / name
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
               "H3BRIDGE_CACHE_DIR": str(home / "cache"), "H3_SIM_TIME_SCALE": "0.01"}
        assert LOCK_PATH_ENV not in env and env[MACHINE_DIR_ENV]
        hosts.append(subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"{name}.mp4")], env=env))
    engine_name = sim_engine_path().name
    most = 0
    try:
        while any(host.poll() is None for host in hosts):
            engines = set()
            for host in hosts:
                try:
                    children = psutil.Process(host.pid).children(recursive=True)
                except psutil.Error:
                    continue
                for child in children:
                    try:
                        if child.status() != psutil.STATUS_ZOMBIE and any(
                                Path(part).name == engine_name for part in child.cmdline()[:2]):
                            engines.add(child.pid)
                    except psutil.Error:
                        continue
            most = max(most, len(engines))
            time.sleep(0.05)
    finally:
        for host in hosts:
            host.kill()
    assert [host.wait(10) for host in hosts] == [0, 0]
    assert (tmp_path / "alice.mp4").is_file() and (tmp_path / "bob.mp4").is_file()
    assert most == 1, f"{most} engines ran at once"


def test_an_engine_whose_record_cannot_be_written_is_stopped_with_a_clear_error(model_dir: Path,  # noqa: F811
                                                                                 tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its record, an engine whose host died would be found by no one and run beside the
    next: a record that cannot be written (here: the disk is full) stops the job and its engine."""
    import errno
    import os
    import h3bridge.engines.lock as lock_module
    from h3bridge.engines import process as process_module
    from h3bridge.errors import EngineError
    real_replace = os.replace
    beside_the_lock = str(lock_module.default_lock_path().parent)

    def full_disk(source, target) -> None:
        if str(target).startswith(beside_the_lock):        # the engine record, whatever its layout
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(source, target)
    monkeypatch.setattr(lock_module.os, "replace", full_disk)
    with pytest.raises(EngineError, match="cannot write the engine record .*No space left") as caught:
        OneShotEngine(sim_engine_path(), model_dir).generate(fast_request(), tmp_path / "a.mp4")
    assert "make room on the disk" in (caught.value.hint or "")
    assert process_module._live_engines == set()          # its engine was stopped
    assert list(tmp_path.iterdir()) == [] or [p.name for p in tmp_path.iterdir()] == ["sim-log.jsonl"]


# ----------------------------------------------------------------------------- scratch a killed host made

def _killed_host(model_dir: Path, tmp_path: Path, output: Path, *, stop_at: str, env: dict[str, str]) -> int:  # noqa: F811
    """A host running a one-shot job, SIGKILLed where it stopped for good: "waiting" for the engine
    lock (its work folder made), or "probing" the output folder (its probe file made, before the
    probe's name is removed). Returns its pid."""
    import os
    import sys
    import textwrap
    notice = tmp_path / f"host-stopped-{stop_at}"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from pathlib import Path
        from core_helpers import fast_request
        from h3bridge import OneShotEngine
        from h3bridge.engines import disk
        def stop_here(*args, **kwargs):
            Path({str(notice)!r}).touch()
            time.sleep(3600)
        if {stop_at!r} == "probing":
            disk.remove_quietly = stop_here         # the probe file is made; its name goes next
        OneShotEngine({str(sim_engine_path())!r}, {str(model_dir)!r}).generate(
            fast_request(), {str(output)!r}, want_frames=False, want_audio=False,
            on_progress=lambda event: stop_here() if event.phase == "waiting for the engine" else None)
    """)
    host = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, **env})
    _sigkill_when(host, notice, "the host never reached the point where it is killed")
    return host.pid


def _sigkill_when(host: subprocess.Popen, marker: Path, never: str) -> None:
    """SIGKILL `host` (a host dying with no chance to clean up) once `marker` exists; a host that
    never gets there fails the test with `never`, and is killed all the same."""
    try:
        assert wait_until(marker.exists, timeout=60), never
        host.send_signal(signal.SIGKILL)
        host.wait(10)
    finally:
        host.kill()


def test_a_work_folder_a_killed_host_left_is_removed_by_the_next_job(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A host killed while it waited for the engine leaves its job's temporary folder (made before
    the lock is taken, so no engine record names it). The next job removes it: it is this user's,
    named for a process that no longer runs. A folder of a live process, or without a pid in its
    name, is left alone."""
    import os
    import tempfile
    private = tmp_path / "tmp"          # the system temporary folder, privately
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    with engine_lock():                 # another job holds the engine: the host waits, and is killed
        _killed_host(model_dir, tmp_path, tmp_path / "first.mp4", stop_at="waiting", env={"TMPDIR": str(private)})
    left = sorted(path.name for path in private.iterdir())
    assert len(left) == 1 and left[0].startswith("h3bridge-"), left
    live = Path(tempfile.mkdtemp(prefix=f"h3bridge-{os.getpid()}-"))   # named as this live process's
    older = private / "h3bridge-abcd1234"                       # an older h3bridge's: no pid to prove it dead
    older.mkdir()
    result = OneShotEngine(sim_engine_path(), model_dir).generate(fast_request(), tmp_path / "second.mp4",
                                                                  want_frames=False, want_audio=False)
    assert result.video_path.is_file()
    assert sorted(path.name for path in private.iterdir()) == sorted([live.name, older.name])


@pytest.mark.parametrize("cleaner", ["the next job in that folder", "the restarted server"])
def test_a_disk_probe_a_killed_host_left_is_removed(model_dir: Path, tmp_path: Path, cleaner: str) -> None:  # noqa: F811
    """A host (a one-shot server) killed while it probed its output folder leaves the probe file
    there; the next probe of that folder, or the restarted server in its job folders, removes it."""
    from h3bridge.server.jobs import JobStore, new_job_id
    data = tmp_path / "data"
    store = JobStore(data)
    job_id = new_job_id()
    store.inputs_dir(job_id).mkdir(parents=True)
    store.add(job_id, model="MiniMax-H3", fields={"prompt": "a fox"}, uploads=[], shape={})
    store.close()
    folder = store.job_dir(job_id)
    _killed_host(model_dir, tmp_path, store.video_path(job_id), stop_at="probing", env={})
    left = sorted(path.name for path in folder.iterdir())
    assert len(left) == 2 and left[0].startswith(".h3bridge-probe-") and left[1] == "inputs", left
    if cleaner == "the restarted server":
        JobStore(data).recover()
        assert sorted(path.name for path in folder.iterdir()) == ["inputs"]
    else:
        OneShotEngine(sim_engine_path(), model_dir).generate(fast_request(), folder / "next.mp4",
                                                             want_frames=False, want_audio=False)
        assert sorted(path.name for path in folder.iterdir()) == ["inputs", "next.mp4"]
