"""A fleet on loopback for tests/test_fleet_litellm.py and bench/bench_fleet.py: several `h3bridge serve`
children (remote_helpers.start_server: one-shot engine over h3-sim, isolated folders, free ports)
and LiteLLM's real proxy in front of them, configured by `h3bridge fleet`'s own writer.

The proxy is the base `litellm` package's `litellm` command (the `litellm[proxy]` extra cannot be
installed from the registry; the `fleet` extra lists the proxy's runtime dependencies instead),
started with LITELLM_LOCAL_MODEL_COST_MAP=True so it never reaches for the network, HOME in a
folder of its own, on a free loopback port. Its start takes a minute on a loaded 2-core machine
(measured: 75 s), so callers share one proxy across what they test."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from remote_helpers import KEY, ServerProcess, start_server

MASTER_KEY = "sk-fleet-master-0123456789"      # the proxy's key in the tests (LITELLM_MASTER_KEY)
PROXY_READY_TIMEOUT = 300.0     # a safety net on a loaded machine, not an expected time


def litellm_program() -> str | None:
    """The proxy's command beside this Python, else on PATH (a virtualenv that borrows its
    packages from another, as a worktree's does, has no `litellm` script of its own)."""
    beside = Path(sys.executable).with_name("litellm")
    return str(beside) if beside.exists() else shutil.which("litellm")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_fleet_servers(root: Path, model: Path, count: int, *, max_queued: int = 1,
                        extra_env: dict[str, str] | None = None) -> list[ServerProcess]:
    servers: list[ServerProcess] = []
    try:
        for index in range(count):
            servers.append(start_server(root / f"server-{index}", model, extra_env=extra_env,
                                        extra_args=("--max-queued", str(max_queued))))
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


@dataclass
class ProxyProcess:
    """LiteLLM's proxy as a child in its own process group. `start()` returns once it answers."""

    config: Path
    root: Path
    port: int = 0
    process: subprocess.Popen | None = None
    started_in: float = 0.0       # seconds from spawn to ready (the docs quote it)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "proxy.log"

    def start(self) -> "ProxyProcess":
        program = litellm_program()
        assert program is not None, "litellm is not installed beside this Python"
        self.port = self.port or free_port()
        home = self.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HOME": str(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "LITELLM_MASTER_KEY": MASTER_KEY, "H3BRIDGE_API_KEY": KEY, "LITELLM_LOG": "ERROR",
               "NO_PROXY": "127.0.0.1,localhost", **self.env}
        env.pop("DATABASE_URL", None)
        began = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([program, "--config", str(self.config), "--host", "127.0.0.1",
                                             "--port", str(self.port), "--num_workers", "1"],
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, env=env, cwd=self.root)
        deadline = began + PROXY_READY_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"the LiteLLM proxy exited {self.process.returncode}:\n{self.log()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/health/liveliness", timeout=5).status_code == 200:
                    self.started_in = time.monotonic() - began
                    return self
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the LiteLLM proxy never answered:\n{self.log()[-4000:]}"
            time.sleep(0.25)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def start_front(root: Path, model: Path, servers: list[str], *, servers_file: Path | None = None,
                max_queued: int | None = None, port: int = 0) -> ServerProcess:
    """A fleet's front, `h3bridge serve --server URL ...` (no engine of its own: `model` is only
    what ServerProcess passes every server; the front ignores it), its own folders and key."""
    from server_helpers import isolated_env
    args = [arg for url in servers for arg in ("--server", url)]
    if servers_file is not None:
        args += ["--servers-file", str(servers_file)]
    if max_queued is not None:
        args += ["--max-queued", str(max_queued)]
    front = ServerProcess(data_dir=root / "data", model_dir=model, log_dir=root / "logs", engine="one-shot",
                          extra_args=args, env=isolated_env(root))
    if port:
        front.extra_args += ["--port", str(port)]
    return front.start()


def proxy_client(proxy: ProxyProcess, *, max_retries: int = 0):
    """The official client, pointed at the proxy with its master key."""
    import warnings

    import openai
    warnings.filterwarnings("ignore", message="The Sora API", category=DeprecationWarning)
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=MASTER_KEY, max_retries=max_retries, timeout=120)


def server_job_ids(server: ServerProcess) -> list[str]:
    """The jobs a server holds, from its own list (GET /v1/videos)."""
    response = httpx.get(f"{server.url}/v1/videos", params={"limit": 100, "order": "asc"},
                         headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    response.raise_for_status()
    return [job["id"] for job in response.json()["data"]]
