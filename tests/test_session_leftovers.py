"""What a warm session stopped during its start-up leaves behind (engines/session.py): nothing.

Interactive h3 makes its session folder (mkdtemp "/tmp/h3-XXXXXX", h3_cli.c:736) a moment before
it says where (`Outputs: DIR`, h3_cli.c:755). A stand-in engine stops at exactly those points, so
the cancel lands there every time, with no timing involved."""
from __future__ import annotations

import os
import stat
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from core_helpers import fast_request, model_dir, wait_until  # noqa: F401  (fixture)
from h3bridge.cancel import CancelToken
from h3bridge.errors import GenerationCancelled
from h3bridge.engines.session import SessionEngine


def _starting_engine(tmp_path: Path, parent: Path, stage: str) -> tuple[Path, Path]:
    """An `h3` that makes its session folder in `parent` as interactive h3 does, then stops for
    good: before saying where ("made"), after ("announced"), or after another program of this
    user made one beside it ("made-beside-another"). Returns (its path, the notice it writes
    once stopped there)."""
    notice = tmp_path / "stopped-at-start-up"
    engine = tmp_path / "h3"
    engine.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""
        import os, secrets, string, sys, time
        parent, notice, stage = {str(parent)!r}, {str(notice)!r}, {stage!r}
        def mkdtemp():
            name = "h3-" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(6))
            os.mkdir(os.path.join(parent, name), 0o700)
            return os.path.join(parent, name)
        if stage == "made-beside-another":
            mkdtemp()
        folder = mkdtemp()
        if stage == "announced":
            sys.stdout.write("H3 Interactive Mode\\nModel: x\\nOutputs: " + folder + "\\n")
            sys.stdout.flush()
        with open(notice + ".part", "w") as handle:     # whole or not at all: the test reads it once it exists
            handle.write(folder)
        os.replace(notice + ".part", notice)
        time.sleep(3600)
    """))
    engine.chmod(engine.stat().st_mode | stat.S_IXUSR)
    return engine, notice


@pytest.mark.parametrize("stage", ["made", "announced", "made-beside-another"])
def test_a_session_cancelled_while_it_starts_leaves_no_session_folder(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      stage: str) -> None:
    import h3bridge.engines.scratch as scratch_module
    parent = tmp_path / "tmp"          # h3's /tmp, privately: other programs' sessions stay out of it
    parent.mkdir()
    monkeypatch.setattr(scratch_module, "SESSION_DIR_PARENT", str(parent))
    engine_path, notice = _starting_engine(tmp_path, parent, stage)
    session = SessionEngine(engine_path, model_dir, idle_timeout=60)
    token = CancelToken()
    outcome: list[BaseException | None] = []

    def job() -> None:
        try:
            session.generate(fast_request(), tmp_path / "clip.mp4", cancel=token)
            outcome.append(None)
        except BaseException as error:       # handed to the test thread
            outcome.append(error)
    thread = threading.Thread(target=job)
    thread.start()
    try:
        assert wait_until(notice.exists, timeout=60), "the stand-in engine never started"
        token.cancel()
        thread.join(60)
    finally:
        token.cancel()
        session.close()
    assert not thread.is_alive() and isinstance(outcome[0], GenerationCancelled), outcome
    left = sorted(path.name for path in parent.iterdir())
    if stage == "made-beside-another":
        # Two folders appeared while it started: one is not its own, and which cannot be proved.
        assert len(left) == 2
    else:
        assert left == []
    assert not (tmp_path / "clip.mp4").exists()


HOST = """
import sys
from pathlib import Path
import h3bridge.engines.scratch as scratch_module
scratch_module.SESSION_DIR_PARENT = sys.argv[1]
from h3bridge.engines.session import SessionEngine
sys.path.insert(0, sys.argv[4])
from core_helpers import fast_request
SessionEngine(sys.argv[2], sys.argv[3], idle_timeout=60).generate(fast_request(), Path(sys.argv[1]).parent / "clip.mp4")
"""


@pytest.mark.parametrize("killed", ["host", "host and engine"])
def test_a_host_killed_while_its_session_starts_leaves_the_folder_to_the_next_holder(
        model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, killed: str) -> None:  # noqa: F811
    """The host SIGKILLed (with its engine, or leaving it running, as after a real crash) after h3
    made its session folder and before it said where: nothing could clean up then, and the next
    holder of the lock found no folder in the record (4 SIGKILLs of a server's process group left
    one /tmp/h3-* for good). The record names the session folders that existed before the engine
    started, and the next holder removes the one that appeared since."""
    import signal
    import subprocess
    import h3bridge.engines.scratch as scratch_module
    from h3bridge.engines.lock import (LOCK_PATH_ENV, RECORD_FILE_NAME, RECORD_FOLDER_INFIX, engine_lock,
                                       read_engine_record)
    parent = tmp_path / "tmp"          # h3's /tmp, privately: other programs' sessions stay out of it
    parent.mkdir()
    (parent / "h3-Before").mkdir()     # a session folder of this user from before: never touched
    monkeypatch.setattr(scratch_module, "SESSION_DIR_PARENT", str(parent))
    engine_path, notice = _starting_engine(tmp_path, parent, "made")
    host = subprocess.Popen([sys.executable, "-c", HOST, str(parent), str(engine_path), str(model_dir),
                             str(Path(__file__).parent)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lock_path = Path(os.environ[LOCK_PATH_ENV])
    record = lock_path.with_name(f"{lock_path.name}{RECORD_FOLDER_INFIX}{os.getuid()}") / RECORD_FILE_NAME

    def recorded() -> bool:        # (the engine may make its folder before its host has recorded it)
        loaded = read_engine_record(record)
        return loaded is not None and loaded[1].session_dirs_before is not None

    try:
        assert wait_until(lambda: notice.exists() and recorded(), timeout=60), "the stand-in engine never started"
        made = notice.read_text()
        engine_pid = None
        if killed == "host and engine":
            import psutil
            engine_pid = next(child.pid for child in psutil.Process(host.pid).children(recursive=True))
        host.send_signal(signal.SIGKILL)
        host.wait(30)
        if engine_pid is not None:
            os.killpg(engine_pid, signal.SIGKILL)
        assert os.path.isdir(made)
        with engine_lock():            # the next holder: its orphan recovery
            pass
    finally:
        if host.poll() is None:
            host.kill()
            host.wait(30)
    assert sorted(path.name for path in parent.iterdir()) == ["h3-Before"]
