"""Benchmark: `h3bridge lora fold` against a plain copy of the same shards, and its peak memory.

    python bench/bench_lora.py [--hidden 768] [--rank 32] [--chunk-elements N] [--workdir DIR]

1. Writes a model whose DiT has the released tensor names and layer count at width HIDDEN (real
   bytes; HIDDEN=768 gives ~0.6 GB of transformer shards) and a PEFT LoRA of rank RANK over every
   block's qkv_proj, out_proj, fc1 and fc2 (the tensors the Turbo LoRA targets).
2. Times a plain copy of the transformer shards the fold rewrites (read + write, the page cache
   warmed first) and the fold itself (in a child process), and prints fold / copy as a ratio with
   both throughputs.
3. Prints the fold's peak RSS (the child's high-water mark, VmHWM, less its own after importing
   h3bridge and numpy) against the largest targeted tensor. The fold works a block of rows at a
   time (CHUNK_ELEMENTS float64 values), so on the released model (fc1: 28672 x 5376 BF16, 294
   MiB) the extra memory stays a few working blocks, far below the tensor; on this small model the
   block holds whole tensors, so the ratio is larger. --chunk-elements shows the bound moving.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from h3bridge.lora import plan_fold  # noqa: E402
from h3bridge.model.inventory import format_bytes  # noqa: E402
from h3bridge.sim import fixture  # noqa: E402
from lora_helpers import write_lora  # noqa: E402

_CHILD = """
import resource, sys, time
from h3bridge.lora import fold as fold_module

def peak_kib():
    # VmHWM starts afresh at exec; ru_maxrss keeps the parent's peak across fork + exec on Linux
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)

if sys.argv[4] != "0":
    fold_module.CHUNK_ELEMENTS = int(sys.argv[4])
baseline = peak_kib()
started = time.perf_counter()
fold_module.fold_model(sys.argv[1], [sys.argv[2]], sys.argv[3], progress=False)
print(time.perf_counter() - started, baseline, peak_kib())
"""


def write_model(root: Path, hidden: int) -> Path:
    dims = dataclasses.replace(fixture.TINY, dit_hidden=hidden, dit_heads=hidden // 128, dit_head_dim=128,
                               dit_ffn=2 * hidden, text_dim=hidden)
    fixture.write_partition(root, "FL2VA", dims, sparse=False)
    return root


def write_turbo_like_lora(path: Path, model: Path, rank: int) -> Path:
    from h3bridge.model.safetensors import read_header
    rng = np.random.default_rng(0)
    tensors = {}
    for shard in sorted((model / "FL2VA/transformer").glob("*.safetensors")):
        for tensor in read_header(shard).tensors:
            if tensor.name.startswith("blocks.") and tensor.name.endswith(
                    ("qkv_proj.weight", "out_proj.weight", "fc1.weight", "fc2.weight")):
                module = tensor.name.removesuffix(".weight")
                out, inner = tensor.shape
                tensors[module + ".lora_A.weight"] = (rng.standard_normal((rank, inner)) * 0.01).astype(np.float32)
                tensors[module + ".lora_B.weight"] = (rng.standard_normal((out, rank)) * 0.01).astype(np.float32)
    return write_lora(path, tensors, dtype="BF16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--chunk-elements", type=int, default=0, help="override fold.CHUNK_ELEMENTS (0: default)")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-lora-", dir=args.workdir))
    try:
        model = write_model(work / "MiniMax-H3", args.hidden)
        lora = write_turbo_like_lora(work / "turbo.safetensors", model, args.rank)
        plan = plan_fold(model, [lora])
        shards = [shard.source for shard in plan.shards.values()]
        shard_bytes = sum(p.stat().st_size for p in shards)
        for path in shards:                               # warm the page cache for both contenders
            path.read_bytes()
        copy_dir = work / "copy"
        copy_dir.mkdir()
        started = time.perf_counter()
        for path in shards:
            with open(path, "rb") as source, open(copy_dir / path.name, "wb") as target:
                shutil.copyfileobj(source, target, 16 << 20)      # a plain read + write copy
                target.flush()
                os.fsync(target.fileno())
        copy_seconds = time.perf_counter() - started
        shutil.rmtree(copy_dir)
        done = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(lora), str(work / "folded"),
                               str(args.chunk_elements)], capture_output=True, text=True, check=True)
        fold_seconds, idle_kib, peak_kib = (float(v) for v in done.stdout.split())
        extra = (peak_kib - idle_kib) * 1024
        largest = plan.largest_tensor_bytes
        print(json.dumps({
            "transformer_shards_rewritten": len(shards), "shard_bytes": shard_bytes,
            "tensors_folded": plan.tensor_count, "targeted_bytes": plan.targeted_bytes, "rank": args.rank,
            "copy_seconds": round(copy_seconds, 3), "fold_seconds": round(fold_seconds, 3),
            "fold_over_copy": round(fold_seconds / copy_seconds, 2),
            "copy_MiB_per_s": round(shard_bytes / copy_seconds / 2**20, 1),
            "fold_MiB_per_s": round(shard_bytes / fold_seconds / 2**20, 1),
            "peak_rss_above_idle": int(extra), "idle_rss": int(idle_kib * 1024), "largest_targeted_tensor": largest,
            "peak_over_largest_tensor": round(extra / largest, 2),
        }, indent=1))
        print(f"fold {fold_seconds:.2f} s vs plain copy {copy_seconds:.2f} s of the same {len(shards)} shards "
              f"({format_bytes(shard_bytes)}): ratio {fold_seconds / copy_seconds:.2f}; peak RSS "
              f"{format_bytes(int(extra))} above an idle interpreter = {extra / largest:.2f} x the largest targeted "
              f"tensor ({format_bytes(largest)})", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
