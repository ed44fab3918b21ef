"""A real `h3bridge serve` child for the remote tests and bench/bench_remote.py: a free loopback
port, its own process group (stopped by `stop`), its own data, cache and engine-lock folders;
ready once it prints its "listening on" line and /health answers."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx

from core_helpers import sim_engine_path

KEY = "test-server-key-0123456789"
STARTUP_TIMEOUT = 60.0      # a safety net only: readiness is the server's own line


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    root: Path
    stderr_lines: list[str]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)


def start_server(root: Path, model: Path, *, extra_env: dict[str, str] | None = None,
                 extra_args: tuple[str, ...] = ()) -> Server:
    root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"H3BRIDGE_CACHE_DIR": str(root / "cache"), "H3BRIDGE_LOCK_PATH": str(root / "engine.lock"),
                "H3BRIDGE_MACHINE_DIR": str(root / "machine"), "H3BRIDGE_API_KEY": KEY, **(extra_env or {})})
    argv = [sys.executable, "-m", "h3bridge.cli", "serve", "--host", "127.0.0.1", "--port", "0",
            "--data-dir", str(root / "data"), "--engine", "oneshot", "--engine-path", str(sim_engine_path()),
            "--model-dir", str(model), "--log-level", "warning", *extra_args]
    process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()
    found: list[str] = []

    def read() -> None:
        for line in process.stderr:       # keeps draining, so the server never blocks on a full pipe
            lines.append(line)
            match = re.search(r"listening on (http://\S+)", line)
            if match and not found:
                found.append(match[1])
                ready.set()
        ready.set()                      # EOF: the server died

    threading.Thread(target=read, daemon=True).start()
    ready.wait(STARTUP_TIMEOUT)
    server = Server(found[0] if found else "", process, root, lines)
    if not found:
        server.stop()
        raise RuntimeError("h3bridge serve did not start:\n" + "".join(lines))
    assert server.get("/health").status_code == 200
    return server
