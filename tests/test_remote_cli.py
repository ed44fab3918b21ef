"""`h3bridge generate --remote URL` refusals: local-engine flags, a URL that is not one, a server
that is not there; each exits 2 with the problem and the fix, and nothing is written. (The
end-to-end run against a real `h3bridge serve` is in tests/test_remote_server.py.)"""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from h3bridge.cli.main import build_parser, main

FAST_FLAGS = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2", "--quiet"]


def generate(capsys: pytest.CaptureFixture[str], tmp_path: Path, *flags: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(["generate", "-p", "a red fox", *FAST_FLAGS, "-o", str(tmp_path / "out" / "fox.mp4"), *flags])
    return status, capsys.readouterr().err


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("flags, named", [
    (["--engine-path", "/opt/h3/h3"], "--engine-path"),
    (["-d", "/models/MiniMax-H3"], "--model-dir"),
    (["--force"], "--force"),
    (["--stall-timeout", "30"], "--stall-timeout"),
])
def test_local_engine_flags_are_refused_with_remote(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                    flags: list[str], named: str) -> None:
    status, err = generate(capsys, tmp_path, "--remote", f"http://127.0.0.1:{closed_port()}", *flags)
    assert status == 2
    assert f"{named} is for a local engine and cannot be combined with --remote" in err
    assert f"drop {named}, or drop --remote" in err
    assert not (tmp_path / "out").exists()


def test_several_local_flags_are_named_together(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, err = generate(capsys, tmp_path, "--remote", "http://127.0.0.1:9", "--force", "--engine-path", "h3")
    assert status == 2 and "--engine-path and --force are for a local engine" in err


def test_a_local_engine_choice_contradicts_remote(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--session (now --engine session) with --remote: two engines named, said as a contradiction
    (cli/engine.py engine_kind; tests/test_cli_vocabulary.py has every pair)."""
    status, err = generate(capsys, tmp_path, "--remote", "http://127.0.0.1:9", "--session")
    assert status == 2 and "--remote http://127.0.0.1:9 and --session contradict each other" in err
    assert "drop --session to render on the server, or drop --remote" in err


def test_there_is_no_api_key_flag() -> None:
    generate_parser = build_parser()._subparsers._group_actions[0].choices["generate"]
    flags = {flag for action in generate_parser._actions for flag in action.option_strings}
    assert "--remote" in flags and not any("key" in flag for flag in flags)


def test_a_bad_url_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    status, err = generate(capsys, tmp_path, "--remote", "studio-mac:8000")
    assert status == 2 and "is not an http:// or https:// address" in err and "fix: give the server's address" in err


def test_no_server_at_the_url_names_it_and_the_fix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    status, err = generate(capsys, tmp_path, "--remote", url)
    assert status == 2
    assert f"cannot reach the server at {url}" in err and "connection refused" in err and "h3bridge serve" in err
    assert not (tmp_path / "out").exists()


def test_a_bad_request_is_refused_before_contacting_the_server(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    capsys.readouterr()
    status = main(["generate", "-p", "a fox", "--frames", "23", "--remote", f"http://127.0.0.1:{closed_port()}",
                   "-o", str(tmp_path / "a.mp4")])
    err = capsys.readouterr().err
    assert status == 2 and "--frames 23 is not a legal H3 length" in err and "cannot reach" not in err
