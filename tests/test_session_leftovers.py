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
        with open(notice, "w") as handle:
            handle.write(folder)
        time.sleep(3600)
    """))
    engine.chmod(engine.stat().st_mode | stat.S_IXUSR)
    return engine, notice


@pytest.mark.parametrize("stage", ["made", "announced", "made-beside-another"])
def test_a_session_cancelled_while_it_starts_leaves_no_session_folder(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      stage: str) -> None:
    import h3bridge.engines.lock as lock_module
    parent = tmp_path / "tmp"          # h3's /tmp, privately: other programs' sessions stay out of it
    parent.mkdir()
    monkeypatch.setattr(lock_module, "SESSION_DIR_PARENT", str(parent))
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
