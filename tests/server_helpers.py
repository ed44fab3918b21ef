"""`h3bridge serve` as a child process for the server tests and bench: started in its own process
group on a free loopback port over h3-sim, ready once /health answers (polled, never slept on)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

KEY = "test-key-0123456789abcdef"     # the servers' API key in the tests
READY_TIMEOUT = 60.0      # a safety net on a loaded machine, not an expected time
_LISTENING = re.compile(r"h3bridge serve: listening on (http://[0-9.]+:\d+)")


def isolated_env(root: Path) -> dict[str, str]:
    """A server's own engine lock, machine folder, cache and h3-sim log: nothing shared with other
    tests (a module-scoped server outlives the per-test lock of conftest.py), and the API key."""
    return {"H3BRIDGE_LOCK_PATH": str(root / "engine.lock"), "H3BRIDGE_MACHINE_DIR": str(root / "machine"),
            "H3BRIDGE_CACHE_DIR": str(root / "cache"), "H3_SIM_LOG": str(root / "sim-log.jsonl"),
            "H3BRIDGE_API_KEY": KEY}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny fixture model for the servers of one test module."""
    from h3bridge.sim.fixture import write_fixture_model
    return write_fixture_model(tmp_path_factory.mktemp("serve-model") / "MiniMax-H3")


def h3bridge_program() -> str:
    beside = Path(sys.executable).with_name("h3bridge")
    return str(beside) if beside.exists() else "h3bridge"


def sim_program() -> str:
    beside = Path(sys.executable).with_name("h3-sim")
    return str(beside) if beside.exists() else "h3-sim"


@dataclass
class ServerProcess:
    """One `h3bridge serve` child. `start()` returns once it accepts requests."""

    data_dir: Path
    model_dir: Path
    log_dir: Path
    engine: str = "session"
    extra_args: list[str] = field(default_factory=list)
    engine_path: str = ""          # default h3-sim; tests/test_upstream_build.py gives upstream's own h3
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    url: str = ""
    starts: int = 0

    @property
    def api(self) -> str:
        return f"{self.url}/v1"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"serve-{self.starts}.log"

    def start(self) -> "ServerProcess":
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        argv = [h3bridge_program(), "serve", "--port", "0", "--data-dir", str(self.data_dir),
                "--engine", self.engine, "--engine-path", self.engine_path or sim_program(), "--model-dir", str(self.model_dir),
                "--log-level", "warning", *self.extra_args]
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=stderr, start_new_session=True, env={**os.environ, **self.env})
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.url:
            match = _LISTENING.search(self.stderr_path.read_text(errors="replace"))
            if match:
                self.url = match[1]
                break
            if self.process.poll() is not None:
                raise AssertionError(f"h3bridge serve exited {self.process.returncode}:\n{self.log()}")
            assert time.monotonic() < deadline, f"h3bridge serve never listened:\n{self.log()}"
            time.sleep(0.02)
        with httpx.Client(timeout=5) as client:     # one client: each new one reads the CA bundle again
            while True:
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"h3bridge serve never became ready:\n{self.log()}"
                time.sleep(0.02)

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the server process (only it: an engine it runs lives on, as after a real crash)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(30)
        self.url = ""

    def stop(self) -> int:
        """SIGTERM and wait (the server stops its engine and finishes its answers)."""
        if self.process is None or self.process.poll() is not None:
            self._stop_engine_left_behind()
            return self.process.returncode if self.process else 0
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(30)
        finally:
            self.url = ""
            self._stop_engine_left_behind()

    def _stop_engine_left_behind(self) -> None:
        """Take the server's engine lock once: its orphan recovery stops an engine the server
        left running (its own process group, recorded beside the lock), as the next h3bridge
        on that machine would. A server SIGKILLed above never stopped its engine itself, and a
        hung h3-sim outlived a loaded run's suite that way."""
        lock_path = self.env.get("H3BRIDGE_LOCK_PATH")
        if lock_path:
            from h3bridge.engines.lock import engine_lock
            with engine_lock(path=Path(lock_path)):
                pass

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def openai_client(server: ServerProcess, api_key: str = "unused"):
    import warnings

    import openai
    warnings.filterwarnings("ignore", message="The Sora API", category=DeprecationWarning)
    return openai.OpenAI(base_url=server.api, api_key=api_key, max_retries=0, timeout=60)


def wait_finished(client, video_id: str, timeout: float = 60.0):
    """Poll a job until completed or failed (a safety-net timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        video = client.videos.retrieve(video_id)
        if video.status in ("completed", "failed"):
            return video
        assert time.monotonic() < deadline, f"{video_id} still {video.status}"
        time.sleep(0.05)


def mp4_frame_count(data: bytes) -> int:
    """Frames in an MP4 (decoding every one: a partial file fails or comes up short)."""
    import io

    import av
    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


def first_frame_rgb(data: bytes):
    """The first frame of an MP4, uint8 [H, W, 3]."""
    import io

    import av
    with av.open(io.BytesIO(data)) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgb24")
