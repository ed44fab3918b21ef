"""Fuzz the server's body parsers by the million (issue 29 item 1) and print the counts.

    python bench/fuzz_parsers.py --cases 1000000 [--seed 29] [--workers 2]

The cases are tests/parser_fuzz.py's (the suite runs a few thousand of them in
tests/test_parser_fuzz.py): bodies in vLLM-Omni's, SGLang's and h3bridge's dialects, as JSON and as
forms, with hostile numbers, text and nesting, through parse_json_body, pairs_from_json,
dialects.translate, request_from_wire and GenerationRequest.validate, plus two safeio.numbers reads
per case. Exit status 1 when anything but h3bridge's own error came out, with the first bodies that
raised it."""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from parser_fuzz import FuzzCounts, fuzz  # noqa: E402

from h3bridge.cli.flags import int_flag  # noqa: E402


def _run(cases: int, seed: int) -> FuzzCounts:
    with tempfile.TemporaryDirectory(prefix="h3-fuzz-") as folder:
        return fuzz(cases, seed, Path(folder))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int_flag(1, 100_000_000), default=1_000_000)
    parser.add_argument("--seed", type=int_flag(0, 2**32), default=29)
    parser.add_argument("--workers", type=int_flag(1, 64), default=2)
    parser.add_argument("--chunk", type=int_flag(1, 10_000_000), default=50_000, help="cases per seeded chunk")
    args = parser.parse_args(argv)
    started = time.monotonic()
    chunks = [(min(args.chunk, args.cases - start), args.seed * 1_000_003 + index)
              for index, start in enumerate(range(0, args.cases, args.chunk))]
    total = FuzzCounts()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for counts in pool.map(_run, *zip(*chunks)):
            total.cases += counts.cases
            total.accepted += counts.accepted
            total.refused += counts.refused
            total.numbers += counts.numbers
            total.foreign.update(counts.foreign)
            total.examples += counts.examples[:5 - len(total.examples)]
            print(f"  {total.cases:,} cases, {total.foreign_total} not ours, {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)
    print(total.summary())
    print(f"seed {args.seed}, {len(chunks)} chunks of up to {args.chunk:,}, {args.workers} workers, "
          f"{time.monotonic() - started:.0f} s")
    for example in total.examples:
        print("\n" + example)
    return 1 if total.foreign_total else 0


if __name__ == "__main__":
    sys.exit(main())
