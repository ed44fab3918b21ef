"""Benchmark: header verification of a full-size model layout, and parallel shard hashing.

    python bench/bench_verify.py [--files 4] [--mib 256] [--repeat 5] [--workdir DIR]

1. Writes the realistic fixture (released shapes, sparse shards: ~288 GB nominal for FL2VA +
   Ref2VA, no disk used) and times `inspect_model` (layout + every header) and `verify_model`
   without checksums.
2. Writes FILES x MIB real random files, reads them once so both contenders hash from the page
   cache, then times h3bridge's thread-pool `hash_files` against a single-threaded hashlib loop
   over the same bytes, and prints the ratio.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from h3bridge.model.inventory import inspect_model  # noqa: E402
from h3bridge.sim.fixture import write_fixture_model  # noqa: E402
from h3bridge.model.verify import HASH_CHUNK, hash_files, verify_model  # noqa: E402


def timed(function, repeat: int) -> list[float]:
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - started)
    return seconds


def single_threaded(paths: list[Path]) -> dict[Path, str]:
    digests = {}
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                digest.update(chunk)
        digests[path] = digest.hexdigest()
    return digests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.workdir) as scratch:
        root = Path(scratch)
        os.environ["H3BRIDGE_CACHE_DIR"] = str(root / "cache")
        print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}")

        model = write_fixture_model(root / "MiniMax-H3", realistic=True)
        shards = list(model.rglob("*.safetensors"))
        nominal = sum(p.stat().st_size for p in shards)
        on_disk = sum(p.stat().st_blocks * 512 for p in model.rglob("*") if p.is_file())
        inventory = inspect_model(model)
        assert not inventory.problems, inventory.table()
        tensors = sum(c.tensors for p in inventory.partitions.values() for c in p.components.values())
        inspect_times = timed(lambda: inspect_model(model), args.repeat)
        verify_times = timed(lambda: verify_model(model), args.repeat)
        print(f"header check: {len(shards)} shards, {tensors} tensors, {nominal / 1e9:.1f} GB nominal "
              f"({on_disk / 2**20:.1f} MiB on disk)")
        print(f"  inspect_model   median {statistics.median(inspect_times) * 1000:7.1f} ms "
              f"(min {min(inspect_times) * 1000:.1f} ms, {args.repeat} runs)")
        print(f"  verify (headers) median {statistics.median(verify_times) * 1000:6.1f} ms "
              f"(min {min(verify_times) * 1000:.1f} ms)")

        data = root / "hash"
        data.mkdir()
        paths = []
        for index in range(args.files):
            path = data / f"shard-{index}.bin"
            with open(path, "wb") as handle:
                for _ in range(args.mib):
                    handle.write(os.urandom(2**20))
            paths.append(path)
        total = args.files * args.mib * 2**20
        single_threaded(paths)          # warm the page cache for both contenders
        serial = timed(lambda: single_threaded(paths), max(2, args.repeat // 2))
        parallel = timed(lambda: hash_files(paths, progress=False), max(2, args.repeat // 2))
        assert hash_files(paths, progress=False) == single_threaded(paths)
        best_serial, best_parallel = min(serial), min(parallel)
        print(f"hashing {args.files} x {args.mib} MiB (page cache):")
        print(f"  single-threaded hashlib loop  {best_serial:6.2f} s  {total / best_serial / 2**30:5.2f} GiB/s")
        print(f"  h3bridge hash_files ({os.cpu_count()} threads) {best_parallel:6.2f} s  "
              f"{total / best_parallel / 2**30:5.2f} GiB/s")
        print(f"  speed-up {best_serial / best_parallel:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
