"""h3-sim-lib / build_double(): compiled into the cache, rebuilt only when the C source changes,
never seen half-written by parallel builders, and a clear error without a working compiler."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from h3bridge import libh3
from h3bridge.errors import EngineNotFoundError, LibraryBuildError
from h3bridge.sim import library

from double_helpers import compiler_or_skip


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the double's sources, so a test can change them."""
    copy = tmp_path / "double"
    shutil.copytree(library.SOURCE_DIR, copy)
    monkeypatch.setattr(library, "SOURCE_DIR", copy)
    return copy


def _script(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.is_file():
        pytest.skip(f"{name} console script not installed (pip install -e .)")
    return str(path)


def test_built_once_then_reused_then_rebuilt_when_the_source_changes(sources: Path, tmp_path: Path) -> None:
    compiler_or_skip()
    folder = tmp_path / "build"
    first = library.build_double(folder)
    assert first.parent == folder and first.name.startswith("libh3-double-")
    stamp = first.stat()
    again = library.build_double(folder)
    assert again == first and again.stat().st_ino == stamp.st_ino and again.stat().st_mtime_ns == stamp.st_mtime_ns
    with open(sources / "libh3_double.c", "a") as handle:
        handle.write("/* changed */\n")
    changed = library.build_double(folder)
    assert changed != first and changed.is_file() and first.is_file()
    lib = libh3.load_library(changed)
    assert lib.h3_last_error(None) == b""
    (sources / "h3_double.h").write_text((sources / "h3_double.h").read_text() + "/* header */\n")
    assert library.build_double(folder) not in (first, changed)
    assert not [path for path in folder.iterdir() if path.name.endswith(".tmp")]


def test_no_compiler_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LibraryBuildError) as caught:
        library.build_double(tmp_path / "build")
    error = caught.value
    assert isinstance(error, EngineNotFoundError) and error.before_start
    assert error.message == ("no C compiler found to build the libh3 double "
                             "(looked for $CC, cc, gcc, clang on PATH)")
    assert "apt-get install gcc" in error.hint and "set CC" in error.hint


def test_a_cc_that_does_not_exist(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", "no-such-compiler -O3")
    with pytest.raises(LibraryBuildError) as caught:
        library.build_double(tmp_path / "build")
    assert caught.value.message == "the C compiler CC='no-such-compiler -O3' was not found"


def test_a_failing_compiler_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "broken-cc"
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('fatal: cannot compile\\n')\n"
                    "sys.exit(3)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    folder = tmp_path / "build"
    with pytest.raises(LibraryBuildError) as caught:
        library.build_double(folder)
    assert caught.value.message == ("the C compiler failed building the libh3 double (exit 3): "
                                    "fatal: cannot compile")
    assert caught.value.compiler_output == "fatal: cannot compile"
    assert [path.name for path in folder.iterdir()] == ["build.lock"]


def test_h3_sim_lib_prints_the_path_and_parallel_builds_agree(tmp_path: Path) -> None:
    compiler_or_skip()
    program = _script("h3-sim-lib")
    env = {**os.environ, "H3BRIDGE_CACHE_DIR": str(tmp_path / "cache")}
    builders = [subprocess.Popen([program], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(3)]
    outputs = [builder.communicate(timeout=120) for builder in builders]
    assert [builder.returncode for builder in builders] == [0, 0, 0], outputs
    paths = {out.strip() for out, _ in outputs}
    assert len(paths) == 1
    built = Path(paths.pop())
    assert built.parent == tmp_path / "cache" / "libh3-double" and built.is_file()
    assert sorted(path.name for path in built.parent.iterdir()) == sorted([built.name, "build.lock"])
    libh3.load_library(built)


def test_h3_sim_lib_without_a_compiler_exits_1_with_the_fix(tmp_path: Path) -> None:
    program = _script("h3-sim-lib")
    env = {key: value for key, value in os.environ.items() if key != "CC"}
    env.update(PATH=str(tmp_path), H3BRIDGE_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([program], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("h3-sim-lib: no C compiler found to build the libh3 double")
    assert "fix: install one" in done.stderr
