"""`h3bridge generate --engine session` (h3bridge/cli/main.py) against h3-sim's interactive mode."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core_helpers import model_dir, sim_engine_path, sim_invocations, sim_log  # noqa: F401  (fixtures)
from h3bridge.cli.main import main

CLIP = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2"]


@pytest.fixture(autouse=True)
def _private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()


def test_generate_session_runs_through_interactive_mode(model_dir: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out" / "fox.mp4"
    code = main(["generate", "--engine", "session", "--engine-path", str(sim_engine_path()), "-d", str(model_dir),
                 "-p", "a red fox", *CLIP, "--seed", "7", "-o", str(output), "--json", "--quiet", "--read-frames"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["video_path"] == str(output) and output.is_file()
    assert summary["frames_shape"] == [22, 64, 96, 3] and summary["seed"] == 7
    assert summary["command"][-1] == "a red fox" and "!seed 7" in summary["command"]
    [invocation] = sim_invocations(sim_log)
    assert "-p" not in invocation["argv"]          # interactive mode: no -p (main.c -> h3_cli_run)


def test_generate_session_falls_back_to_one_shot_for_multiline_prompts(
        model_dir: Path, tmp_path: Path, sim_log: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    output = tmp_path / "fox.mp4"
    code = main(["generate", "--engine", "session", "--engine-path", str(sim_engine_path()), "-d", str(model_dir),
                 "-p", "a red fox\nin the snow", *CLIP, "-o", str(output), "--quiet", "--no-frames"])
    assert code == 0 and output.is_file()
    assert "running it one-shot instead" in capsys.readouterr().err
    [invocation] = sim_invocations(sim_log)
    assert invocation["argv"][invocation["argv"].index("-p") + 1] == "a red fox\nin the snow"
