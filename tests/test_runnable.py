"""The engine choice's one vocabulary (vocabulary.EngineKind) and the commands messages show
(runnable.py): each form runnable as shown, in the environment that shows it."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from h3bridge import runnable
from h3bridge.vocabulary import ENGINE_KINDS, OLD_ENGINE_SPELLINGS, EngineKind, read_engine_kind

CHECKOUT = Path(runnable.__file__).resolve().parent.parent


def test_every_engine_kind_reads_as_itself() -> None:
    assert ENGINE_KINDS == ("one-shot", "session", "library", "remote")
    for spelling in ENGINE_KINDS:
        assert read_engine_kind(spelling) == (EngineKind(spelling), None)
        assert read_engine_kind(EngineKind(spelling)) == (EngineKind(spelling), None)
        assert str(EngineKind(spelling)) == spelling


@pytest.mark.parametrize("old, kind", sorted(OLD_ENGINE_SPELLINGS.items()))
def test_old_engine_spellings_read_as_the_current_kind_and_are_reported(old: str, kind: EngineKind) -> None:
    assert read_engine_kind(old) == (kind, old)


@pytest.mark.parametrize("bad", ["", "warm", "one shot", "sessions", "LIBRARY\0", None, 3])
def test_anything_else_is_refused_naming_every_engine(bad: object) -> None:
    with pytest.raises(ValueError) as caught:
        read_engine_kind(bad)
    assert all(kind in str(caught.value) for kind in ENGINE_KINDS)


def _words_in(env_path: str, *arguments: str) -> list[str]:
    """command_words as a fresh interpreter with PATH=env_path computes it."""
    code = ("import json, sys; from h3bridge.runnable import command_words; "
            "print(json.dumps(command_words(*sys.argv[1:])))")
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True, check=True,
                          env={**os.environ, "PATH": env_path})
    import json
    return json.loads(done.stdout)


def _run(words: list[str], env_path: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(words, capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**os.environ, "PATH": env_path})


def test_without_the_console_scripts_on_path_the_command_is_this_python_and_it_runs(tmp_path: Path) -> None:
    # what a ComfyUI started from the Dock sees: no venv bin folder on PATH
    bare_path = os.pathsep.join(folder for folder in os.environ.get("PATH", "").split(os.pathsep)
                                if Path(folder).resolve() != Path(sys.executable).parent.resolve()) or "/usr/bin"
    words = _words_in(bare_path, "h3bridge", "--version")
    assert words[0] == sys.executable, words
    done = _run(words, bare_path, tmp_path)    # from an unrelated folder, as shown
    assert done.returncode == 0 and done.stdout.startswith("h3bridge "), done.stderr
    fixture = _words_in(bare_path, "h3-sim-model", str(tmp_path / "model"))
    assert fixture[0] == sys.executable
    assert _run(fixture, bare_path, tmp_path).returncode == 0
    assert (tmp_path / "model" / "config.json").is_file() or any((tmp_path / "model").iterdir())


def test_with_the_console_scripts_first_on_path_the_command_is_the_script(tmp_path: Path) -> None:
    scripts = Path(sys.executable).parent
    if not (scripts / "h3bridge").is_file():
        pytest.skip("this Python has no h3bridge console script beside it (not a pip install)")
    path = os.pathsep.join([str(scripts), os.environ.get("PATH", "")])
    words = _words_in(path, "h3bridge", "--version")
    assert words == ["h3bridge", "--version"]
    assert _run(words, path, tmp_path).returncode == 0


def test_a_checkout_loaded_by_path_runs_through_its_own_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ComfyUI's custom_nodes clone: no Python has h3bridge installed, so the command names the checkout."""
    monkeypatch.setattr(runnable, "script_runs_here", lambda script: False)
    monkeypatch.setattr(runnable, "_importable_by_any_python", lambda: False)
    words = runnable.command_words("h3bridge", "--version")
    assert words == [sys.executable, str(CHECKOUT), "--version"]
    done = subprocess.run(words, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("h3bridge "), done.stderr
    fixture = runnable.command_words("h3-sim-model", str(tmp_path / "fixture model"))
    assert fixture[:4] == [sys.executable, str(CHECKOUT), "--module", "h3bridge.sim.fixture_cli"]
    done = subprocess.run(fixture, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert any((tmp_path / "fixture model").iterdir())
    # hf is huggingface_hub's, never the checkout's
    assert runnable.command_words("hf", "download")[:3] == [sys.executable, "-m", "huggingface_hub.cli.hf"]


def test_the_shown_line_quotes_what_a_shell_would_split() -> None:
    line = runnable.command("h3-sim-model", "/tmp/a model dir")
    assert shlex.split(line)[-1] == "/tmp/a model dir"


def test_every_console_script_has_a_module_that_python_m_runs(tmp_path: Path) -> None:
    import tomllib
    scripts = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) <= set(runnable.MODULE_OF_SCRIPT)
    for script in scripts:
        done = subprocess.run([sys.executable, "-m", runnable.MODULE_OF_SCRIPT[script], "--help"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, (script, done.stderr)
