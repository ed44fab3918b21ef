"""Shared fixtures for the COMFY tests (imported by test modules, not a conftest)."""
from __future__ import annotations

from pathlib import Path

import pytest

from h3bridge.sim.fixture import write_fixture_model


@pytest.fixture(scope="session")
def fixture_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny MiniMax-H3 directory with the official layout (h3-sim-model)."""
    return write_fixture_model(tmp_path_factory.mktemp("models") / "MiniMax-H3")
