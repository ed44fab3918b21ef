"""The H3 Engine node's remote mode: a Videos API server (`h3bridge serve` on another Mac, or an
SGLang Diffusion / vLLM-Omni server) as the engine, through RemoteEngine.

The node holds only the URL. The API key is read from $H3BRIDGE_API_KEY in ComfyUI's environment
by the engine, when a job is sent: it is never a node input, so it never lands in a workflow or
prompt JSON that users save and share, nor in the engine handle ComfyUI caches.
"""
from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EngineNotFoundError, RequestError
from ..vocabulary import EngineKind

if TYPE_CHECKING:
    from ..engines.remote import RemoteEngine

REMOTE = EngineKind.REMOTE.value


def check_remote_settings(remote_url: str) -> str:
    """The server's base URL from the node's values; refuses an empty or malformed URL before
    anything is sent. The local engine's inputs (engine_path, model_dir) are not read in remote
    mode: the server runs its own engine and model, and switching modes must not mean clearing them."""
    if not remote_url.strip():
        raise RequestError("remote mode needs the server's URL in remote_url", field="remote_url",
                           hint="give the server's address, e.g. http://studio-mac.local:8765")
    try:
        return _remote_module().normalise_base_url(remote_url)
    except RequestError as error:
        error.field = "remote_url"
        raise


def open_remote_engine(remote_url: str) -> "RemoteEngine":
    """The engine for a remote handle; it reads the key from the environment at each job."""
    engine = _remote_module().RemoteEngine(remote_url)
    _quiet_requests_to(engine.base_url)
    return engine


class _QuietRequests(logging.Filter):
    """Drops httpx's one INFO line per request ("HTTP Request: GET .../v1/videos/ID ...") for the
    servers the H3 nodes poll: ComfyUI shows INFO in its console, and a job polls every second.
    Other httpx users in ComfyUI's process keep their lines; warnings and errors always pass."""

    def __init__(self) -> None:
        super().__init__()
        self.servers: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO or not isinstance(record.args, tuple) or len(record.args) < 2:
            return True
        url = str(record.args[1])
        return not any(url.startswith(server) for server in self.servers)


_QUIET = _QuietRequests()


def _quiet_requests_to(base_url: str) -> None:
    _QUIET.servers.add(base_url.rstrip("/") + "/")
    logger = logging.getLogger("httpx")
    if _QUIET not in logger.filters:
        logger.addFilter(_QUIET)


def _remote_module():
    """engines/remote.py, imported when remote mode is used: it needs httpx and pydantic, which
    the node pack's local modes do not."""
    try:
        from ..engines import remote
    except ImportError as error:
        # ComfyUI's own Python, by its path: the `python` on PATH is often another one
        requirements = Path(__file__).resolve().parents[2] / "requirements.txt"
        install = shlex.join([sys.executable, "-m", "pip", "install", "-r", str(requirements)])
        raise EngineNotFoundError(f"remote mode needs the Python package {error.name}, which ComfyUI's Python lacks",
                                  hint=f"install h3bridge's requirements into ComfyUI's Python: {install}") from None
    return remote


__all__ = ["REMOTE", "check_remote_settings", "open_remote_engine"]
