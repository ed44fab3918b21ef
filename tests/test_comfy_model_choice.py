"""The missing-model message of the ComfyUI nodes (the exact download command and the size) and
the list behind the H3 Model node (adapter level: no ComfyUI needed). The node itself, in-process:
tests/test_comfy_model_node.py."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from h3bridge.cli.main import build_parser
from h3bridge.comfy import adapter
from h3bridge.runnable import command_words
from h3bridge.errors import ModelError
from h3bridge.sim.fixture import write_fixture_model


def _download_command(hint: str) -> list[str]:
    """The command the hint shows (between backquotes, ending `model download DIR`)."""
    end = hint.index("`", hint.index(" model download ") + 1)
    start = hint.rindex("`", 0, end) + 1
    return shlex.split(hint[start:end])


def test_a_missing_model_name_says_the_exact_download_command_and_the_size(tmp_path: Path) -> None:
    roots = [tmp_path / "ComfyUI/models/h3", tmp_path / "elsewhere/h3"]
    with pytest.raises(ModelError) as caught:
        adapter.resolve_model_dir(adapter.DEFAULT_MODEL_NAME, roots)
    hint = caught.value.hint or ""
    command = _download_command(hint)
    # as it runs where the message is shown: the console script, or this Python with -m / the checkout
    assert command == command_words("h3bridge", "model", "download", str(roots[0] / "MiniMax-H3"))
    arguments = command[command.index("model"):]
    args = build_parser().parse_args(arguments)          # the suggested command is one the CLI takes
    assert args.directory == roots[0] / "MiniMax-H3" and args.partition == "all"
    # what each choice downloads in total (issue 30): all ~196 GiB, FL2VA alone ~134 GiB
    # FL2VA alone as the whole command that downloads it (issue 34.3: not a bare `--partition FL2VA` flag)
    assert "about 196 GiB with all, the default" in hint
    assert f"about 134 GiB with `{shlex.join([*command, '--partition', 'FL2VA'])}`" in hint


def test_a_missing_absolute_path_says_the_download_command_for_that_path(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "MiniMax-H3"
    with pytest.raises(ModelError) as caught:
        adapter.resolve_model_dir(str(missing), [])
    assert _download_command(caught.value.hint or "") == command_words("h3bridge", "model", "download", str(missing))


def test_installed_models_lists_the_model_folders_under_every_root(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    write_fixture_model(first / "MiniMax-H3", ref2va=False)
    (first / "not-a-model").mkdir()
    (first / "loose.txt").write_text("x")
    (second / "turbo" / "Ref2VA").mkdir(parents=True)        # an unfinished download is listed too
    assert adapter.installed_models([first, second, tmp_path / "absent"]) == ["MiniMax-H3", "turbo"]
    assert adapter.installed_models([]) == []


def test_remote_modes_missing_package_names_comfyuis_own_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fix runs as shown inside ComfyUI: its own Python by path (the `python` on PATH is often
    another one), and the pack's requirements.txt by path."""
    import sys

    import h3bridge.engines
    from h3bridge.comfy import remote
    from h3bridge.errors import EngineNotFoundError
    monkeypatch.delattr(h3bridge.engines, "remote", raising=False)
    monkeypatch.setitem(sys.modules, "h3bridge.engines.remote", None)     # as if httpx were missing
    with pytest.raises(EngineNotFoundError) as caught:
        remote.check_remote_settings("http://127.0.0.1:9")
    hint = caught.value.hint or ""
    words = shlex.split(hint[hint.index(sys.executable):])
    assert words[:5] == [sys.executable, "-m", "pip", "install", "-r"]
    assert Path(words[5]).name == "requirements.txt" and Path(words[5]).is_file()


def test_every_missing_piece_is_found_at_once_each_with_its_input(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh install (no h3, no H3_BIN, no model): the engine AND the model, in that order, each
    led by the H3 Engine input it is about (issue 30: one per run before)."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("H3_BIN", raising=False)
    roots = [tmp_path / "models" / "h3"]
    problems = adapter.engine_setting_problems("", adapter.DEFAULT_MODEL_NAME, "one-shot", roots)
    assert [adapter.problem_input(problem) for problem in problems] == ["engine_path", "model_dir"]
    text = adapter.problems_text(problems)
    assert text.startswith("2 things to fix before this can run:\n1. engine_path: ")
    assert "\n2. model_dir: model directory 'MiniMax-H3' was not found" in text
    with pytest.raises(Exception) as caught:          # the node's run says the same, once
        adapter.check_engine_settings("", adapter.DEFAULT_MODEL_NAME, "one-shot", roots)
    assert str(caught.value).startswith("2 things to fix before this can run:")
    # the old mode name is read through the vocabulary; an unknown one is refused naming the choices
    assert adapter.engine_mode("warm session") == ("session", "warm session")
    assert adapter.engine_mode("session") == ("session", None)
    refused = adapter.engine_setting_problems("", "", "warm", roots)
    assert adapter.problems_text(refused).startswith("mode: unknown engine mode 'warm'")
    assert "one-shot, session, library, remote" in (refused[0].hint or "")
    # remote mode reads only its URL
    assert adapter.engine_setting_problems("", "", "remote", roots, remote_url="http://127.0.0.1:9") == []


def test_h3_models_check_with_nothing_installed_names_the_folder_and_the_command(tmp_path: Path) -> None:
    roots = [tmp_path / "models" / "h3"]
    for value in (adapter.NO_MODEL_INSTALLED, adapter.DEFAULT_MODEL_NAME):
        with pytest.raises(ModelError) as caught:
            adapter.check_model_choice(value, roots)
        assert str(roots[0]) in caught.value.message
        assert _download_command(caught.value.hint or "") == command_words(
            "h3bridge", "model", "download", str(roots[0] / "MiniMax-H3"))
    write_fixture_model(roots[0] / "MiniMax-H3")
    assert adapter.check_model_choice("MiniMax-H3", roots) == roots[0] / "MiniMax-H3"
