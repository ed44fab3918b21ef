"""Shared helpers for the CORE tests (request, engine, CLI, media): small media files and
the h3-sim engine with a fixture model. Imported by test modules, not a conftest, so other
helpers' conftest files stay independent."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from h3bridge import GenerationRequest

FAST = dict(width=96, height=64, frames=22, steps=2)   # the cheapest legal clip


def fast_request(prompt: str = "a red fox runs through snow", **changes: object) -> GenerationRequest:
    fields = dict(FAST)
    fields.update(changes)
    return GenerationRequest(prompt=prompt, **fields)  # type: ignore[arg-type]


def ffmpeg(path: Path, *args: str) -> Path:
    """Make a small media file with the ffmpeg program (lavfi sources)."""
    subprocess.run(["ffmpeg", "-v", "error", "-y", *args, str(path)], check=True)
    return path


def make_image(path: Path, size: str = "64x64", color: str = "red") -> Path:
    return ffmpeg(path, "-f", "lavfi", "-i", f"color=c={color}:s={size}", "-frames:v", "1")


def make_video(path: Path, seconds: float, *, audio: bool = True, size: str = "64x64") -> Path:
    args = ["-f", "lavfi", "-i", f"testsrc=s={size}:r=24:d={seconds}"]
    if audio:
        args += ["-f", "lavfi", "-i", f"sine=d={seconds}:sample_rate=32000", "-ac", "2", "-c:a", "aac"]
    return ffmpeg(path, *args, "-c:v", "libx264", "-pix_fmt", "yuv420p", "-shortest")


def make_audio(path: Path, seconds: float) -> Path:
    return ffmpeg(path, "-f", "lavfi", "-i", f"sine=d={seconds}:sample_rate=32000", "-ac", "2")


@pytest.fixture(scope="session")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A set of small inputs: images, videos with/without sound, audio of several lengths."""
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed")
    root = tmp_path_factory.mktemp("core-media")
    return {
        "image": make_image(root / "red image.png"),
        "image2": make_image(root / "blue.png", color="blue"),
        "video3s": make_video(root / "clip 3s.mp4", 3.0),
        "video1s": make_video(root / "clip1s.mp4", 1.0),
        "silent3s": make_video(root / "silent.mp4", 3.0, audio=False),
        "audio1s": make_audio(root / "a1.wav", 1.0),
        "audio3s": make_audio(root / "a3.wav", 3.0),
        "audio6s": make_audio(root / "a6.wav", 6.0),
        "audio16s": make_audio(root / "a16.wav", 16.0),
        "text": _write(root / "notes.txt", "not media at all\n"),
    }


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- h3-sim engine

def sim_engine_path() -> Path:
    """The h3-sim console script installed beside this Python (or on PATH)."""
    import sys
    beside = Path(sys.executable).with_name("h3-sim")
    found = beside if beside.exists() else (Path(shutil.which("h3-sim")) if shutil.which("h3-sim") else None)
    if found is None:
        pytest.fail("h3-sim is not installed: pip install -e '.[test]'")
    return found


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny fixture model directory (FL2VA + Ref2VA) written by the MODEL helper's fixture."""
    from h3bridge.sim.fixture import write_fixture_model
    return write_fixture_model(tmp_path_factory.mktemp("core-model") / "MiniMax-H3")


@pytest.fixture
def sim_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """H3_SIM_LOG: h3-sim appends one JSON line per invocation ({"argv", "cwd", "pid"})."""
    path = tmp_path / "sim-log.jsonl"
    monkeypatch.setenv("H3_SIM_LOG", str(path))
    return path


def sim_invocations(log: Path) -> list[dict]:
    import json
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]


def assert_group_gone(pgid: int) -> None:
    """Nothing of the engine's process group runs any more, and the group disappears.

    Every member must already be dead (no live process) when this is called; orphaned members
    (FFmpeg) are reaped by init, which in containers can lag a little, so the final
    `os.killpg(pgid, 0)` -> ProcessLookupError check allows for that.
    """
    import os
    import time

    from h3bridge.engines.process import live_group_members
    assert live_group_members(pgid) == [], f"engine group {pgid} still has running processes"
    deadline = time.monotonic() + 5
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"engine group {pgid} was never reaped"
        time.sleep(0.02)


def wait_until(condition, timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Poll `condition` every `interval` seconds until it holds (True) or `timeout` seconds pass
    (its last value). A condition that asks a server gives a longer interval: the server answering
    a hundred polls a second takes the CPU from the work being waited for."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def cancel_when_called(monkeypatch: pytest.MonkeyPatch, module: object, name: str, token) -> None:
    """Make `module.name` cancel `token` and then run as usual: a cancel that lands while the
    engine's result is being read (after the engine itself has finished)."""
    original = getattr(module, name)

    def cancelling(*args, **kwargs):
        token.cancel()
        return original(*args, **kwargs)
    monkeypatch.setattr(module, name, cancelling)


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME and h3bridge's cache in the test's own folder (a file that uses it makes it autouse)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(home / "cache"))
    return home


def not_regular_outputs(folder: Path, suffix: str) -> dict[str, Path]:
    """What an output must never be written over, --overwrite or not, made in `folder` (a test's
    own): a folder, a FIFO, a dangling link and, as root, a character device (/dev/full's
    numbers), each named `<kind>{suffix}`; by kind."""
    made = folder / f"folder{suffix}"
    made.mkdir()
    fifo = folder / f"fifo{suffix}"
    os.mkfifo(fifo)
    dangling = folder / f"dangling{suffix}"
    dangling.symlink_to(folder / f"nowhere{suffix}")
    names = {"folder": made, "fifo": fifo, "dangling link": dangling}
    if os.geteuid() == 0:
        device = folder / f"device{suffix}"
        os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        names["device"] = device
    return names


def pause_notice(stderr) -> str:
    """The line the CLI says Ctrl-Z with ("h3bridge: paused: ..."), read from its stderr; "" if the
    stream ends first. Progress lines printed by the rendering threads may come before it (the
    signal handler runs when the main thread gets to it), so it is not always the next line."""
    return next((line for line in stderr if line.startswith("h3bridge: paused:")), "")
