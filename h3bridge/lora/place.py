"""Putting a base model's files into the folded model's folder without paying for them twice.

For each file the fold does not rewrite, in order:
  1. a copy-on-write clone: APFS `clonefile(2)` on macOS, the FICLONE ioctl on Linux (Btrfs, XFS,
     bcachefs, OCFS2): a new inode sharing the blocks, costing no space, independent of the base
     from then on;
  2. else a hard link, for weights only (*.safetensors, not small files), when both folders are on
     one file system. Safe for weights: h3 and h3bridge only read them, and the tools that replace
     weights (huggingface downloads, this fold) write a new file and rename it, which leaves the
     other name's inode alone; the fold itself never writes to a linked file (rewritten shards are
     new files). Small files (configs, tokenizer, index JSON) are copied, so editing one in one
     model never changes the other;
  3. else a copy (files.copy_regular, the kernel's in-place copy where it can).
Only regular files are placed: a FIFO, a device (a stray `notes.txt` linked to /dev/zero) or a
socket is refused before anything is written (it would hang the fold or fill the disk), and the
source is opened without blocking and checked again once open (files.open_regular).
Rewritten shards start as a clone when the file system has them (only the rewritten blocks then
take new space); otherwise they are written whole (`write_ranges`), untouched ranges copied by
`os.copy_file_range` where the platform has it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import sys
from pathlib import Path

from ..errors import LoraError
from ..safeio.paths import copy_regular, non_regular_kind, open_regular, symlink_note
from ..runnable import h3bridge_command

CLONE, HARDLINK, COPY = "clone", "hardlink", "copy"
_FICLONE = 0x40049409              # linux/fs.h: _IOW(0x94, 9, int)
_COPY_CHUNK = 16 * 1024 * 1024
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM,
                getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}


def not_a_model_file(path: Path, kind: str) -> LoraError:
    """The refusal of a base model entry the fold cannot copy (a FIFO, a device, a socket, a dangling link)."""
    return LoraError(f"the base model holds {path}, which is {kind}{symlink_note(path)}, not a file: the fold copies "
                     "every file of the base model and would hang or fill the disk on it",
                     hint=f"remove it from the base model (`rm {path}`; `{h3bridge_command('info', '-d', 'MODEL_DIR')}` lists such entries) "
                          "and fold again")


def _clonefile_darwin(source: Path, target: Path) -> bool:
    library = ctypes.CDLL(ctypes.util.find_library("c") or "libc.dylib", use_errno=True)
    function = library.clonefile
    function.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32]
    function.restype = ctypes.c_int
    if function(os.fsencode(source), os.fsencode(target), 0) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(target))


def _ficlone_linux(source: Path, target: Path) -> bool:
    import fcntl
    with open_regular(source, not_a_model_file) as reader:
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.ioctl(descriptor, _FICLONE, reader.fileno())
        except OSError as error:
            os.close(descriptor)
            os.unlink(target)
            if error.errno in _UNSUPPORTED:
                return False
            raise
        os.close(descriptor)
    shutil.copystat(source, target)
    return True


def clone_file(source: Path, target: Path) -> bool:
    """A copy-on-write clone of `source` at `target` (which must not exist); False when the file
    system (or platform) has none, leaving nothing at `target`."""
    if sys.platform == "darwin":
        return _clonefile_darwin(source, target)
    if sys.platform.startswith("linux"):
        return _ficlone_linux(source, target)
    return False


def place_file(source: Path, target: Path, *, allow_hardlink: bool = True) -> str:
    """Put an unchanged copy of `source` at `target`; returns how (CLONE, HARDLINK or COPY)."""
    weights = source.name.endswith(".safetensors")     # by the model's name for it, not a HF blob's hash name
    kind = non_regular_kind(source)
    if kind is not None:
        raise not_a_model_file(source, kind)
    source = source.resolve()                 # a HF snapshot's symlink: the blob itself
    if clone_file(source, target):
        return CLONE
    if allow_hardlink and weights:
        try:
            os.link(source, target)
            return HARDLINK
        except OSError as error:
            if error.errno not in _UNSUPPORTED | {errno.EMLINK, errno.EACCES}:
                raise
    copy_regular(source, target, not_a_model_file)
    return COPY


def copy_range(source_fd: int, target_fd: int, offset: int, length: int) -> None:
    """Copy `length` bytes at `offset` from one file to the same offset of the other."""
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < length:
                count = os.copy_file_range(source_fd, target_fd, length - done, offset + done, offset + done)
                if count == 0:
                    break
                done += count
        except OSError as error:
            if error.errno not in _UNSUPPORTED:
                raise
    while done < length:
        chunk = os.pread(source_fd, min(_COPY_CHUNK, length - done), offset + done)
        if not chunk:
            raise OSError(errno.EIO, "source shrank while copying", str(source_fd))
        os.pwrite(target_fd, chunk, offset + done)
        done += len(chunk)


def clone_supported(folder: Path) -> bool:
    """Whether `folder`'s file system clones files (probed with two tiny files, removed at once)."""
    import tempfile
    descriptor, name = tempfile.mkstemp(prefix=".h3bridge-clone-probe-", dir=folder)
    probe = Path(name)
    clone = probe.with_name(probe.name + "-clone")
    try:
        os.write(descriptor, b"h3bridge")
        os.close(descriptor)
        return clone_file(probe, clone)
    except OSError:
        return False
    finally:
        probe.unlink(missing_ok=True)
        clone.unlink(missing_ok=True)


def same_file_system(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev
