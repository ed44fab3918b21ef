"""Shared fixtures for the MODEL tests (inventory, verify, CLI): fixture models written once per
test module and copied per test, so a test may damage its copy."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from h3bridge.sim.fixture import write_fixture_model


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny official-layout model with both partitions (never modified)."""
    return write_fixture_model(tmp_path_factory.mktemp("template") / "MiniMax-H3")


@pytest.fixture
def model(template: Path, tmp_path: Path) -> Path:
    """A private copy of `template` that the test may damage."""
    return copy_model(template, tmp_path)


@pytest.fixture(scope="module")
def fl2va_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny official-layout model without the Ref2VA partition (never modified)."""
    return write_fixture_model(tmp_path_factory.mktemp("fl2va-template") / "MiniMax-H3", ref2va=False)


def copy_model(template: Path, tmp_path: Path) -> Path:
    """A private copy of a fixture model for one test."""
    return Path(shutil.copytree(template, tmp_path / "MiniMax-H3"))
