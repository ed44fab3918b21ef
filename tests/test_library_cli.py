"""`h3bridge generate --engine library` (against the libh3 double) and `h3bridge build-library`.

build-library's macOS path (make, link, lipo-free arch check, load) cannot run on Linux: its
commands are checked here against upstream's real Makefile (make reads it, nothing is built),
and the refusal on Linux is run as the user would see it.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import av
import pytest

from core_helpers import model_dir  # noqa: F401 (fixture)
from double_helpers import double_library_path
from upstream_helpers import upstream_source_file
from h3bridge.cli.main import main
from h3bridge.engines.library_build import build_library, link_command, makefile_variables
from h3bridge.errors import EngineNotFoundError, LibraryLoadError

TINY = ["--width", "64", "--height", "64", "--frames", "22", "--steps", "3"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))


def test_generate_with_the_library_writes_one_preview_png_per_step(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    previews = tmp_path / "previews"
    status = main(["generate", "--engine", "library", "--library-path", str(double_library_path()),
                   "--model-dir", str(model_dir), "-p", "a fox in snow", *TINY, "-o", str(tmp_path / "fox.mp4"),
                   "--preview-dir", str(previews), "--json"])
    assert status == 0, capsys.readouterr().err
    assert sorted(p.name for p in previews.iterdir()) == ["step-0001.png", "step-0002.png", "step-0003.png"]
    with av.open(str(previews / "step-0003.png")) as container:
        frame = next(container.decode(video=0))
    assert (frame.width, frame.height) == (64, 64)
    assert (tmp_path / "fox.mp4").is_file()
    assert '"frame_count": 22' in capsys.readouterr().out


def test_existing_previews_are_kept(model_dir: Path, tmp_path: Path,  # noqa: F811
                                    capsys: pytest.CaptureFixture[str]) -> None:
    previews = tmp_path / "previews"
    previews.mkdir()
    (previews / "step-0001.png").write_bytes(b"mine")
    status = main(["generate", "--engine", "library", "--library-path", str(double_library_path()),
                   "--model-dir", str(model_dir), "-p", "x", *TINY, "-o", "", "--preview-dir", str(previews)])
    assert status == 2
    assert "already holds step previews" in capsys.readouterr().err
    assert (previews / "step-0001.png").read_bytes() == b"mine"


@pytest.mark.parametrize("make", ["missing", "text", "archive", "program"])
def test_a_bad_library_is_one_clear_sentence_with_the_fix(model_dir: Path, tmp_path: Path, make: str,  # noqa: F811
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "libh3.dylib"
    if make == "text":
        path.write_text("not a library\n")
    elif make == "archive":
        path.write_bytes(b"!<arch>\n" + b"\0" * 60)
    elif make == "program":
        shutil.copy(shutil.which("true") or "/bin/true", path)
    status = main(["generate", "--engine", "library", "--library-path", str(path), "--model-dir", str(model_dir),
                   "-p", "x", "-o", ""])
    err = capsys.readouterr().err
    assert status == 2
    first, fix = err.splitlines()[:2]
    assert first.startswith("h3bridge: ") and str(path) in first
    assert fix.strip().startswith("fix:") and "h3-sim-lib" in fix


def test_preview_dir_needs_the_library_engine(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    assert main(["generate", "--model-dir", str(model_dir), "-p", "x", "-o", "", "--preview-dir", "/tmp/p"]) == 2
    assert "--preview-dir needs --engine library" in capsys.readouterr().err


def test_build_library_says_why_not_on_linux(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if Path("/System/Library/Frameworks/Metal.framework").exists():
        pytest.skip("this is a Mac")
    assert main(["build-library", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot be built on" in err and "h3-sim-lib" in err


@pytest.fixture
def upstream_checkout(tmp_path: Path) -> Path:
    """A folder with upstream's Makefile (from $H3_UPSTREAM_SOURCE) and the files a checkout has."""
    files = {name: upstream_source_file(name) for name in ("Makefile", "h3.h")}
    if None in files.values() or shutil.which("make") is None:
        pytest.skip("needs upstream's source ($H3_UPSTREAM_SOURCE) and make")
    folder = tmp_path / "h3.c"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)     # type: ignore[arg-type]
    (folder / "h3_shaders.metal").write_text("// shaders\n")
    return folder


def test_the_link_uses_upstreams_ldlibs_and_all_load(upstream_checkout: Path) -> None:
    variables = makefile_variables(upstream_checkout, shutil.which("make") or "make")
    assert variables.cc == "clang"
    for framework in ("Foundation", "Metal", "MetalPerformanceShaders", "MetalPerformanceShadersGraph", "Accelerate"):
        index = variables.ldlibs.index(framework)
        assert variables.ldlibs[index - 1] == "-framework"
    assert variables.ldlibs[-2:] == ("-licucore", "-lm")
    command = link_command(variables, upstream_checkout / "libh3.a", upstream_checkout / "libh3.dylib")
    assert command[:4] == ["clang", "-dynamiclib", "-arch", "arm64"]
    assert command.index("-Wl,-all_load") < command.index(str(upstream_checkout / "libh3.a")) \
        < command.index("-framework")


def test_the_macos_path_runs_make_links_and_checks_the_result(upstream_checkout: Path) -> None:
    """What build-library runs on a Mac, in order; the linker is replaced by a recorder that writes
    a file which is not an arm64 Mach-O library, so the check refuses it and nothing is kept."""
    calls: list[list[str]] = []

    def run(command: list[str], **options: object) -> subprocess.CompletedProcess:
        calls.append(command)
        if command[1:] == ["-pnq", "libh3.a"]:
            return subprocess.run(command, **options)    # make reads the real Makefile, builds nothing
        if "-dynamiclib" in command:
            Path(command[command.index("-o") + 1]).write_text("not a Mach-O file")
        return subprocess.CompletedProcess(command, 0, "", "")

    with pytest.raises(LibraryLoadError):
        build_library(upstream_checkout, run=run, system="darwin")
    assert calls[0][1:] == ["libh3.a"] and calls[1][1:] == ["-pnq", "libh3.a"]
    assert "-Wl,-all_load" in calls[2]
    assert list(upstream_checkout.glob("*.dylib*")) == [] and list(upstream_checkout.glob(".libh3*")) == []


def test_build_library_refuses_a_folder_that_is_not_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(EngineNotFoundError, match="not an h3.c checkout"):
        build_library(tmp_path, system="darwin")


def test_the_progress_bar_counts_the_step_previews(capsys: pytest.CaptureFixture[str]) -> None:
    from h3bridge.cli.main import PhaseProgressBars
    from h3bridge.progress import ProgressEvent

    notes = iter(["previews 1/3", "previews 2/3"])
    bars = PhaseProgressBars(terminal=True, note=lambda: next(notes))
    bars(ProgressEvent(phase="denoise", done=1, total=3, fraction=0.5, elapsed=1.0))
    bars(ProgressEvent(phase="denoise", done=2, total=3, fraction=0.6, elapsed=2.0))
    bars.close()
    err = capsys.readouterr().err
    assert "previews 1/3" in err and "previews 2/3" in err


def test_the_memory_plan_uses_the_librarys_device(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """h3_device's recommended working set caps the plan's budget: a device that may hold 1 MiB
    refuses the clip before anything renders, whatever this machine's RAM."""
    monkeypatch.setenv("H3_SIM_RECOMMENDED_WORKING_SET", "1048576")
    status = main(["generate", "--engine", "library", "--library-path", str(double_library_path()),
                   "--model-dir", str(model_dir), "-p", "x", *TINY, "-o", str(tmp_path / "x.mp4")])
    err = capsys.readouterr().err
    assert status == 2 and not (tmp_path / "x.mp4").exists()
    assert "Apple M5 Max" in err          # the device h3_device reported, in the printed plan


# ----------------------------------------------------------------------------- issue 19 item 3


@pytest.mark.timeout(90)
def test_a_fifo_in_the_model_is_refused_before_the_library_worker_loads_it(
        model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    """machine_facts() started a probe worker that ran h3_load_dir before the model check and
    outside the engine lock: a FIFO shard meant 120 s of silence, then "did not load the library"."""
    import os
    model = Path(shutil.copytree(model_dir, tmp_path / "MiniMax-H3"))
    fifo = model / "FL2VA/transformer/model-00099-of-00099.safetensors"
    os.mkfifo(fifo)
    status = main(["generate", "--engine", "library", "--library-path", str(double_library_path()),
                   "--model-dir", str(model), "-p", "x", *TINY, "-o", str(tmp_path / "x.mp4")])
    assert status == 2
    assert f"{fifo}: is a named pipe (FIFO)" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_sigterm_while_the_library_facts_wait_exits_143_and_leaves_no_worker(model_dir: Path,  # noqa: F811
                                                                             tmp_path: Path) -> None:
    """The probe worker now starts as a job's does, under the machine-wide engine lock: while
    another process holds it, the CLI waits inside its signal handling, and a SIGTERM ends the
    wait with status 143 (it was -15, the worker orphaned)."""
    import signal
    import sys
    import textwrap
    import time

    import psutil

    lock = tmp_path / "engine.lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from h3bridge.engines.lock import EngineLock
        held = EngineLock(__import__("pathlib").Path({str(lock)!r}))
        held.acquire()
        print("held", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        env = {**__import__("os").environ, "H3BRIDGE_LOCK_PATH": str(lock)}
        cli = subprocess.Popen([sys.executable, "-m", "h3bridge.cli", "generate", "--engine", "library",
                                "--library-path", str(double_library_path()), "--model-dir", str(model_dir),
                                "-p", "x", *TINY, "-o", str(tmp_path / "x.mp4"), "--quiet"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120       # a safety net: the loop waits for the CLI's wait marker
        while not list(tmp_path.glob("engine.lock.wanted.*")) and cli.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp_path.glob("engine.lock.wanted.*")), "the CLI never waited for the engine lock"
        assert psutil.Process(cli.pid).children(recursive=True) == []     # no worker outside the lock
        cli.send_signal(signal.SIGTERM)
        _, err = cli.communicate(timeout=60)
        assert cli.returncode == 143, err
        assert "cancelled" in err and not (tmp_path / "x.mp4").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


@pytest.mark.parametrize("what", ["fifo", "dangling link", "device"])
def test_build_library_never_links_over_a_fifo_device_or_link(tmp_path: Path, what: str) -> None:
    """build-library -o renamed the linked library over whatever held the name (a FIFO, a device
    node as root, a link): refused before make runs (safeio.outputs), and left as it was."""
    import os
    import stat
    from h3bridge.errors import OutputExistsError
    checkout = tmp_path / "h3.c"          # what check_checkout looks for; nothing is built from it
    checkout.mkdir()
    for name in ("Makefile", "h3.h", "h3_shaders.metal"):
        (checkout / name).write_text("")
    output = tmp_path / "libh3.dylib"
    if what == "fifo":
        os.mkfifo(output)
    elif what == "dangling link":
        output.symlink_to(tmp_path / "nowhere.dylib")
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(output, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    before = os.lstat(output)
    calls: list[list[str]] = []

    def run(command: list[str], **options: object) -> subprocess.CompletedProcess:
        calls.append(command)
        if "-dynamiclib" in command:
            Path(command[command.index("-o") + 1]).write_text("a library")
        return subprocess.CompletedProcess(command, 0, "", "")

    with pytest.raises(OutputExistsError, match="already exists and is a"):
        build_library(checkout, output, run=run, system="darwin")
    assert calls == [] and (os.lstat(output).st_mode, os.lstat(output).st_ino) == (before.st_mode, before.st_ino)


@pytest.mark.parametrize("what", ["fifo", "dangling link", "file"])
def test_a_preview_dir_that_is_not_a_folder_is_refused_naming_what_it_is(model_dir: Path, tmp_path: Path,  # noqa: F811
                                                                         what: str,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import os
    previews = tmp_path / "previews"
    if what == "fifo":
        os.mkfifo(previews)
    elif what == "dangling link":
        previews.symlink_to(tmp_path / "nowhere")
    else:
        previews.write_text("mine")
    words = {"fifo": "is a named pipe (FIFO)", "dangling link": "is a symbolic link", "file": "is a file"}[what]
    assert main(["generate", "--engine", "library", "--library-path", str(double_library_path()),
                 "--model-dir", str(model_dir), "-p", "x", *TINY, "-o", "", "--preview-dir", str(previews)]) == 2
    err = capsys.readouterr().err
    assert f"the preview folder {previews} {words}" in err and "Traceback" not in err
    assert {p.name for p in tmp_path.iterdir()} - {"cache"} == {"previews"}      # nothing written beside it
