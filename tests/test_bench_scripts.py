"""Every bench script still starts after a change (the project's rule: each must still run). A
moved import (fuzz_parsers' int_flag went with argparse into cli/) broke one silently until a
bench run found it. Each script's --help runs its imports and its parser, not its measurement."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
# Modules the benches import, and helpers other scripts run with positional arguments only.
NOT_COMMANDS = {"bench_common.py": "the benches' shared helpers", "differential_cases.py": "differential.py's cases",
                "differential_capi.py": "one C-API case, run by differential.py as LIBRARY CASE RESULT"}


def _scripts() -> list[str]:
    return sorted(path.name for path in BENCH.glob("*.py") if path.name not in NOT_COMMANDS)


def test_the_walk_finds_the_benches() -> None:
    assert {"bench_takes.py", "bench_fleet.py", "fuzz_parsers.py", "bench_background.py"} <= set(_scripts())


@pytest.mark.parametrize("script", _scripts())
def test_every_bench_script_starts(script: str) -> None:
    ran = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True,
                         timeout=300, cwd=BENCH.parent)
    assert ran.returncode == 0 and "usage" in ran.stdout.lower(), (ran.stdout[-500:], ran.stderr[-1500:])


def test_the_helpers_import(tmp_path: Path) -> None:
    for name in NOT_COMMANDS:
        ran = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(BENCH)!r}); "
                              f"import {name[:-3]}"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert ran.returncode == 0, (name, ran.stderr[-1500:])
