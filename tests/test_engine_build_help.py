"""build-engine's help for a Mac whose SDK is older than macOS 26 (h3.c issue 66, fix in pull request
59), and doctor's line about the commit the engine was built from."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from h3bridge.cli.main import engine_commit_check
from h3bridge.engine_build.build import REQUIRED_FILES, build_engine
from h3bridge.engine_build.diagnose import diagnose
from h3bridge.engine_build.record import (PINNED_COMMIT, build_record, commit_of_clone, commit_of_tarball,
                                          record_build)
from h3bridge.errors import LibraryBuildError
from h3bridge.runnable import h3bridge_command
from upstream_helpers import UPSTREAM_SOURCE_ENV

# Recorded on a Mac with the macOS 15 SDK (clang; antirez/h3.c issue 66, building 8974cc0's h3_metal.m).
RECORDED_CLANG = """\
h3_metal.m:43:51: error: use of undeclared identifier 'MTLGPUFamilyMetal4'; did you mean 'MTLGPUFamilyMetal3'?
   43 |             info->metal4 = [device supportsFamily:MTLGPUFamilyMetal4] ? 1 : 0;
      |                                                   ^~~~~~~~~~~~~~~~~~
      |                                                   MTLGPUFamilyMetal3
/Library/Developer/CommandLineTools/SDKs/MacOSX.sdk/System/Library/Frameworks/Metal.framework/Headers/MTLDevice.h:222:5: note: 'MTLGPUFamilyMetal3' declared here
  222 |     MTLGPUFamilyMetal3 API_AVAILABLE(macos(13.0), ios(16.0)) = 5001,
      |     ^
1 error generated.
make: *** [h3_metal.o] Error 1
"""
# the same probe shape, our own three lines: an SDK enum the headers do not declare
PROBE = "enum { MTLGPUFamilyMetal3 = 5001 };\nint probe(void) {\n    return MTLGPUFamilyMetal4;\n}\n"


def _compiler() -> str:
    for name in ("clang", "cc", "gcc"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no C compiler")


def _old_sdk_source(tmp_path: Path) -> Path:
    """An h3.c-shaped folder (the files build-engine requires) whose `make` fails the way the
    macOS 15 SDK does: a real compiler on a file using the undeclared enum."""
    source = tmp_path / "h3.c"
    source.mkdir()
    for name in REQUIRED_FILES:
        (source / name).write_text("")
    (source / "Makefile").write_text("LIB_C := h3.c\nCLI_OBJ := main.o\n")
    (source / "h3.c").write_text("")
    (source / "h3_metal.m").write_text(PROBE)
    tools = tmp_path / "bin"
    tools.mkdir()
    make = tools / "make"
    make.write_text(f"#!/bin/sh\n'{_compiler()}' -x c -c h3_metal.m -o /dev/null || "
                    "{ echo 'make: *** [h3_metal.o] Error 1' >&2; exit 2; }\n")
    make.chmod(make.stat().st_mode | stat.S_IEXEC)
    return source


def test_a_real_compiler_diagnostic_of_the_undeclared_metal4_enum_is_recognised(tmp_path: Path) -> None:
    probe = tmp_path / "h3_metal.c"
    probe.write_text(PROBE)
    done = subprocess.run([_compiler(), "-c", str(probe), "-o", os.devnull], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "MTLGPUFamilyMetal4" in done.stderr
    for output in (done.stderr, RECORDED_CLANG):
        found = diagnose(output, Path("/src/h3.c"))
        assert found is not None, output
        problem, fix = found
        assert "older than macOS 26" in problem and "issue 66" in problem
        assert "pull request 59" in fix and "curl -fsSL https://github.com/antirez/h3.c/pull/59.diff | " \
                                           "git -C /src/h3.c apply" in fix
        assert "`h3bridge build-engine /src/h3.c` again" in fix
    assert diagnose("h3.c:10:5: error: expected ';' before '}' token", Path("/src")) is None


def test_build_engine_on_a_mac_with_an_old_sdk_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _old_sdk_source(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(LibraryBuildError) as caught:
        build_engine(source, system="darwin", cache_root=tmp_path / "cache")
    assert "SDK is older than macOS 26" in caught.value.message
    assert f"git -C {source} apply" in (caught.value.hint or "")
    assert "MTLGPUFamilyMetal4" in caught.value.compiler_output      # the compiler's words are kept and shown


def test_the_commit_is_read_from_a_clone_and_from_a_git_archive(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("no git")
    clone = tmp_path / "clone"
    clone.mkdir()
    git = ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(clone)], check=True, timeout=60)
    (clone / "h3.h").write_text("x\n")
    subprocess.run([*git, "add", "h3.h"], check=True, timeout=60)
    subprocess.run([*git, "commit", "-qm", "x"], check=True, timeout=60)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert commit_of_clone(clone) == head
    (clone / "h3.h").write_text("patched\n")
    assert commit_of_clone(clone) == head + "+changes"
    assert commit_of_clone(tmp_path) is None
    archive = tmp_path / "h3.tar.gz"
    subprocess.run([*git, "archive", "--format=tar.gz", "-o", str(archive), "HEAD"], check=True, timeout=60)
    assert commit_of_tarball(archive) == head
    upstream = os.environ.get(UPSTREAM_SOURCE_ENV)
    if upstream and Path(upstream).is_file():
        assert commit_of_tarball(Path(upstream)) == PINNED_COMMIT


def test_doctor_says_which_commit_the_engine_was_built_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    program = tmp_path / "h3.c" / "h3"
    program.parent.mkdir()
    program.write_text("")
    name, ok, detail, fix = engine_commit_check(program)
    assert ok and "commit unknown" in detail and "does not report its commit" in detail
    record_build(program, PINNED_COMMIT, program.parent)
    assert build_record(program).matches_pin
    name, ok, detail, fix = engine_commit_check(program)
    assert ok and "h3.c 8974cc0, the pinned commit" in detail
    record_build(program, PINNED_COMMIT + "+changes", program.parent)
    assert engine_commit_check(program)[2] == "h3.c 8974cc0 with local changes, the pinned commit"
    other = "0123456789abcdef0123456789abcdef01234567"
    record_build(program, other, program.parent)
    name, ok, detail, fix = engine_commit_check(program)
    assert not ok and "h3.c 0123456, not the pinned 8974cc0" in detail
    # not a clone (a tarball's folder, or one gone since): the pinned source's steps, not a `git -C` there
    assert "`git clone https://github.com/antirez/h3.c DIR`, `git -C DIR checkout 8974cc0`" in fix, fix
    (program.parent / ".git").mkdir()
    fix = engine_commit_check(program)[3]
    assert fix == f"build the pinned commit: `git -C {program.parent} checkout 8974cc0`, then " \
                  f"`{h3bridge_command('build-engine', program.parent)}`"
    assert engine_commit_check(Path("/usr/bin/h3-sim"))[1:3] == (True, "h3-sim, h3bridge's simulator of h3.c 8974cc0")


def test_a_rebuild_from_the_extracted_tarball_keeps_the_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: build-engine from the tarball records its commit; build-engine again from the folder
    it extracts to (h3.c-8974cc0, not a git clone) hit the same cache entry and recorded "commit
    unknown". The entry is keyed by the hash of upstream's files, so its manifest's commit stands."""
    import json
    import tarfile

    from h3bridge.engine_build.build import compiler_identity, find_compiler, read_source, source_hash
    from h3bridge.engine_build import build_engine
    upstream = Path(os.environ.get(UPSTREAM_SOURCE_ENV, ""))
    if not os.environ.get(UPSTREAM_SOURCE_ENV) or not upstream.is_file():
        pytest.skip(f"{UPSTREAM_SOURCE_ENV} is not set to a source tarball")
    try:
        compiler = find_compiler()
    except Exception as error:           # no C compiler: build-engine cannot run here at all
        pytest.skip(str(error))
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    from h3bridge.engine_build.build import SOURCE_LIMITS
    from h3bridge.safeio.archives import unpack_tar
    (tmp_path / "src").mkdir()
    unpack_tar(upstream, tmp_path / "src", SOURCE_LIMITS)      # the project's one way (any Python 3.10+)
    folder = next((tmp_path / "src").glob("*/h3.h")).parent
    # The cache entry a build from the tarball made (its manifest holds the tarball's commit); the
    # compile itself is what the upstream tests cover, not this record keeping.
    entry = tmp_path / "cache" / "engines" / source_hash(read_source(folder), compiler_identity(compiler))[:16]
    entry.mkdir(parents=True)
    (entry / "h3").write_text("")
    (entry / "engine.json").write_text(json.dumps({"commit": PINNED_COMMIT}))
    built = build_engine(folder, cache_root=tmp_path / "cache")
    assert built.cached and built.program == entry / "h3"
    recorded = json.loads((tmp_path / "cache" / "engines" / "builds.json").read_text())
    assert recorded[str(built.program.resolve())]["commit"] == PINNED_COMMIT
    assert build_record(built.program).commit == PINNED_COMMIT
    assert engine_commit_check(built.program)[1:3] == (True, "h3.c 8974cc0, the pinned commit")
    # the same source as the tarball: the record names the tarball the user gave, not the temporary
    # folder it was unpacked into (doctor's fix must point at something that is still there)
    assert build_engine(upstream, cache_root=tmp_path / "cache").program == built.program
    assert build_record(built.program).source == str(upstream.absolute())
    # an entry recorded as unknown before this fix: the manifest beside the program still tells
    record_build(built.program, None, folder)
    assert engine_commit_check(built.program)[2] == "h3.c 8974cc0, the pinned commit"
