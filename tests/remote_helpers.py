"""The `h3bridge serve` children the remote tests and bench/bench_remote.py drive RemoteEngine
against: server_helpers.ServerProcess (its own process group, a free loopback port, readiness from
its listening line and /health) with the one-shot engine over h3-sim and isolated folders."""
from __future__ import annotations

import functools
from pathlib import Path

import httpx

import pytest

from server_helpers import KEY, ServerProcess, isolated_env

__all__ = ["KEY", "ServerProcess", "get", "start_server"]


def start_server(root: Path, model: Path, *, extra_env: dict[str, str] | None = None,
                 extra_args: tuple[str, ...] = ()) -> ServerProcess:
    """A started server (stop it with `.stop()`); `extra_env` reaches its engine (H3_SIM_* faults)."""
    return ServerProcess(data_dir=root / "data", model_dir=model, log_dir=root / "logs", engine="one-shot",
                         extra_args=list(extra_args), env={**isolated_env(root), **(extra_env or {})}).start()


@functools.cache
def _client() -> httpx.Client:
    # One client for every get(): tests poll with it, and a new client reads the CA bundle again
    # each time (~70 ms of CPU taken from the server being polled).
    return httpx.Client(headers={"Authorization": f"Bearer {KEY}"}, timeout=30)


def get(server: ServerProcess, path: str) -> httpx.Response:
    """GET a server path with the key, as the tests' client would."""
    return _client().get(server.url + path)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The servers' API key, given to RemoteEngine through the environment as a user does."""
    monkeypatch.setenv("H3BRIDGE_API_KEY", KEY)
    return KEY
