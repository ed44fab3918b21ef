"""Reading a path a user named only when it is the kind of file h3bridge expects.

Opening a named pipe (FIFO) blocks until a writer appears, and reading a device such as
/dev/zero never ends: a model folder, a LoRA base, a storyboard's first frame, a job folder's
manifest or a `--library-path` that is one of those would hang h3bridge or fill a disk. Every
place that reads or copies such a path goes through here:

* `non_regular_kind(path)`: what it is when it is not a regular file (stat only, never opened);
* `open_regular(path, refuse)`: open it with O_NONBLOCK (and O_NOFOLLOW when asked), check the
  opened descriptor with fstat (so a FIFO swapped in after a stat is never waited on), and only
  then hand back an ordinary blocking file object;
* `sha256_regular`, `copy_regular`, `check_regular`: hashing, copying and probing through it;
* `read_regular_capped` (and `_text`, `_json`): a small file (a record, a config, a manifest) read
  whole only when it is at most the size the caller states, so a record that is 200 MiB of spaces
  or a link to /dev/zero is refused instead of read into memory;
* `read_announced`: the bytes a file's own length prefix announces (a safetensors header), only
  up to the caller's cap.

`refuse(path, kind)` makes the exception for a path that is not a regular file, in the words of
the interface the user is in (a model's IntegrityError, a LoRA fold's LoraError, a storyboard's
RequestError, ...), and `too_large(path, size, cap)` the one for a file over the caller's cap;
this module only knows the kinds and the sizes.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import BinaryIO, Callable

Refuse = Callable[[Path, str], BaseException]
# (path, size seen or announced, the caller's cap in bytes) -> the exception to raise
TooLarge = Callable[[Path, int, int], BaseException]

HASH_CHUNK = 1 << 20
# The kinds that hang a reader (FIFO, socket) or never end (character and block devices).
UNENDING_KINDS = ("a named pipe (FIFO)", "a character device", "a block device", "a socket")


def describe_mode(mode: int) -> str | None:
    """A stat mode in plain words when it is not a regular file ("a named pipe (FIFO)"); None for one."""
    if stat.S_ISREG(mode):
        return None
    for test, words in ((stat.S_ISFIFO, UNENDING_KINDS[0]), (stat.S_ISCHR, UNENDING_KINDS[1]),
                        (stat.S_ISBLK, UNENDING_KINDS[2]), (stat.S_ISSOCK, UNENDING_KINDS[3]),
                        (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return words
    return "not a regular file"


def non_regular_kind(path: str | os.PathLike[str]) -> str | None:
    """What `path` is (symlinks followed) when it is not a regular file, e.g. "a character
    device"; None for a regular file, and for a path that cannot be stat'ed for another reason
    than a dangling link (whoever opens it reports that error). Only stats."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else None
    except OSError:
        return None
    return describe_mode(mode)


def not_a_folder(path: str | os.PathLike[str]) -> str | None:
    """What `path` is, in words with where a link points ("a named pipe (FIFO)", "a file (a symbolic
    link to ...)"), when something that is not a folder stands there; None for a folder or nothing.
    Only stats: for a folder argument refused before anything opens it."""
    if os.path.isdir(path) or not os.path.lexists(path):
        return None
    return f"{non_regular_kind(path) or 'a file'}{symlink_note(path)}"


def symlink_note(path: str | os.PathLike[str]) -> str:
    """" (a symbolic link to TARGET)" when `path` is a link, else "": where a device came from."""
    return f" (a symbolic link to {os.path.realpath(path)})" if os.path.islink(path) else ""


class NotRegularFileError(OSError):
    """`path` is not a regular file (`kind` says what it is): for callers that treat it as any other
    file they cannot read (a digest that is then unknown, a job file that is then redone)."""

    def __init__(self, path: Path, kind: str) -> None:
        super().__init__(f"{path} is {kind}{symlink_note(path)}, not a regular file")
        self.path = path
        self.kind = kind


def not_regular(path: Path, kind: str) -> NotRegularFileError:
    """A `refuse` for callers that handle it as an OSError."""
    return NotRegularFileError(path, kind)


def open_regular_fd(path: str | os.PathLike[str], refuse: Refuse, *, follow_symlinks: bool = True) -> int:
    """A blocking read-only descriptor of `path`, only if it is a regular file (else `refuse`).

    Stats first (a FIFO is not even opened), then opens with O_NONBLOCK (a FIFO or a device swapped
    in meanwhile returns at once) and O_NOFOLLOW unless `follow_symlinks`, and checks the opened
    descriptor with fstat. OSError (missing, unreadable, a symlink with follow_symlinks False)
    passes through for the caller to word."""
    path = Path(path)
    if follow_symlinks:
        kind = non_regular_kind(path)
        if kind is not None:
            raise refuse(path, kind)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    descriptor = os.open(path, flags)
    try:
        kind = describe_mode(os.fstat(descriptor).st_mode)
        if kind is not None:
            raise refuse(path, kind)
        os.set_blocking(descriptor, True)
        return descriptor
    except BaseException:
        os.close(descriptor)
        raise


def open_regular(path: str | os.PathLike[str], refuse: Refuse, *, follow_symlinks: bool = True,
                 buffering: int = -1) -> BinaryIO:
    """`open(path, "rb")` for a regular file only (see `open_regular_fd`)."""
    descriptor = open_regular_fd(path, refuse, follow_symlinks=follow_symlinks)
    return os.fdopen(descriptor, "rb", buffering=buffering)


def check_regular(path: str | os.PathLike[str], refuse: Refuse, *, follow_symlinks: bool = True) -> os.stat_result:
    """`path`'s stat if it is a regular file that can be opened for reading (else `refuse`, or OSError)."""
    descriptor = open_regular_fd(path, refuse, follow_symlinks=follow_symlinks)
    try:
        return os.fstat(descriptor)
    finally:
        os.close(descriptor)


def sha256_regular(path: str | os.PathLike[str], refuse: Refuse, *, follow_symlinks: bool = True) -> str:
    """The SHA-256 of a regular file's bytes (anything else: `refuse`; OSError passes through)."""
    digest = hashlib.sha256()
    with open_regular(path, refuse, follow_symlinks=follow_symlinks, buffering=0) as handle:
        buffer = bytearray(HASH_CHUNK)
        view = memoryview(buffer)
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


class FileTooLargeError(OSError):
    """`path` holds more than the caller's cap (`size` bytes seen or announced, `cap` allowed): for
    callers that treat it as any other file they cannot read."""

    def __init__(self, path: Path, size: int, cap: int) -> None:
        super().__init__(f"{path} holds {format_size(size)}, over the {format_size(cap)} such a file can hold")
        self.errno = errno.EFBIG
        self.path = path
        self.size = size
        self.cap = cap


def too_large(path: Path, size: int, cap: int) -> FileTooLargeError:
    """A `too_large` for callers that handle it as an OSError."""
    return FileTooLargeError(path, size, cap)


def format_size(size: int) -> str:
    """A byte count for a message: "512 B", "3.5 KiB", "256 MiB"."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f}".removesuffix(".0") + f" {unit}"
    raise AssertionError("unreachable")


def read_announced(handle: BinaryIO, path: str | os.PathLike[str], count: int, cap: int, too_large: TooLarge) -> bytes:
    """The `count` bytes a file's own length field announces (a safetensors header), read from
    `handle` only when `count` is at most `cap`: a length that claims 200 MiB is refused before a
    byte of it is read. Fewer bytes come back when the file ends first (the caller words that)."""
    if count > cap:
        raise too_large(Path(path), count, cap)
    return handle.read(count)


def read_regular_capped(path: str | os.PathLike[str], cap: int, refuse: Refuse, too_large: TooLarge, *,
                        follow_symlinks: bool = True) -> bytes:
    """A small regular file's bytes, only when it holds at most `cap` bytes (else `too_large`, before
    anything is read; a file that grows past the cap while read too); anything but a regular file
    is `refuse`d. OSError (missing, unreadable) passes through for the caller to word."""
    with open_regular(path, refuse, follow_symlinks=follow_symlinks) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > cap:
            raise too_large(Path(path), size, cap)
        data = handle.read(cap + 1)
    if len(data) > cap:
        raise too_large(Path(path), len(data), cap)
    return data


def read_text_capped(path: str | os.PathLike[str], cap: int, refuse: Refuse, too_large: TooLarge, *,
                     follow_symlinks: bool = True, encoding: str = "utf-8") -> str:
    """`read_regular_capped` decoded (UnicodeDecodeError, a ValueError, for bytes that are not text)."""
    return read_regular_capped(path, cap, refuse, too_large, follow_symlinks=follow_symlinks).decode(encoding)


def read_json_capped(path: str | os.PathLike[str], cap: int, refuse: Refuse, too_large: TooLarge, *,
                     follow_symlinks: bool = True) -> object:
    """`read_text_capped` parsed as JSON (ValueError for text that is not JSON)."""
    return json.loads(read_text_capped(path, cap, refuse, too_large, follow_symlinks=follow_symlinks))


def copy_regular(source: str | os.PathLike[str], target: str | os.PathLike[str], refuse: Refuse) -> None:
    """Copy a regular file's bytes and times to `target` (created, never an existing file); a
    source that is anything else is refused before a byte is written, and no more than the size
    the opened file had is ever copied."""
    with open_regular(source, refuse, buffering=0) as reader:
        size = os.fstat(reader.fileno()).st_size
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            try:
                done = _copy_bytes(reader.fileno(), descriptor, size)
            finally:
                os.close(descriptor)
            if done != size:
                raise OSError(errno.EIO, "the file shrank while it was copied", str(source))
        except BaseException:
            os.unlink(target)
            raise
    shutil.copystat(source, target)


def _copy_bytes(source: int, target: int, size: int) -> int:
    """Up to `size` bytes from one descriptor to the other: the kernel's in-place copy where the
    platform has it (copy_file_range), else read/write."""
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < size:
                count = os.copy_file_range(source, target, min(size - done, 1 << 30))
                if count == 0:
                    return done
                done += count
            return done
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                raise
    while done < size:
        chunk = os.read(source, min(HASH_CHUNK, size - done))
        if not chunk:
            break
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view):]
        done += len(chunk)
    return done


__all__ = ["FileTooLargeError", "NotRegularFileError", "Refuse", "TooLarge", "UNENDING_KINDS", "check_regular", "copy_regular",
           "describe_mode", "format_size", "non_regular_kind", "not_a_folder", "not_regular", "open_regular", "open_regular_fd",
           "read_announced", "read_json_capped", "read_regular_capped", "read_text_capped", "sha256_regular",
           "symlink_note", "too_large"]
