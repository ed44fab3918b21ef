"""Shared fixtures for the COMFY tests (imported by test modules, not a conftest)."""
from __future__ import annotations

from pathlib import Path

import pytest

from h3bridge.sim.fixture import write_fixture_model


@pytest.fixture(scope="session")
def fixture_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny MiniMax-H3 directory with the official layout (h3-sim-model)."""
    return write_fixture_model(tmp_path_factory.mktemp("models") / "MiniMax-H3")


@pytest.fixture(scope="session")
def realistic_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The released tensor shapes as sparse files: real sizes for memory plans, no disk used."""
    return write_fixture_model(tmp_path_factory.mktemp("models") / "MiniMax-H3-realistic", realistic=True)


def require_comfyui_in_process() -> "object":
    """For node tests that call ComfyUI nodes in-process: skip the module unless torch and ComfyUI
    import (ComfyUI's own python, COMFYUI_DIR set); returns torch. Call it at module level, before
    importing any node module."""
    import os
    import sys
    torch = pytest.importorskip("torch", reason="the ComfyUI node tests need torch (a ComfyUI environment)")
    # Only now: with ComfyUI on sys.path but no torch, the repository root's __init__.py (which pytest
    # imports as a package, and which loads the nodes when comfy_api is importable) would break every
    # other test module collected in the same run.
    if os.environ.get("COMFYUI_DIR") and os.environ["COMFYUI_DIR"] not in sys.path:
        sys.path.insert(0, os.environ["COMFYUI_DIR"])
    cli_args = pytest.importorskip("comfy.cli_args", reason="the ComfyUI node tests need ComfyUI (set COMFYUI_DIR)")
    # In-process ComfyUI parses no command line: without --cpu, importing comfy.model_management
    # (nodes.py does) asks CUDA for a device and fails on machines without a GPU driver. ComfyUI's own
    # unit tests set the flag the same way.
    cli_args.args.cpu = True
    pytest.importorskip("comfy_api.latest", reason="the ComfyUI node tests need ComfyUI (set COMFYUI_DIR)")
    return torch
