"""`h3bridge build-engine` with hostile sources: every file it reads goes through the path reader
(never a FIFO, never /dev/zero), a tarball through safeio/archives.py (the data filter's rules on
every Python, stated caps, a damaged archive as exit 2). Each case runs the real command; the ones
that hung or ate memory before run it in a child process with a bound on time and memory."""
from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from archive_helpers import make_tar, member, no_extraction_filters  # noqa: F401 (fixture)
from h3bridge.cli.main import main as h3bridge_main
from h3bridge.engine_build import build
from h3bridge.engine_build.build import REQUIRED_FILES, build_engine
from h3bridge.errors import EngineNotFoundError

BOUND = 120.0                 # a safety net for a child that would hang, not an expected time
MEMORY_CAP = 1 << 30          # a child reading /dev/zero stops at this instead of at the machine's memory


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, H3BRIDGE_CACHE_DIR=str(tmp_path / "cache"), HOME=str(tmp_path / "home"))

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP * 2, MEMORY_CAP * 2))

    program = Path(sys.executable).with_name("h3bridge")
    return subprocess.run([str(program), *args], env=env, capture_output=True, text=True, timeout=BOUND,
                          preexec_fn=cap_memory)


def _clone(tmp_path: Path) -> Path:
    """An h3.c-shaped folder (what read_source requires): build-engine hashes it before compiling."""
    source = tmp_path / "h3.c"
    source.mkdir()
    for name in REQUIRED_FILES:
        (source / name).write_text("")
    (source / "Makefile").write_text("LIB_C := h3.c\nCLI_OBJ := main.o\n")
    (source / "h3.c").write_text("")
    return source


def test_a_header_linked_to_dev_zero_in_a_clone_is_refused_not_read(tmp_path: Path) -> None:
    source = _clone(tmp_path)
    (source / "zz.h").symlink_to("/dev/zero")
    done = _cli(tmp_path, "build-engine", str(source))
    assert done.returncode == 2, done.stderr
    assert f"{source / 'zz.h'} is a character device (a symbolic link to /dev/zero)" in done.stderr
    assert "MemoryError" not in done.stderr and f"rm {source / 'zz.h'}" in done.stderr


def test_a_fifo_header_in_a_clone_is_refused_not_waited_on(tmp_path: Path) -> None:
    source = _clone(tmp_path)
    os.mkfifo(source / "zz.h")
    done = _cli(tmp_path, "build-engine", str(source))
    assert done.returncode == 2 and f"{source / 'zz.h'} is a named pipe (FIFO)" in done.stderr


@pytest.mark.parametrize("name", ["source.tar.gz", "fifo.tar.gz"])
def test_a_source_that_is_a_device_or_a_fifo_is_refused_at_once(name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    if name.startswith("fifo"):
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")          # `build-engine /dev/zero`, through a link in tmp_path
    done = _cli(tmp_path, "build-engine", str(path))
    assert done.returncode == 2, done.stderr
    kind = "a named pipe (FIFO)" if name.startswith("fifo") else "a character device"
    assert f"the h3.c source {path} is {kind}" in done.stderr and "git archive" in done.stderr


def test_a_truncated_tarball_is_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    whole = make_tar(tmp_path / "whole.tar.gz", [member("h3.c/h3.h", data=os.urandom(300_000)),
                                                 member("h3.c/main.c", data=os.urandom(300_000))])
    cut = tmp_path / "h3.c.tar.gz"
    cut.write_bytes(whole.read_bytes()[:len(whole.read_bytes()) // 2])
    assert h3bridge_main(["build-engine", str(cut)]) == 2
    err = capsys.readouterr().err
    assert "damaged or truncated" in err and str(cut) in err and "git archive" in err


@pytest.mark.parametrize("kind, name", [(tarfile.CHRTYPE, "h3.c/zz.h"), (tarfile.FIFOTYPE, "h3.c/pipe.h"),
                                        (tarfile.BLKTYPE, "h3.c/disk")])
def test_without_extraction_filters_a_device_or_fifo_member_is_never_written(
        kind: bytes, name: str, tmp_path: Path, no_extraction_filters: None) -> None:  # noqa: F811
    tarball = make_tar(tmp_path / "h3.c.tar.gz", [member("h3.c/h3.h", data=b"h\n"), member(name, kind)])
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(EngineNotFoundError) as caught:
        build._unpack(tarball, into)
    assert repr(name) in caught.value.message and "nothing was unpacked" in caught.value.message
    assert not any(not (p.is_dir() or p.is_file()) for p in into.rglob("*"))
    assert not (into / name).exists() and not (into / name).is_symlink()


def test_without_extraction_filters_setuid_and_setgid_bits_are_dropped(tmp_path: Path,
                                                                       no_extraction_filters: None) -> None:  # noqa: F811
    tarball = make_tar(tmp_path / "h3.c.tar.gz", [member("h3.c/h3.h", data=b"h\n"),
                                                  member("h3.c/run", data=b"#!/bin/sh\n", mode=0o6755)])
    into = tmp_path / "into"
    into.mkdir()
    assert build._unpack(tarball, into) == into / "h3.c"
    mode = (into / "h3.c/run").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID) and mode & stat.S_IXUSR


def test_the_unpack_caps_are_stated_and_refuse_a_tarball_that_unpacks_past_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from h3bridge.safeio.archives import UnpackLimits
    # upstream's source is 1.6 MB unpacked in 39 members: 256 MiB and 10,000 members are generous
    assert build.SOURCE_LIMITS == UnpackLimits(max_total_bytes=256 << 20, max_members=10_000)
    # the same rule at a scale a test can build: a cap of 1 MiB and 50 members
    monkeypatch.setattr(build, "SOURCE_LIMITS", UnpackLimits(max_total_bytes=1 << 20, max_members=50))
    bomb = make_tar(tmp_path / "bomb.tar.gz", [member("h3.c/h3.h", data=b"h\n"),
                                               member("h3.c/zeros.h", data=b"\0" * (2 << 20))])
    assert bomb.stat().st_size < 64 << 10
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(EngineNotFoundError) as caught:
        build._unpack(bomb, into)
    assert "unpacks to more than 1 MiB" in caught.value.message and not list(into.iterdir())
    many = make_tar(tmp_path / "many.tar.gz", [member("h3.c/h3.h", data=b"h\n")]
                    + [member(f"h3.c/f{n}.h", data=b"x") for n in range(60)])
    with pytest.raises(EngineNotFoundError) as caught:
        build._unpack(many, into)
    assert "more than 50 members" in caught.value.message and not list(into.iterdir())


def test_a_clean_tarball_still_unpacks_to_its_source_folder(tmp_path: Path) -> None:
    tarball = make_tar(tmp_path / "h3.c.tar.gz", [member("h3.c", tarfile.DIRTYPE, mode=0o755),
                                                  member("h3.c/h3.h", data=b"h\n"), member("h3.c/main.c", data=b"")])
    into = tmp_path / "into"
    into.mkdir()
    assert build._unpack(tarball, into) == into / "h3.c"
    with pytest.raises(EngineNotFoundError) as caught:     # and a tarball with no h3.c in it says so
        build_engine(make_tar(tmp_path / "other.tar.gz", [member("x/readme", data=b"")]),
                     cache_root=tmp_path / "cache")
    assert "holds no h3.c source folder" in caught.value.message
