"""Packaging metadata: the license as an SPDX expression with its file (setuptools deprecated
the TOML table form; builds using it stop on 2027-02-18), checked statically and by one real
wheel build."""
from __future__ import annotations

import re
import subprocess
import sys
import zipfile
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


@pytest.mark.slow
def test_wheel_builds_without_a_setuptools_deprecation_warning(tmp_path):
    """`pip wheel` builds the wheel in an isolated environment with the newest setuptools the
    build-system allows (~10 s); the backend's output must hold no deprecation warning, and the
    wheel's metadata must carry the license expression and the license file."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-cache-dir",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    if done.returncode != 0 and re.search(r"Could not find a version|No matching distribution|"
                                          r"Failed to establish|Network is unreachable", output):
        pytest.skip("pip could not fetch the build backend (no package index here)")
    assert done.returncode == 0, output[-3000:]
    assert "DeprecationWarning" not in output, output[output.find("DeprecationWarning") - 500:][:1500]
    wheel = next(tmp_path.glob("h3bridge-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in metadata.splitlines()
    assert "License-File: LICENSE" in metadata.splitlines()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
