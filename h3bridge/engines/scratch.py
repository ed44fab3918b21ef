"""h3bridge's own scratch: the names of the temporary files and folders its engines make, and
their clean-up. These names are the only things an engine record may make h3bridge remove
(`own_leftover`), so they are defined here once, for the engines that make them (oneshot.py,
output.py, disk.py, session.py) and the lock's recovery after a holder died (lock.py).
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from ..safeio.outputs import STAGING_MARK, STAGING_PREFIX

# h3bridge's own scratch, the only things an engine record may make it remove (own_leftover).
WORKDIR_PREFIX = "h3bridge-"           # tempfile.mkdtemp(prefix=...) of the one-shot engine
# a clip before its atomic rename: safeio.outputs.staging_path of an .mp4
STAGING_SUFFIX = STAGING_MARK + ".mp4"
_STAGING_NAME = re.compile(re.escape(STAGING_PREFIX) + r"[0-9a-f]{12}" + re.escape(STAGING_SUFFIX))
# mkdtemp's random part, after the pid of the process that made it (make_work_folder; older
# h3bridge made them without).
_WORKDIR_NAME = re.compile(r"h3bridge-(?:(?P<pid>[1-9][0-9]*)-)?[a-z0-9_]{8}")
# disk.py's probe of a folder's writability, `.h3bridge-probe-<pid>-XXXXXXXX` (mkstemp).
PROBE_PREFIX = ".h3bridge-probe-"
_PROBE_NAME = re.compile(r"\.h3bridge-probe-(?P<pid>[1-9][0-9]*)-[a-z0-9_]{8}")
# Interactive h3 writes into mkdtemp("/tmp/h3-XXXXXX") (h3_cli.c:736) as `video-NNNN.mp4`.
SESSION_DIR_PARENT = "/tmp"
_SESSION_DIR_NAME = re.compile(r"h3-[A-Za-z0-9]{6}")
SESSION_CLIP_PATTERN = "video-[0-9]*.mp4"


def account_uid() -> int:
    """The account h3bridge acts for: records, engines and leftovers must be this user's."""
    return os.geteuid()


def remove_leftovers(entries: Sequence[str]) -> None:
    """Remove, in order, what an engine leaves behind: `DIR/` only if empty, a path whose file
    name is a glob pattern the files it matches in that (literal) folder, any other path
    outright (a folder with its contents: our own temporary one). Folder names are never
    patterns, so a user's `out [1]/` is taken as written. Best effort: what cannot go stays.
    Only for entries h3bridge made itself: what a record names goes through `own_leftover` first."""
    for entry in entries:
        folder, name = os.path.split(entry)
        pattern = name and glob.has_magic(name)
        targets = glob.glob(os.path.join(glob.escape(folder), name)) if pattern else [entry]
        for target in targets:
            try:
                if entry.endswith(os.sep):
                    os.rmdir(target)
                elif os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    os.unlink(target)
            except OSError:
                pass


def _own_folder(path: str, parent: str, name: re.Pattern[str]) -> bool:
    """`path` is a real folder (not a symlink) of this user, named like `name`, directly in `parent`."""
    try:
        info = os.lstat(path)
        parent_real = os.path.realpath(parent)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == account_uid() and name.fullmatch(os.path.basename(path)) is not None
            and os.path.realpath(os.path.dirname(path)) == parent_real)


def own_leftover(entry: str) -> bool:
    """True when a leftover read from an engine record is h3bridge's own scratch, safe to remove:
    - the one-shot engine's work folder, `<tempdir>/h3bridge-XXXXXXXX` (oneshot.py mkdtemp), or a
      file directly in it;
    - a staging file `.h3bridge-<12 hex>.partial.mp4` (engine.staging_path), a regular file;
    - the warm session's `/tmp/h3-XXXXXX/` (interactive h3's mkdtemp), or the `video-[0-9]*.mp4`
      clips pattern in it (session_dir_leftovers);
    each existing and owned by this user, with no `..` and no symlink on the way."""
    if not os.path.isabs(entry) or ".." in entry.split(os.sep):
        return False
    folder, name = os.path.split(entry)
    if not name:                                   # `DIR/`: the session folder, if empty
        return _own_folder(folder, SESSION_DIR_PARENT, _SESSION_DIR_NAME)
    if name == SESSION_CLIP_PATTERN:
        return _own_folder(folder, SESSION_DIR_PARENT, _SESSION_DIR_NAME)
    if glob.has_magic(name):
        return False
    if _own_folder(entry, tempfile.gettempdir(), _WORKDIR_NAME):
        return True
    try:
        info = os.lstat(entry)
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_uid != account_uid():
        return False
    return _STAGING_NAME.fullmatch(name) is not None or _own_folder(folder, tempfile.gettempdir(), _WORKDIR_NAME)


def _maker_gone(pid: int, made: float) -> bool:
    """The process `pid` that made a file last changed at `made` (its ctime) runs no more: there is
    no such process, it is a zombie, or the process now called `pid` started after the file was
    made (the pid was used again). A process that started before and still runs is its maker."""
    import psutil
    try:
        process = psutil.Process(pid)
        return process.status() == psutil.STATUS_ZOMBIE or process.create_time() > made
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def remove_dead_scratch(folder: Path | str) -> None:
    """Remove from `folder` the scratch h3bridge processes that died (SIGKILL, a power cut) left
    there, and only that: a writability probe (`.h3bridge-probe-<pid>-*`, a regular file) and, in
    the system temporary folder, a work folder (`h3bridge-<pid>-*`, a real folder), each owned by
    this user and named for a process that no longer runs (`_maker_gone`). The lock's orphan
    recovery removes what an engine was writing; this removes what was made before any engine
    started (a host killed while it waited for the lock). Best effort."""
    folder = str(folder)
    in_temporary = os.path.realpath(folder) == os.path.realpath(tempfile.gettempdir())
    try:
        with os.scandir(folder) as entries:
            candidates = [(entry.name, entry.path) for entry in entries if entry.name.startswith((
                PROBE_PREFIX, WORKDIR_PREFIX))]
    except OSError:
        return
    for name, path in candidates:
        probe = _PROBE_NAME.fullmatch(name)
        work = _WORKDIR_NAME.fullmatch(name) if in_temporary else None
        match = probe or work
        if match is None or match["pid"] is None:
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        kind_ok = stat.S_ISREG(info.st_mode) if probe else stat.S_ISDIR(info.st_mode)
        if not kind_ok or info.st_uid != account_uid() or not _maker_gone(int(match["pid"]), info.st_ctime):
            continue
        try:
            if probe:
                os.unlink(path)
            else:
                shutil.rmtree(path)
        except OSError:
            pass


def make_work_folder() -> Path:
    """A new private work folder for one job in the system temporary folder, named for this
    process (`h3bridge-<pid>-XXXXXXXX`) so that, should it die before removing it, a later job
    can prove it dead and remove it (`remove_dead_scratch`, done here first)."""
    remove_dead_scratch(tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))


def own_session_dirs() -> set[str]:
    """This user's warm-session folders (`/tmp/h3-XXXXXX`, interactive h3's mkdtemp) that exist
    now: real folders, not symlinks (see SessionEngine, which compares them before and after a
    session that was stopped while it started)."""
    try:
        with os.scandir(SESSION_DIR_PARENT) as entries:
            names = [entry.path for entry in entries if _SESSION_DIR_NAME.fullmatch(entry.name)]
    except OSError:
        return set()
    return {path for path in names if _own_folder(path, SESSION_DIR_PARENT, _SESSION_DIR_NAME)}


def new_session_dir(before: Iterable[str], *, made_after: float | None = None) -> str | None:
    """The one session folder of this user's that is not among `before` (and, with `made_after`,
    was made since), else None. Only one: the machine-wide lock was held all that while, so no
    other h3bridge engine made one; two new ones mean someone else's h3 did, and neither is ours."""
    appeared = []
    for path in own_session_dirs() - set(before):
        try:
            if made_after is None or os.lstat(path).st_ctime >= made_after:
                appeared.append(path)
        except OSError:
            pass
    return appeared[0] if len(appeared) == 1 else None


def session_dir_leftovers(folder: str | os.PathLike[str]) -> list[str]:
    """What is ours to remove from h3's session folder, whoever removes it (the session, or the
    next lock holder after its host died): the partial `video-NNNN.mp4` clips, then the folder if
    nothing else is in it."""
    return [os.path.join(folder, SESSION_CLIP_PATTERN), f"{os.fspath(folder)}{os.sep}"]


__all__ = ["PROBE_PREFIX", "SESSION_CLIP_PATTERN", "SESSION_DIR_PARENT", "STAGING_SUFFIX", "WORKDIR_PREFIX",
           "make_work_folder", "new_session_dir", "own_leftover", "own_session_dirs", "remove_dead_scratch",
           "remove_leftovers", "session_dir_leftovers"]
