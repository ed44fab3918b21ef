"""h3-sim starts without the rest of h3bridge: the engines launch it once per job (hundreds of times a
suite run), and `python -m h3bridge.sim` imports the `h3bridge` package first, so whatever
h3bridge/__init__.py imports every h3-sim start pays for. The public API is imported lazily (PEP 562);
these tests list what a real h3-sim process imported (`-X importtime` names every module it loads),
so they fail if the package, or the sim, starts pulling in the bridge again. No timing is measured
here: bench/bench_sim_startup.py measures it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import h3bridge
from sim_helpers import make_model

REPOSITORY = Path(h3bridge.__file__).resolve().parent.parent

# What the sim has no use for. numpy is not here: the sim draws its frames and audio with it.
HEAVY = ("av", "PIL", "fastapi", "starlette", "uvicorn", "httpx", "pydantic", "huggingface_hub", "tqdm",
         "psutil", "filelock", "yaml", "tokenizers", "torch")
# The bridge around the sim: engines, model inspection, media decoding, storyboards, the server.
BRIDGE = ("h3bridge.engines", "h3bridge.model", "h3bridge.media", "h3bridge.story", "h3bridge.server",
          "h3bridge.fleet", "h3bridge.lora", "h3bridge.comfy", "h3bridge.cli", "h3bridge.request")


def imported_modules(*arguments: str, cwd: Path) -> set[str]:
    """Every module a `python -X importtime ARGUMENTS` child imported (its stderr names each one)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *arguments], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPOSITORY)}, timeout=120)
    names = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert names, done.stderr      # the listing was read (else every check below would pass vacuously)
    return names


def unwanted(names: set[str]) -> list[str]:
    return sorted(name for name in names
                  if name.split(".")[0] in HEAVY or any(name == b or name.startswith(b + ".") for b in BRIDGE))


def test_importing_h3bridge_imports_none_of_its_subpackages(tmp_path: Path) -> None:
    names = imported_modules("-c", "import h3bridge", cwd=tmp_path)
    assert "h3bridge" in names
    assert sorted(name for name in names if name.startswith("h3bridge.")) == []
    assert unwanted(names) == []


def test_h3_sim_help_imports_only_the_sim(tmp_path: Path) -> None:
    names = imported_modules("-m", "h3bridge.sim", "--help", cwd=tmp_path)
    assert "h3bridge.sim.cli" in names
    assert unwanted(names) == []


def test_an_h3_sim_generation_imports_only_the_sim(tmp_path: Path) -> None:
    model = make_model(tmp_path / "model")
    output = tmp_path / "clip.mp4"
    names = imported_modules("-m", "h3bridge.sim", "-d", str(model), "-p", "a fox", "--width", "64",
                             "--height", "64", "--steps", "2", "--frames", "22", "-o", str(output), cwd=tmp_path)
    assert output.stat().st_size > 0          # it really generated
    assert {"h3bridge.sim.engine", "numpy"} <= names
    assert unwanted(names) == []


def test_every_public_name_resolves_lazily() -> None:
    namespace: dict[str, object] = {}
    exec("from h3bridge import *", namespace)
    assert set(h3bridge.__all__) <= set(namespace)
    assert set(h3bridge.__all__) <= set(dir(h3bridge))
    assert h3bridge.GenerationRequest.__module__ == "h3bridge.request"
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        h3bridge.NoSuchThing     # noqa: B018
