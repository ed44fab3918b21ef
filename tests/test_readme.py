"""The README's first screen, run exactly as written (issue 9 item 9)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SYNTHETIC = "synthetic test patterns from h3-sim, not model output"


def readme_sh_blocks() -> list[str]:
    """The README's ```sh blocks (tests/test_docs.py reads fenced blocks the same way)."""
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)]


def fresh_machine_environment(home: Path) -> dict[str, str]:
    """This machine as a newcomer's shell sees it: HOME elsewhere, no virtual environment active
    (the suite's own venv is taken off PATH), nothing h3bridge-specific set."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("H3", "VIRTUAL_ENV", "PYTHON", "XDG_")) and k != "PATH"}
    env.update(HOME=str(home), PATH=path)
    return env


@pytest.mark.timeout(600)
def test_the_any_machine_command_works_on_a_fresh_home_and_again(tmp_path: Path) -> None:
    """It used to fail on a stock Debian/Ubuntu Python (`pip install -e .` outside a venv is
    refused: externally managed environment) and stopped at the second run on the existing
    fox.mp4, which it had left untracked in the checkout. Run it literally, twice, with HOME in a
    temporary folder: both runs succeed, each writes its own clip under HOME, labelled synthetic,
    and the checkout gains no clip."""
    line = "python3 -m venv ~/.venvs/h3bridge && . ~/.venvs/h3bridge/bin/activate && pip install -e . && h3bridge demo -o ~/"
    assert line in readme_sh_blocks(), "README \"Generate a clip\" shows this any-machine command, as one line"
    home = tmp_path / "home"
    home.mkdir()
    env = fresh_machine_environment(home)
    if shutil.which("bash") is None:
        pytest.skip("no bash to run the README's line in")
    probe = subprocess.run(["bash", "-c", "python3 -m venv \"$1\"", "-", str(tmp_path / "probe")],
                           env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a virtual environment here: {probe.stderr.strip()[-300:]}")
    for run, clip in enumerate(("h3bridge-demo.mp4", "h3bridge-demo-2.mp4"), start=1):
        done = subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=540)
        assert done.returncode == 0, f"run {run}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        assert (home / clip).is_file() and (home / clip).stat().st_size > 0, f"run {run}: {sorted(os.listdir(home))}"
        assert f"{home / clip} holds {SYNTHETIC}" in done.stderr
    assert not list(REPO.glob("*.mp4")), "a clip landed in the checkout"
