"""The server's body parsers, fuzzed (issue 29 item 1): a few thousand seeded bodies in both peer
dialects and h3bridge's own, as JSON and as forms (tests/parser_fuzz.py builds them), and not one
raises anything but h3bridge's own error. On the tree before safeio.numbers, seed 1 found 11
OverflowErrors (a 400-digit flow_shift) and a RecursionError (a nested extra_params form field).
bench/fuzz_parsers.py runs the same cases by the million; H3BRIDGE_FUZZ_CASES runs more here."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from parser_fuzz import fuzz

CASES = int(os.environ.get("H3BRIDGE_FUZZ_CASES", "3000"))
# Fuzzed bodies use the old spellings too (use_slower), which warn; the warning is tested elsewhere.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize("seed", [1, 29])
def test_fuzzed_bodies_raise_only_our_own_errors(tmp_path: Path, seed: int) -> None:
    counts = fuzz(CASES, seed, tmp_path)
    assert counts.cases == CASES and counts.refused > 0 and counts.accepted > 0, counts.summary()
    assert counts.foreign_total == 0, counts.summary() + "\n\n" + "\n\n".join(counts.examples)
    assert not (tmp_path / "inputs").exists(), "a case's stored data URLs were left behind"
