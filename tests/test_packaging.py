"""Packaging metadata: the license as an SPDX expression with its file (setuptools deprecated
the TOML table form; builds using it stop on 2027-02-18), checked statically here and in the
built packages by tests/test_package_build.py (one build of the sdist and the wheel, from a copy
of the sources: a build writes beside them, never into the checkout)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:     # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_an_spdx_expression_with_its_file():
    project = pyproject()["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the h3bridge authors" in text
    # PEP 639: a license expression replaces the License :: classifiers (setuptools refuses both)
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]


def test_build_backend_reads_license_expressions():
    requires = pyproject()["build-system"]["requires"]
    setuptools = next(r for r in requires if r.startswith("setuptools"))
    match = re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", setuptools.replace(" ", ""))
    assert match is not None and int(match[1]) >= 77, setuptools   # 77.0.0: license expressions
