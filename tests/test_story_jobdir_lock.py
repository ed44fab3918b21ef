"""The story job folder's lock (story/jobdir.py): one run at a time, and no hidden `.lock` left in
a folder once its run ended (issue 30)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from h3bridge.story.jobdir import LOCK_NAME, JobDir, JobDirError

HOLD = """
import sys
from h3bridge.story.jobdir import JobDir
with JobDir(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_finished_run_leaves_no_lock_file(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    with JobDir(folder):
        assert (folder / LOCK_NAME).exists()
    assert folder.is_dir() and not (folder / LOCK_NAME).exists()
    with JobDir(folder):          # and the next run takes the folder again
        pass
    assert list(folder.iterdir()) == []


def test_a_second_run_is_still_refused_while_one_runs(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(JobDirError, match="another h3bridge story is running") as busy:
            with JobDir(folder):
                pass
        # the fix is data (issue 34.3): the CLI says it as --job-dir, Python as job_dir=
        from h3bridge.cli.engine import cli_hint
        assert "--job-dir DIR" in (cli_hint(busy.value) or "") and "job_dir=DIR" in (busy.value.hint or "")
        assert (folder / LOCK_NAME).exists()        # the refused run removed nothing of the holder's
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0 and not (folder / LOCK_NAME).exists()
    with JobDir(folder):
        pass


def test_a_run_that_opened_the_lock_file_before_it_was_removed_is_refused(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The race removing the file opens: a second run opens the lock file, the first run ends
    (removes the file, releases), and only then does the second run's flock succeed, on a file
    no longer in the folder. filelock does not count that as acquired: the run is refused (busy)
    rather than running beside a third one that creates a new lock file."""
    native = pytest.importorskip("filelock._native._unix", reason="this filelock has another layout")
    if not hasattr(native, "lock_fd_nonblocking"):
        pytest.skip("this filelock has another layout")
    folder = tmp_path / "job"
    first = JobDir(folder).__enter__()
    real_lock = native.lock_fd_nonblocking
    ended: list[bool] = []

    def first_run_ends_in_between(fd: int) -> bool:
        if not ended:
            ended.append(True)
            first.__exit__(None, None, None)         # removes the file, then releases its lock
        return real_lock(fd)

    monkeypatch.setattr(native, "lock_fd_nonblocking", first_run_ends_in_between)
    with pytest.raises(JobDirError, match="another h3bridge story is running"):
        with JobDir(folder):
            pass
    assert ended == [True] and not (folder / LOCK_NAME).exists()
    monkeypatch.undo()
    with JobDir(folder):                          # the next run takes the folder
        pass


def test_a_run_starting_as_the_first_ends_excludes_every_later_run(tmp_path: Path) -> None:
    """A second run takes the lock the instant the first releases it: a third run must still be
    refused while the second runs. (Were the file removed after the release, the second run could
    hold the removed file while the third made a new one: two runs in one folder.)"""
    folder = tmp_path / "job"
    first = JobDir(folder).__enter__()
    lock = first._lock
    assert lock is not None
    real_release = lock.release
    second: list[JobDir] = []

    def release(*args: object, **kwargs: object) -> None:
        real_release(*args, **kwargs)
        second.append(JobDir(folder).__enter__())        # starts right at the release

    lock.release = release  # type: ignore[method-assign]
    first.__exit__(None, None, None)
    assert len(second) == 1
    try:
        with pytest.raises(JobDirError, match="another h3bridge story is running"):
            with JobDir(folder):
                pass
    finally:
        second[0].__exit__(None, None, None)
    assert not (folder / LOCK_NAME).exists()
