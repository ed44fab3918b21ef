"""h3bridge/safeio/archives.py: tar archives unpacked under the data filter's rules (by hand where
the running Python has no extraction filters), with caps stated by the caller, and a damaged
archive as the project's own error."""
from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest

from archive_helpers import make_tar, member, no_extraction_filters  # noqa: F401 (fixture)
from h3bridge.safeio.archives import ArchiveError, UnpackLimits, has_extraction_filters, unpack_tar

LIMITS = UnpackLimits(max_total_bytes=1 << 20, max_members=100)
HOSTILE = {
    "character device": member("src/zz.h", tarfile.CHRTYPE),
    "block device": member("src/disk", tarfile.BLKTYPE),
    "named pipe": member("src/pipe.h", tarfile.FIFOTYPE),
    "absolute path": member("/tmp/h3bridge-test-absolute", data=b"x"),
    "dot-dot": member("src/../../escaped", data=b"x"),
    "symlink out": member("src/out", tarfile.SYMTYPE, link="../../outside"),
    "absolute symlink": member("src/zero", tarfile.SYMTYPE, link="/dev/zero"),
    "hard link out": member("src/hard", tarfile.LNKTYPE, link="../etc/passwd"),
}


def _everything(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("filters", ["running Python", "no extraction filters"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_member_is_refused_before_anything_is_written(case: str, filters: str, tmp_path: Path,
                                                                request: pytest.FixtureRequest) -> None:
    if filters == "no extraction filters":
        request.getfixturevalue("no_extraction_filters")
        assert not has_extraction_filters()
    archive = make_tar(tmp_path / "a.tar.gz", [member("src/ok.h", data=b"ok\n"), HOSTILE[case]])
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(ArchiveError) as caught:
        unpack_tar(archive, into, LIMITS)
    assert caught.value.member == HOSTILE[case][0].name and repr(HOSTILE[case][0].name) in caught.value.message
    assert caught.value.before_start and caught.value.hint
    assert _everything(into) == []                      # refused before a single member was written
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/h3bridge-test-absolute").exists()


@pytest.mark.parametrize("filters", ["running Python", "no extraction filters"])
def test_setuid_setgid_and_group_write_bits_are_dropped_and_the_tree_unpacks(filters: str, tmp_path: Path,
                                                                             request: pytest.FixtureRequest) -> None:
    if filters == "no extraction filters":
        request.getfixturevalue("no_extraction_filters")
    archive = make_tar(tmp_path / "a.tar.gz", [
        member("src", tarfile.DIRTYPE, mode=0o2777),
        member("src/tool", data=b"#!/bin/sh\n", mode=0o6777),
        member("src/h3.h", data=b"h\n", mode=0o664),
        member("src/link.h", tarfile.SYMTYPE, link="h3.h"),
        member("src/hard.h", tarfile.LNKTYPE, link="src/h3.h"),
    ])
    into = tmp_path / "into"
    into.mkdir()
    report = unpack_tar(archive, into, LIMITS)
    assert report.members == 5 and report.total_bytes == len(b"#!/bin/sh\n") + 2
    tool = (into / "src/tool").stat().st_mode
    assert not tool & (stat.S_ISUID | stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH) and tool & stat.S_IXUSR
    assert not (into / "src").stat().st_mode & (stat.S_ISGID | stat.S_IWOTH)
    assert (into / "src/link.h").read_text() == "h\n" and (into / "src/hard.h").read_text() == "h\n"


def test_the_callers_caps_on_size_and_members_refuse_before_writing(tmp_path: Path) -> None:
    half = b"\0" * (600 << 10)
    big = make_tar(tmp_path / "big.tar.gz", [member("a", data=half), member("b", data=half)])
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(ArchiveError) as caught:
        unpack_tar(big, into, LIMITS)
    assert "unpacks to more than 1 MiB" in caught.value.message and _everything(into) == []
    many = make_tar(tmp_path / "many.tar.gz", [member(f"f{n}", data=b"x") for n in range(101)])
    with pytest.raises(ArchiveError) as caught:
        unpack_tar(many, into, LIMITS)
    assert "more than 100 members" in caught.value.message and _everything(into) == []
    unpack_tar(many, into, UnpackLimits(max_total_bytes=1 << 20, max_members=101))
    assert len(_everything(into)) == 101


@pytest.mark.parametrize("compression", ["w:gz", "w:bz2", "w:xz", "w:"])
def test_a_truncated_archive_is_the_projects_error(compression: str, tmp_path: Path) -> None:
    whole = make_tar(tmp_path / "whole.tar", [member("src/h3.h", data=os.urandom(200_000)),
                                              member("src/main.c", data=os.urandom(200_000))], compression)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[:len(whole.read_bytes()) // 2])
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(ArchiveError) as caught:
        unpack_tar(cut, into, LIMITS)
    assert "damaged or truncated" in caught.value.message and str(cut) in caught.value.message


def test_an_archive_that_is_a_fifo_or_a_device_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "source.tar.gz"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.tar.gz"
    zero.symlink_to("/dev/zero")
    into = tmp_path / "into"
    into.mkdir()
    for path, kind in ((fifo, "a named pipe (FIFO)"), (zero, "a character device")):
        with pytest.raises(ArchiveError) as caught:
            unpack_tar(path, into, LIMITS, hint="give the source tarball")
        assert f"{path} is {kind}" in caught.value.message and caught.value.hint == "give the source tarball"
    with pytest.raises(ArchiveError) as caught:
        unpack_tar(tmp_path / "missing.tar.gz", into, LIMITS)
    assert "cannot read" in caught.value.message
