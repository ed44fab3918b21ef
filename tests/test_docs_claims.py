"""Figures the docs state about what a command does, checked against the command (issue 30: the
fixture's size in docs/model-and-memory.md had drifted from 2.2 MiB to 3.4 MiB unnoticed)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL_AND_MEMORY = REPO / "docs" / "model-and-memory.md"
MIB = 1024 * 1024


def test_the_fixture_size_the_docs_state_is_what_h3_sim_model_writes(tmp_path: Path) -> None:
    """The page quotes the line `h3-sim-model my-model` prints; run in a fresh folder, the
    command prints exactly that line, and its size is the files' (what `du --apparent-size`
    counts for them), to the 0.1 MiB the line shows."""
    page = MODEL_AND_MEMORY.read_text(encoding="utf-8")
    quoted = re.search(r"`(wrote my-model \((\d+(?:\.\d+)?) MiB, synthetic weights for h3-sim\))`", page)
    assert quoted, "docs/model-and-memory.md quotes the line `h3-sim-model my-model` prints"
    assert re.search(r"^h3-sim-model my-model\b", page, flags=re.M), "the page's block runs `h3-sim-model my-model`"
    made = subprocess.run([str(Path(sys.executable).parent / "h3-sim-model"), "my-model"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[0] == quoted[1]
    files = sum(path.stat().st_size for path in (tmp_path / "my-model").rglob("*") if path.is_file())
    assert abs(files / MIB - float(quoted[2])) <= 0.05, f"the files hold {files / MIB:.2f} MiB"
