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
