"""Writing an output: the one way h3bridge gives a file its name.

Every output (a clip, a film, a PNG, a fleet YAML, a folded model folder, a record or manifest
h3bridge keeps for itself) goes through here, so one set of rules holds everywhere:

* `check_output(path, overwrite=...)`, before any work: the name is not a folder, a device node,
  a FIFO, a socket or a symbolic link (dangling or not), whatever `overwrite` says; without
  `overwrite` nothing holds the name; the parent exists or can be created, and takes new entries.
* `staged_output(path, overwrite=...)`: a context yielding a `StagedOutput`, a hidden name beside
  the target (same file system, so the rename is atomic) that the caller (or a program it runs)
  writes; `publish()` fsyncs it and gives it the name; leaving the block any other way (an error,
  a cancel, Ctrl-C) removes it. `write_output(path, data, ...)` does all of that for bytes.
* Publishing with `overwrite` replaces only a regular file (checked again right before the rename);
  without it the file is hard-linked to its name, which fails if the name is taken, so nothing
  that appeared meanwhile is ever replaced. On a file system without hard links the name is
  checked just before an ordinary rename (the only window left).
* `publish_folder(staged, target)`: a folder made under a staging name, renamed into place only if
  nothing holds the name (renameat2 RENAME_NOREPLACE where the kernel has it).

Errors are the project's own: `RequestError` (field = how the interface names the output, "-o" or
"output") for a name that can never be written, `OutputExistsError` for a name that is taken
(`before_start` False when it was taken while the work ran). `allow_overwrite` is how the user
lifts that refusal, as data (h3bridge.fixes: `ALLOW_OVERWRITE`, said `--overwrite` on the command
line and `overwrite=True` in Python by the interface that shows it). OSError (a full disk) passes through for
the caller to word, after the staged file is removed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import stat
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path
from typing import Iterator

from ..errors import OutputExistsError, RequestError
from ..fixes import Fix, changes

# A file on its way to its name: hidden, unique, short whatever the target's name (a name near the
# file system's limit must still fit) and keeping the target's suffix (FFmpeg picks a muxer by it).
# engines/lock.py recognises a clip's leftovers by this shape.
STAGING_PREFIX = ".h3bridge-"
STAGING_MARK = ".partial"
# How a library caller's user allows overwriting, as data (h3bridge.fixes): each interface says it.
ALLOW_OVERWRITE = Fix("allow overwriting ({})", (changes(overwrite=True),))


def _or_allow(allow_overwrite: "str | Fix") -> "str | Fix":
    """"choose another name, or <how to allow overwriting>", kept as a Fix when it is one."""
    if isinstance(allow_overwrite, Fix):
        return Fix("choose another name, or " + allow_overwrite.text, allow_overwrite.groups)
    return f"choose another name, or {allow_overwrite}"


def staging_path(target: Path) -> Path:
    """The hidden name `target` is written under before it is published, in its own folder."""
    return target.parent / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}{STAGING_MARK}{target.suffix}"


def kind_of(path: Path) -> str | None:
    """What holds the name `path` (the name itself, links not followed) when it is not a regular
    file: "a character device", "a symbolic link to /dev/full", ...; None for a regular file or
    nothing."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:         # nothing there, or a parent that is not a folder (check_output words that)
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return f"a symbolic link to {os.readlink(path)}" + ("" if os.path.exists(path) else " (which does not exist)")
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                        (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def _name_limit(folder: Path) -> int:
    """The longest file name the folder's file system takes (NAME_MAX, 255 on APFS and ext4)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def nearest_existing(folder: Path) -> Path:
    """`folder`, or its nearest ancestor that exists (what must take the new entries)."""
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def check_output(path: str | os.PathLike[str], *, overwrite: bool, field: str = "output",
                 allow_overwrite: "str | Fix" = ALLOW_OVERWRITE, make_parents: bool = True,
                 folder_output: bool = False, label: str | None = None) -> Path:
    """The absolute output path, checked before any work starts (see the module's rules).

    Messages name the path as the user gave it, after `label` (default: `field`, e.g. "-o").
    `make_parents`: missing parents are created when the output is staged (else refused now).
    `folder_output`: the output is a folder made whole (a folded model): any existing name is
    taken, and `overwrite` is not offered."""
    text = os.fspath(path)
    label = field if label is None else label
    if not text:
        raise RequestError(f"{label} is empty", field=field, hint=f"give the file to write with {field}")
    given = Path(text).expanduser()
    target = given.absolute()
    if text.endswith(os.sep) and not folder_output:
        raise RequestError(f"{label} {text} names a folder", field=field,
                           hint=f"give a file name in it, e.g. {given / ('out' + (target.suffix or '.mp4'))}")
    kind = kind_of(target)
    if kind is not None:
        # Taken by something that is not a regular file: never replaced, whatever `overwrite` says.
        raise OutputExistsError(f"{label} {given} already exists and is {kind}; h3bridge writes an output only "
                                "where nothing is, or over a regular file", hint="choose another name")
    if os.path.lexists(target) and (not overwrite or folder_output):
        raise OutputExistsError(f"{label} {given} already exists",
                                hint="choose another name" if folder_output else _or_allow(allow_overwrite))
    existing = nearest_existing(target.parent)
    if existing != target.parent and not make_parents:
        raise RequestError(f"{label} {given}: the folder {given.parent} does not exist", field=field,
                           hint=f"create it first (mkdir -p {given.parent}) or write elsewhere")
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise _unwritable(label, given, field, f"{existing} is not a writable folder: {why_not_writable(existing)}")
    length = len(target.name.encode("utf-8", "surrogateescape"))
    limit = _name_limit(existing)
    if length > limit:
        raise RequestError(f"{label} {given}: the file name is {length} bytes, over this file system's {limit}",
                           field=field, hint="choose a shorter file name")
    return target


def why_not_writable(folder: Path) -> str:
    """Why a folder takes no new files, in words: not a folder, a read-only mount, or permissions."""
    if not folder.is_dir():
        return f"it is {kind_of(folder) or 'a file'}"
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "its file system is mounted read-only"
    except OSError:
        pass
    return "you have no permission to write there"


def _unwritable(label: str, given: Path, field: str, reason: str) -> RequestError:
    return RequestError(f"{label} {given}: cannot write in the folder {given.parent} ({reason})", field=field,
                        hint=f"choose an {field} in a folder you can write to")


def missing_folders(target: Path) -> list[Path]:
    """`target`'s folders that do not exist yet, deepest first (staging creates them; a failed
    job's own new folders can be taken away again, each only while still empty)."""
    missing: list[Path] = []
    folder = target.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _fsync_path(path: Path, *, folder: bool = False) -> None:
    """Flush a file (or a folder's entries) to the disk; a file system that cannot is let be."""
    try:
        descriptor = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if folder else 0))
    except OSError:
        if folder:
            return
        raise
    try:
        os.fsync(descriptor)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.EROFS, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(descriptor)


def _taken(target: Path, field: str, allow_overwrite: "str | Fix", while_working: bool) -> OutputExistsError:
    kind = kind_of(target)
    what = f"{kind}, which h3bridge never replaces" if kind else "a file"
    when = "appeared while h3bridge worked" if while_working else "is taken"
    return OutputExistsError(f"{field} {target} {when} ({what}); it was left as it was",
                             hint="choose another name" if kind or not allow_overwrite else _or_allow(allow_overwrite),
                             before_start=not while_working)


def link_new(staged: Path, target: Path) -> bool:
    """Give `staged` the name `target` only if nothing holds that name; True when done (the staged
    name is then gone), False when the name is taken."""
    try:
        os.link(staged, target)      # fails if `target` exists: no race with another writer
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.EXDEV, errno.ENOSYS):
            raise
        # A file system without hard links (exFAT, some network shares): a small window remains.
        if os.path.lexists(target):
            return False
        os.rename(staged, target)
        return True
    os.unlink(staged)
    return True


def publish(staged: Path, target: Path, *, overwrite: bool, field: str = "output",
            allow_overwrite: "str | Fix" = ALLOW_OVERWRITE) -> None:
    """Flush `staged` to the disk and give it the name `target` (see the module's rules).
    OutputExistsError (before_start False) when the name is taken by something it may not replace;
    `staged` is then left for the caller (to keep beside, or to remove)."""
    _fsync_path(staged)
    if overwrite:
        if kind_of(target) is not None:
            raise _taken(target, field, allow_overwrite, while_working=True)
        try:
            os.chmod(staged, stat.S_IMODE(os.lstat(target).st_mode))    # the replaced file's permissions stay
        except FileNotFoundError:
            pass
        os.replace(staged, target)
    elif not link_new(staged, target):
        raise _taken(target, field, allow_overwrite, while_working=True)
    _fsync_path(target.parent, folder=True)


def remove_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        pass        # a leftover staging name is harmless (hidden, recognisable) and a cleanup must not mask the error


@dataclass
class StagedOutput:
    """An output on its way: write `staged` (or have a program write it), then `publish()`."""

    target: Path
    staged: Path
    overwrite: bool
    field: str = "output"
    allow_overwrite: "str | Fix" = ALLOW_OVERWRITE
    made_folders: list[Path] = dataclass_field(default_factory=list)
    published: bool = False

    def publish(self) -> Path:
        publish(self.staged, self.target, overwrite=self.overwrite, field=self.field,
                allow_overwrite=self.allow_overwrite)
        self.published = True
        return self.target


def make_parents(target: Path, field: str = "output") -> list[Path]:
    """Create `target`'s missing folders; returns those it made, deepest first."""
    made = missing_folders(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _unwritable(field, target, field, _reason(error)) from None
    return made


def _reason(error: OSError) -> str:
    if isinstance(error, (FileExistsError, NotADirectoryError)):
        return "a file is in the way"
    return (error.strerror or type(error).__name__).lower()


def remove_empty_folders(folders: list[Path]) -> None:
    """Take away folders a failed job made, deepest first, each only while still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


@contextmanager
def staged_output(target: Path, *, overwrite: bool, field: str = "output", allow_overwrite: "str | Fix" = ALLOW_OVERWRITE,
                  create: bool = True) -> Iterator[StagedOutput]:
    """A staging name beside `target` (its folders made, the name claimed empty when `create`), removed
    on leaving unless published; folders made for it are removed again unless published."""
    made = make_parents(target, field)
    staging = StagedOutput(target=target, staged=staging_path(target), overwrite=overwrite, field=field,
                           allow_overwrite=allow_overwrite, made_folders=made)
    try:
        if create:
            try:
                os.close(os.open(staging.staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                                 0o644))
            except OSError as error:       # a read-only or full disk: found before the work, not after
                raise _unwritable(field, target, field, _reason(error)) from None
        yield staging
    finally:
        if not staging.published:
            remove_quietly(staging.staged)
            remove_empty_folders(made)


def write_output(target: str | os.PathLike[str], data: bytes | str, *, overwrite: bool, field: str = "output",
                 allow_overwrite: "str | Fix" = ALLOW_OVERWRITE, mode: int = 0o644, make_parents: bool = True) -> Path:
    """Write `data` as the output `target`: checked, staged, fsynced, published (the module's rules)."""
    path = check_output(target, overwrite=overwrite, field=field, allow_overwrite=allow_overwrite,
                        make_parents=make_parents)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with staged_output(path, overwrite=overwrite, field=field, allow_overwrite=allow_overwrite,
                       create=False) as staging:
        descriptor = os.open(staging.staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(payload)
        staging.publish()
    return path


# renameat2's RENAME_NOREPLACE (Linux 3.15+) and macOS's renamex_np RENAME_EXCL: a rename that fails
# when the name is taken, even by an empty folder (which a plain rename would silently replace).
_RENAME_NOREPLACE, _RENAME_EXCL, _AT_FDCWD = 1, 4, -100


def _rename_noreplace(source: Path, target: Path) -> bool:
    """Rename only if nothing holds `target`; False when this platform has no such call."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
        result = libc.renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target),
                                ctypes.c_uint(_RENAME_NOREPLACE))
    elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        result = libc.renamex_np(os.fsencode(source), os.fsencode(target), ctypes.c_uint(_RENAME_EXCL))
    else:
        return False
    if result != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            return False        # a kernel or file system without the flag: the plain way below
        raise OSError(code, os.strerror(code), str(target))
    return True


def rename_new(source: Path, target: Path) -> bool:
    """Rename `source` (a file, a folder, a link: moved as itself) to `target` only if nothing holds
    that name, not even an empty folder; False when it is taken (`source` then stays)."""
    try:
        if not _rename_noreplace(source, target):
            if os.path.lexists(target):
                return False
            os.rename(source, target)       # no such call here: the only window left
    except (FileExistsError, IsADirectoryError, NotADirectoryError):
        return False
    except OSError as error:
        if error.errno != errno.ENOTEMPTY:
            raise
        return False
    return True


def publish_folder(staged: Path, target: Path, *, field: str = "output") -> None:
    """Rename the finished folder `staged` to `target` only if nothing holds that name (never over a
    folder, even an empty one, nor a file or a link). OutputExistsError (before_start False) when
    taken; `staged` is then left for the caller."""
    if not rename_new(staged, target):
        raise _taken(target, field, "", while_working=True)
    _fsync_path(target.parent, folder=True)


__all__ = ["ALLOW_OVERWRITE", "STAGING_MARK", "STAGING_PREFIX", "StagedOutput", "check_output", "kind_of",
           "link_new", "make_parents", "missing_folders", "nearest_existing", "publish", "publish_folder",
           "remove_empty_folders", "rename_new", "staged_output", "staging_path", "why_not_writable",
           "write_output"]
