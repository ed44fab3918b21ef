"""The conformance walk's counts (issue 29 item 3): entry points walked, hostile cases, untyped
errors, hangs, writes and other wrong answers, as tests/test_conformance.py finds them.

    python bench/conformance_counts.py

Runs the test file itself (one walk, one set of hostile cases: nothing to keep in step) and prints
the counts line its last test writes.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    env = dict(os.environ)
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-q", "-s", "-p", "no:cacheprovider",
                           "--tb=no", "-rN", str(ROOT / "tests" / "test_conformance.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    counts = [line for line in lines if line.startswith("conformance:") or line.startswith("  (failing")]
    summary = [line for line in lines if " passed" in line or " failed" in line]
    print("\n".join(counts + summary[-1:]) or done.stdout[-2000:])
    return 0 if counts else 1


if __name__ == "__main__":
    sys.exit(main())
