"""Unpacking a tar archive (.tar, .tar.gz, .tar.bz2, .tar.xz) a user handed over, safely.

The rules are tarfile's own `data` filter (PEP 706): no absolute member names, nothing that ends up
outside the target folder (`..`, or a link leading out of it), no device nodes or FIFOs, no
setuid/setgid/sticky bits or group/other write bits, no owner taken from the archive. Where the
running Python has extraction filters, tarfile applies them; where it lacks them (Python < 3.10.12,
3.11.4), the same rules are enforced here by hand, so an archive unpacks the same way on every
Python h3bridge supports.

On top of the filter, every unpack states its caps (`UnpackLimits`: total unpacked bytes and
member count). The archive's headers are walked first, and an archive over a cap or holding a
member the rules refuse is refused before a single file is written. A truncated or damaged
archive (EOFError, zlib/lzma errors, tarfile's ReadError) is an `ArchiveError`, never a traceback.
The archive itself is opened only if it is a regular file (a FIFO would hang the open, /dev/zero
never ends).
"""
from __future__ import annotations

import copy
import errno
import lzma
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ..errors import H3BridgeError
# the path reader (moving to safeio/paths.py): the archive is opened only if it is a regular file
from .paths import open_regular

# What reading a damaged or truncated archive raises inside tarfile and its decompressors.
_DAMAGED = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError)
# The data filter's refusals (a TarError too); a Python without filters has no such class.
_FILTER_REFUSAL = getattr(tarfile, "FilterError", ())


class ArchiveError(H3BridgeError):
    """An archive cannot be unpacked as asked: damaged or truncated, over a stated cap, or holding
    a member the rules refuse (`member` names it). Raised before anything ran; whoever calls
    `unpack_tar` may re-word it in the words of its own interface."""

    before_start = True

    def __init__(self, message: str, *, archive: Path, member: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.archive = archive
        self.member = member


@dataclass(frozen=True)
class UnpackLimits:
    """The caps a caller states for one unpack: what its archive can reasonably hold."""

    max_total_bytes: int      # sum of the regular members' sizes
    max_members: int          # entries of any kind (files, folders, links)

    @property
    def max_archive_bytes(self) -> int:
        """The largest archive file that can hold no more than these caps: every member's
        contents plus a header and a padding block each, and the two end blocks (an uncompressed
        tar; a compressed one is smaller). A larger file is refused before a byte of it is read
        (a 64 GiB sparse file was read to the end)."""
        return self.max_total_bytes + (2 * self.max_members + 2) * tarfile.BLOCKSIZE


def refuse_oversized(handle: BinaryIO, archive: Path, limits: UnpackLimits, fix: str) -> None:
    """ArchiveError if the opened `archive` is larger than any archive within `limits` can be."""
    size = os.fstat(handle.fileno()).st_size
    if size > limits.max_archive_bytes:
        raise ArchiveError(f"{archive} is {size:,} bytes, more than an archive within the caps can be "
                           f"({limits.max_archive_bytes:,} bytes for at most {limits.max_total_bytes:,} bytes in "
                           f"{limits.max_members:,} members)", archive=archive, hint=fix)


def has_extraction_filters() -> bool:
    """Whether the running Python's tarfile has PEP 706's extraction filters."""
    return hasattr(tarfile, "data_filter")


@dataclass
class UnpackReport:
    members: int
    total_bytes: int
    filtered_by: str          # "tarfile data filter" or "h3bridge's checks (no extraction filters)"


def unpack_tar(archive: str | os.PathLike[str], into: str | os.PathLike[str], limits: UnpackLimits,
               *, hint: str | None = None) -> UnpackReport:
    """Unpack `archive` into the existing folder `into` under the data filter's rules and `limits`.

    Raises ArchiveError (with `hint`, the caller's fix, when given) for an archive that is not a
    regular file, damaged or truncated, over a cap, or holding a refused member: in all but the
    damaged-data case before anything is written. OSError from writing (a full disk) passes."""
    archive = Path(archive)
    into = Path(into)
    fix = hint or "give an archive of regular files and folders (e.g. one made by `git archive`)"

    def refuse_kind(path: Path, kind: str) -> ArchiveError:
        return ArchiveError(f"{path} is {kind}, not an archive file", archive=path, hint=fix)

    try:
        handle = open_regular(archive, refuse_kind)
    except OSError as error:
        raise ArchiveError(f"cannot read {archive}: {error.strerror or error}", archive=archive, hint=fix) from None
    with handle:
        refuse_oversized(handle, archive, limits, fix)
        try:
            with tarfile.open(fileobj=handle, mode="r:*") as tar:
                members, total = _walk(tar, archive, into, limits, fix)
                if has_extraction_filters():
                    tar.extractall(into, members=members, filter="data")
                    how = "tarfile data filter"
                else:
                    tar.extractall(into, members=[_without_unsafe_bits(m) for m in members])
                    how = "h3bridge's checks (no extraction filters)"
        except ArchiveError:
            raise
        except _FILTER_REFUSAL as error:      # the data filter refused what the walk let through
            raise ArchiveError(f"{archive} holds a member the data filter refuses: {error}", archive=archive,
                               hint=fix) from None
        except _DAMAGED as error:
            raise ArchiveError(f"{archive} is damaged or truncated ({type(error).__name__}: {error})",
                               archive=archive, hint=fix) from None
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            # gzip's BadGzipFile, bz2's invalid data: the archive's bytes, not the disk
            raise ArchiveError(f"{archive} is damaged or truncated ({error})", archive=archive, hint=fix) from None
    return UnpackReport(members=len(members), total_bytes=total, filtered_by=how)


def _walk(tar: tarfile.TarFile, archive: Path, into: Path, limits: UnpackLimits,
          fix: str) -> tuple[list[tarfile.TarInfo], int]:
    """Every member's header, checked against the rules and the caps (nothing written yet).
    Stops reading as soon as a cap is passed: a huge archive is never read through to be refused."""
    members: list[tarfile.TarInfo] = []
    total = 0
    root = os.path.realpath(into)
    while (member := tar.next()) is not None:
        members.append(member)
        if len(members) > limits.max_members:
            raise ArchiveError(f"{archive} holds more than {limits.max_members:,} members, more than it "
                               "can reasonably hold: refused before unpacking", archive=archive, hint=fix)
        if member.isreg():
            total += member.size
            if total > limits.max_total_bytes:
                raise ArchiveError(f"{archive} unpacks to more than {_mib(limits.max_total_bytes)}, more than it "
                                   "can reasonably hold: refused before unpacking", archive=archive,
                                   member=member.name, hint=fix)
        problem = _refused(member, root)
        if problem is not None:
            raise ArchiveError(f"{archive} holds an unsafe member {member.name!r}: {problem}; nothing was unpacked",
                               archive=archive, member=member.name, hint=fix)
    return members, total


def _refused(member: tarfile.TarInfo, root: str) -> str | None:
    """Why the data filter's rules refuse `member` (None when they do not), checked by hand so that
    the rules hold on a Python without extraction filters too."""
    name = PurePosixPath(member.name)
    if not name.parts or member.name in (".", "./"):
        return None if member.isdir() else "an empty name"
    if name.is_absolute() or member.name.startswith(("/", os.sep)):
        return "an absolute path"
    if ".." in name.parts:
        return "a path with '..' in it"
    if member.ischr() or member.isblk():
        return "a device node"
    if member.isfifo():
        return "a named pipe (FIFO)"
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return "not a file, folder or link"
    target = os.path.realpath(os.path.join(root, member.name))
    if os.path.commonpath([root, target]) != root:
        return "it would be written outside the folder (through a link)"
    if member.issym() or member.islnk():
        if member.linkname.startswith(("/", os.sep)) or PurePosixPath(member.linkname).is_absolute():
            return f"a link to the absolute path {member.linkname!r}"
        base = os.path.dirname(target) if member.issym() else root
        pointed = os.path.realpath(os.path.join(base, member.linkname))
        if os.path.commonpath([root, pointed]) != root:
            return f"a link to {member.linkname!r}, outside the folder"
    return None


def _without_unsafe_bits(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """What the data filter does to a member it lets through, by hand: no setuid/setgid/sticky or
    group/other write bits, owner read/write on files, and the unpacking user as owner."""
    cleaned = copy.copy(member)
    mode = member.mode & 0o777 & ~(stat.S_IWGRP | stat.S_IWOTH)
    if member.isreg() or member.islnk():
        mode |= stat.S_IRUSR | stat.S_IWUSR
        if not mode & stat.S_IXUSR:
            mode &= ~(stat.S_IXGRP | stat.S_IXOTH)
    elif member.isdir():
        mode |= stat.S_IRWXU
    cleaned.mode = mode
    cleaned.uid, cleaned.gid = os.getuid(), os.getgid()
    cleaned.uname = cleaned.gname = ""
    return cleaned


def _mib(count: int) -> str:
    return f"{count / (1 << 20):,.0f} MiB"


__all__ = ["ArchiveError", "UnpackLimits", "UnpackReport", "has_extraction_filters", "unpack_tar"]
