"""Where `h3bridge serve` may listen without a key, and what counts as a key (issue 19 item 6):
the host is judged by the addresses it resolves to, every one of which must be loopback, never
by its spelling; a key must be at least 16 visible ASCII characters."""
from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from h3bridge import RequestError
from h3bridge.server import app as server_app
from h3bridge.server.app import MIN_API_KEY_CHARS, check_api_key, check_bind

from server_helpers import KEY, ServerProcess, h3bridge_program, isolated_env, model  # noqa: F401  (a fixture)

# What a resolver might answer, without DNS: name -> addresses (getaddrinfo's 5-tuples below).
FAKE_NAMES = {
    "127.lan.example": ["0.0.0.0"],                    # spelled like loopback, is every interface
    "localhost.evil.example": ["127.0.0.1", "192.168.1.20"],
    "mybox.internal": ["127.0.0.1", "::1"],
    "mapped.internal": ["::ffff:127.0.0.1"],
    "lan.internal": ["fe80::1%eth0"],
}


@pytest.fixture
def fake_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in FAKE_NAMES:
            return [(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                     (address, port or 0)) for address in FAKE_NAMES[host]]
        if isinstance(host, str) and host.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, port, *args, **kwargs)
    monkeypatch.setattr(server_app.socket, "getaddrinfo", getaddrinfo)


@pytest.mark.usefixtures("fake_resolver")
def test_a_name_is_loopback_only_when_everything_it_resolves_to_is() -> None:
    for host in ("127.lan.example", "localhost.evil.example", "lan.internal", "nowhere.invalid", "0.0.0.0", "::"):
        with pytest.raises(RequestError) as caught:
            check_bind(host, None)
        assert caught.value.field == "api_key" and "without an API key" in caught.value.message, host
        check_bind(host, KEY)
    refusal = pytest.raises(RequestError, check_bind, "127.lan.example", None).value
    assert "resolves to 0.0.0.0" in refusal.message and "secrets.token_urlsafe" in (refusal.hint or "")
    for host in ("mybox.internal", "mapped.internal", "localhost", "127.0.0.1", "127.0.0.2", "::1"):
        check_bind(host, None)


@pytest.mark.parametrize("key", ["x", " ", "\t", " " * 40, "a" * (MIN_API_KEY_CHARS - 1),
                                 "correct horse battery staple", "k" * 20 + "\u00e9", "k" * 20 + "\n"],
                         ids=["one char", "space", "tab", "spaces", "15 chars", "with spaces", "non-ASCII", "newline"])
def test_a_key_must_be_a_key(key: str) -> None:
    with pytest.raises(RequestError) as caught:
        check_api_key(key)
    assert caught.value.field == "api_key" and "secrets.token_urlsafe" in (caught.value.hint or "")
    with pytest.raises(RequestError):
        check_bind("127.0.0.1", key)        # a key given is checked wherever the server listens


def test_the_suggested_key_is_a_key() -> None:
    import secrets
    check_api_key(secrets.token_urlsafe(32))
    check_api_key(KEY)


def without_key_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "H3BRIDGE_API_KEY"}


@pytest.mark.parametrize("key", [" ", "\t", "x"], ids=["space", "tab", "one char"])
def test_serve_refuses_a_key_that_is_not_one(key: str, tmp_path: Path) -> None:
    run = subprocess.run([h3bridge_program(), "serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path / "d")],
                         capture_output=True, text=True, env=without_key_env() | {"H3BRIDGE_API_KEY": key},
                         timeout=60)
    assert run.returncode == 2, run.stderr
    assert "at least 16 visible ASCII characters" in run.stderr and "secrets.token_urlsafe(32)" in run.stderr
    assert not (tmp_path / "d").exists()


def test_serve_listens_without_a_key_on_a_name_that_resolves_to_loopback(tmp_path: Path, model: Path) -> None:  # noqa: F811
    env = {k: v for k, v in isolated_env(tmp_path).items() if k != "H3BRIDGE_API_KEY"}
    server = ServerProcess(tmp_path / "data", model, tmp_path / "logs", env=env, extra_args=["--host", "localhost"])
    saved = os.environ.pop("H3BRIDGE_API_KEY", None)
    try:
        with server:
            assert server.url.startswith("http://127.0.0.1:")
            assert httpx.get(f"{server.api}/videos", timeout=30).status_code == 200    # no key needed
    finally:
        if saved is not None:
            os.environ["H3BRIDGE_API_KEY"] = saved
