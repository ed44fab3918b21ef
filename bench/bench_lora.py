"""Benchmark: `h3bridge lora fold` against a plain copy of the bytes it rewrites, its peak memory,
and how much of a LoRA survives nearest vs stochastic bf16 rounding.

    python bench/bench_lora.py [--hidden 768] [--rank 32] [--chunk-elements N] [--workdir DIR]
    python bench/bench_lora.py --kept-only      # only the rounding table (no model written)

1. Writes a model whose DiT has the released tensor names and layer count at width HIDDEN (real
   bytes; HIDDEN=768 gives ~0.6 GB of transformer shards) and a PEFT LoRA of rank RANK over every
   block's qkv_proj, out_proj, fc1 and fc2 (the tensors the Turbo LoRA targets).
2. Times a plain copy of the targeted tensors' bytes (read from the shards + written + fsynced,
   the page cache warmed first) and the fold itself (in a child process: plan, fold, fsync,
   hashes), once with each code that can fold here: the compiled kernels (h3bridge/lora/compiled.py,
   with numba installed: `pip install 'h3bridge[fast-fold]'`) and the numpy passes
   (H3BRIDGE_FOLD_KERNEL=numpy). It prints each fold's throughput of those bytes over the copy's
   (issue 21's target: at least 0.5) and its CPU time: the copy waits on the disk, the fold on the
   CPU, so on a machine busy with other work the ratio measures the load as much as the fold.
3. Prints the fold's peak RSS (the child's high-water mark, VmHWM, less its own after importing
   h3bridge and numpy) against the largest targeted tensor. The fold works a block of rows at a
   time on each of its threads (CHUNK_ELEMENTS elements with numpy, about 33 bytes each;
   COMPILED_CHUNK_ELEMENTS with the kernels, 4 bytes each plus one float64 product of
   COMPILED_ROWS_ELEMENTS), so on the released model (fc1: 28672 x 5376 BF16, 294 MiB) the extra
   memory is the LoRA's matrices and those blocks, far below the tensor; on this small model
   (4.5 MiB tensors) the blocks, numba's compiler and the interpreter's own growth weigh more than
   a tensor. --chunk-elements and --threads show the bound moving.

   The fold's CPU per element on this 2-core machine, measured under load (issue 21's closing
   note): about 15 ns with the numpy passes, about 11 with the kernels; of the latter the float64
   matrix product (BLAS) ~3, the kernels ~2, the parity probe ~0.5, reading and writing ~1.5, the
   SHA-256 of the rewritten shards ~1.3. Each shard's fsync runs beside the next shard's fold.
4. The rounding table: for rho = ||dW|| / ||W|| from 1e-4 to 1e-2 on a 512 x 512 bf16 tensor
   (262144 elements) and a rank-32 update, what round-to-nearest and the fold's stochastic
   rounding keep (kept = <D, dW> / ||dW||^2, D the stored change), their noise ||D - dW|| / ||dW||
   and the share of elements left unchanged.
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

from h3bridge.lora import fold as fold_module  # noqa: E402
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
    fold_module.CHUNK_ELEMENTS = fold_module.COMPILED_CHUNK_ELEMENTS = int(sys.argv[4])
if sys.argv[5] != "0":
    fold_module.FOLD_THREADS = int(sys.argv[5])
baseline = peak_kib()
# the compiled kernels' one-time cost in a process (numba's import, its cached machine code
# loaded), timed apart: a fold of the released model takes minutes, this one seconds
loading = time.perf_counter()
from h3bridge.lora import compiled
if compiled.available():
    import numpy as np
    compiled.stochastic_bf16(np.zeros(2, np.uint16), np.zeros(2), 1.0, 0, 1, 3, np.zeros(2, np.uint16), np.zeros(6))
loaded = time.perf_counter() - loading
started, cpu = time.perf_counter(), time.process_time()
fold_module.fold_model(sys.argv[1], [sys.argv[2]], sys.argv[3], progress=False)
print(time.perf_counter() - started, baseline, peak_kib(), time.process_time() - cpu, loaded)
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


def kept_table(rows: int = 512, columns: int = 512, rank: int = 32, folds: int = 20) -> list[dict[str, float]]:
    """Nearest vs stochastic rounding of W + dW at realistic magnitudes (the fold's own rounding).
    Stochastic: one fold's values (a 128-bit seed, as a fold's tensor gets), and kept's mean and
    standard deviation over `folds` seeds (unbiased: the mean within a few sd / sqrt(folds) of 1)."""
    import hashlib
    from h3bridge.lora.bf16 import bf16_to_float64, dither16, float64_to_bf16, float64_to_bf16_stochastic
    rng = np.random.default_rng(21)
    weight = bf16_to_float64(float64_to_bf16(rng.standard_normal((rows, columns)) * 0.02))
    direction = rng.standard_normal((rows, rank)) @ rng.standard_normal((rank, columns))
    seeds = [int(hashlib.sha256(f"bench_lora kept {n}".encode()).hexdigest()[:32], 16) for n in range(folds)]
    table = []
    for rho in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2):
        update = direction * (rho * np.linalg.norm(weight) / np.linalg.norm(direction))
        exact = weight + update
        row: dict[str, float] = {"rho": rho, "elements": weight.size}
        kept = []
        for number, seed in enumerate([None, *seeds]):
            name = "nearest" if seed is None else "stochastic"
            bits = (float64_to_bf16(exact) if seed is None
                    else float64_to_bf16_stochastic(exact, dither16(seed, 0, exact.size)))
            stored = bf16_to_float64(bits) - weight
            if number > 1:
                kept.append(float(np.vdot(stored, update) / np.vdot(update, update)))
                continue
            row[f"{name}_kept"] = float(np.vdot(stored, update) / np.vdot(update, update))
            row[f"{name}_noise"] = float(np.linalg.norm(stored - update) / np.linalg.norm(update))
            row[f"{name}_unchanged"] = float(np.mean(stored == 0))
            if seed is not None:
                kept.append(row["stochastic_kept"])
        row["stochastic_kept_mean"] = float(np.mean(kept))
        row["stochastic_kept_sd"] = float(np.std(kept, ddof=1))
        table.append(row)
    return table


def print_kept_table(table: list[dict[str, float]]) -> None:
    print(f"{'rho':>8} {'elements':>9} | {'nearest kept':>12} {'noise':>6} {'unchanged':>9} | "
          f"{'stochastic kept':>15} {'noise':>6} {'unchanged':>9} | {'kept over 20 folds':>18}", file=sys.stderr)
    for row in table:
        print(f"{row['rho']:>8.0e} {row['elements']:>9} | {row['nearest_kept']:>12.3f} {row['nearest_noise']:>6.2f} "
              f"{row['nearest_unchanged']:>8.1%} | {row['stochastic_kept']:>15.3f} {row['stochastic_noise']:>6.2f} "
              f"{row['stochastic_unchanged']:>8.1%} | {row['stochastic_kept_mean']:>9.4f} +- "
              f"{row['stochastic_kept_sd']:.4f}", file=sys.stderr)


def copy_targeted(plan, folder: Path) -> float:
    """Seconds for a plain read + write + fsync of exactly the targeted tensors' bytes."""
    started = time.perf_counter()
    for number, shard in enumerate(plan.shards.values()):
        with open(shard.source, "rb") as source, open(folder / f"{number}.bin", "wb") as target:
            for job in shard.tensors.values():
                source.seek(shard.data_start + job.tensor.begin)
                target.write(source.read(job.tensor.nbytes))
            target.flush()
            os.fsync(target.fileno())
    return time.perf_counter() - started


def fold_once(model: Path, lora: Path, output: Path, args: argparse.Namespace,
              kernel: str) -> tuple[float, float, float, float, float]:
    """(seconds, idle KiB, peak KiB, CPU seconds, the kernels' load seconds) of one fold in a child
    process."""
    env = dict(os.environ)
    if kernel == "numpy":
        env["H3BRIDGE_FOLD_KERNEL"] = "numpy"
    else:
        env.pop("H3BRIDGE_FOLD_KERNEL", None)
        # numba compiles its kernels once and caches them: a first, untimed fold warms that cache
        subprocess.run([sys.executable, "-c", _CHILD, str(model), str(lora), str(output), str(args.chunk_elements),
                        str(args.threads)], capture_output=True, text=True, check=True, env=env)
        shutil.rmtree(output)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(model), str(lora), str(output), str(args.chunk_elements),
                           str(args.threads)], capture_output=True, text=True, check=True, env=env)
    shutil.rmtree(output)
    seconds, idle_kib, peak_kib, cpu, loaded = (float(v) for v in done.stdout.split())
    return seconds, idle_kib, peak_kib, cpu, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kept-only", action="store_true", help="only the nearest vs stochastic table")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--chunk-elements", type=int, default=0, help="override fold.CHUNK_ELEMENTS (0: default)")
    parser.add_argument("--threads", type=int, default=0, help="override fold.FOLD_THREADS (0: default)")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    table = kept_table()
    print_kept_table(table)
    if args.kept_only:
        print(json.dumps({"kept": table}, indent=1))
        return
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
        copy_seconds = copy_targeted(plan, copy_dir)
        shutil.rmtree(copy_dir)
        from h3bridge.lora import compiled
        kernels = (["compiled"] if compiled.available() else []) + ["numpy"]
        folds = {kernel: fold_once(model, lora, work / f"folded-{kernel}", args, kernel) for kernel in kernels}
        largest = plan.largest_tensor_bytes
        report = {
            "transformer_shards_rewritten": len(shards), "shard_bytes": shard_bytes,
            "tensors_folded": plan.tensor_count, "targeted_bytes": plan.targeted_bytes, "rank": args.rank,
            "threads": args.threads or fold_module.FOLD_THREADS, "compiled_kernels": compiled.name(),
            "copy_seconds": round(copy_seconds, 3), "copy_MiB_per_s": round(plan.targeted_bytes / copy_seconds / 2**20, 1),
            "largest_targeted_tensor": largest, "kept": table,
        }
        for kernel, (fold_seconds, idle_kib, peak_kib, fold_cpu, loaded) in folds.items():
            extra = (peak_kib - idle_kib) * 1024
            report[kernel] = {
                "fold_seconds": round(fold_seconds, 3), "kernels_load_seconds": round(loaded, 3),
                "fold_with_load_throughput_over_copy": round(copy_seconds / (fold_seconds + loaded), 3),
                "fold_MiB_per_s": round(plan.targeted_bytes / fold_seconds / 2**20, 1),
                "fold_throughput_over_copy": round(copy_seconds / fold_seconds, 3),
                # the fold is CPU-bound and the copy disk-bound: on a loaded machine the fold gets a
                # fraction of a core (cpu / wall) and the ratio above falls with the load, not the code
                "fold_cpu_seconds": round(fold_cpu, 3), "fold_cpu_over_wall": round(fold_cpu / fold_seconds, 3),
                "peak_rss_above_idle": int(extra), "idle_rss": int(idle_kib * 1024),
                "peak_over_largest_tensor": round(extra / largest, 2)}
        print(json.dumps(report, indent=1))
        for kernel, (fold_seconds, idle_kib, peak_kib, fold_cpu, loaded) in folds.items():
            extra = (peak_kib - idle_kib) * 1024
            once = f" (+ {loaded:.2f} s once per process to load numba and its kernels)" if kernel == "compiled" else ""
            print(f"{kernel:>8}: fold {fold_seconds:.2f} s{once} ({args.threads or fold_module.FOLD_THREADS} threads) vs plain "
                  f"copy {copy_seconds:.2f} s of the {plan.tensor_count} targeted tensors "
                  f"({format_bytes(plan.targeted_bytes)}): fold throughput = {copy_seconds / fold_seconds:.2f} x the "
                  f"copy's (target >= 0.5; the fold used {fold_cpu:.2f} s of CPU, {fold_cpu / fold_seconds:.0%} of its "
                  f"wall time); peak RSS {format_bytes(int(extra))} above an idle interpreter = "
                  f"{extra / largest:.2f} x the largest targeted tensor ({format_bytes(largest)})", file=sys.stderr)
        if len(folds) == 2:
            print(f"compiled kernels over numpy passes, measured in this run: {folds['numpy'][0] / folds['compiled'][0]:.2f} x "
                  f"the throughput, {folds['compiled'][3] / folds['numpy'][3]:.2f} x the CPU", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
