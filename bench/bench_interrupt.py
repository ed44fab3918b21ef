"""Interrupt latency per engine, idle and with both CPUs busy, in one run.

    python bench/bench_interrupt.py [--repeat 3] [--time-scale 0.05] [--busy 2]

An interrupt here is what ComfyUI's is: a flag the engine polls through `CancelToken(check=...)`
(ComfyUI's `comfy.model_management.processing_interrupted`), set from another thread while the
job denoises. Measured from setting the flag until `generate` raised GenerationCancelled: what
the user waits for (the node stops, the queue moves on); by then every temporary file is gone and
every process the job stopped has exited (the engines reap their process groups before they raise).

Engines: one-shot (`h3-sim` as the `h3` program, a process per job, stopped by signals) and
library (the libh3 double in the warm worker). Two library cases: the cancel lands while libh3
reaches a check soon (h3_generate returns "generation cancelled" within the grace and the worker
stays warm) and inside a long phase (upstream looks at the answer only between phases; the double
falls silent mid-denoise to stand for it, so the worker is stopped after the grace). "busy" runs
`--busy` CPU-bound processes (`yes >/dev/null` equivalents: Python loops, no shell) for the whole
measurement.

Absolute seconds depend on the machine; the docs promise an interrupt within a second.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_common import sim_path
from h3bridge import CancelToken, GenerationCancelled, GenerationRequest, LibraryEngine, OneShotEngine
from h3bridge.engines.lock import LOCK_PATH_ENV
from h3bridge.sim.fixture import write_fixture_model
from h3bridge.sim.library import build_double

PROMPT = "a red fox runs through fresh snow at dawn"
REQUEST = GenerationRequest(PROMPT, width=96, height=64, frames=22, steps=8)
BUSY_LOOP = "while True: pass"


def measure(engine, *, cancel_at_step: int, request: GenerationRequest = REQUEST, **options) -> tuple[float, bool]:
    """(seconds from the interrupt flag until generate raised, whether the warm worker was kept)."""
    flag = threading.Event()
    marks: dict[str, float] = {}
    pids: list[int] = []

    def on_progress(event) -> None:
        pid = getattr(engine, "pid", None)
        if pid:
            pids.append(pid)
        if event.phase == "denoise" and event.done >= cancel_at_step and "at" not in marks:
            # Set from another thread, as ComfyUI's interrupt button is.
            def interrupt() -> None:
                marks["at"] = time.perf_counter()
                flag.set()
            threading.Thread(target=interrupt).start()

    try:
        engine.generate(request, None, want_audio=False, on_progress=on_progress,
                        cancel=CancelToken(check=flag.is_set), **options)
        raise SystemExit("the job finished before the interrupt reached it: lower --time-scale's speed")
    except GenerationCancelled:
        ended = time.perf_counter()
    worker = getattr(engine, "pid", None)
    kept = worker is not None and bool(pids) and worker == pids[-1]
    return ended - marks["at"], kept


def run_cases(library: Path, model: Path, repeat: int) -> list[tuple[str, float, float, str]]:
    rows = []
    steps = REQUEST.steps
    one_shot = OneShotEngine(sim_path(), model)
    ended = [measure(one_shot, cancel_at_step=steps // 2)[0] for _ in range(repeat)]
    rows.append(("one-shot, mid denoise", max(ended), sum(ended) / len(ended), "process stopped"))
    # The double stands for a long phase that never looks at the callback's answer (a DiT load,
    # denoising without previews, the tiled VAE decode) by falling silent after step 4.
    silent = {"H3_SIM_HANG_PHASE": f"denoise:{steps // 2}"}
    for label, step, env in (("library, libh3 checks soon", steps // 2, {}),
                             ("library, inside a long phase", steps // 2, silent)):
        with LibraryEngine(library, model, env=dict(os.environ, **env)) as engine:
            if not env:
                engine.generate(REQUEST.with_changes(seed=99), None, want_audio=False)     # warm first
            results = [measure(engine, cancel_at_step=step) for _ in range(repeat)]
            if not env:
                engine.generate(REQUEST.with_changes(seed=98), None, want_audio=False)
            kept = sum(1 for _, k in results if k)
            fate = f"worker kept {kept}/{repeat}, {engine.starts} worker start(s) for {engine.jobs + repeat} jobs"
        ended = [r[0] for r in results]
        rows.append((label, max(ended), sum(ended) / len(ended), fate))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="interrupts per case (default 3)")
    parser.add_argument("--time-scale", type=float, default=0.05,
                        help="H3_SIM_TIME_SCALE (default 0.05: a denoise step lasts ~0.3 s)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2,
                        help="CPU-bound processes for the busy runs (default: one per CPU)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-interrupt-"))
    os.environ["H3_SIM_TIME_SCALE"] = str(args.time_scale)
    os.environ["H3_CPU_SAMPLER"] = "1"        # phase "denoise" (not "denoise enqueue") on every device
    os.environ[LOCK_PATH_ENV] = str(workdir / "engine.lock")
    try:
        library = build_double()
        model = write_fixture_model(workdir / "MiniMax-H3")
        table: list[tuple[str, str, float, float, str]] = []
        for load in ("idle", "busy"):
            hogs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy if load == "busy" else 0)]
            try:
                for label, worst, mean, fate in run_cases(library, model, args.repeat):
                    table.append((load, label, worst, mean, fate))
                    print(f"{load:<5} {label:<28} job ended: worst {worst:.3f} s, mean {mean:.3f} s  ({fate})",
                          flush=True)
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
        worst = max(row[2] for row in table)
        print(f"\nworst interrupt over every case: {worst:.3f} s ({'within' if worst <= 1.0 else 'OVER'} 1 s); "
              f"H3_SIM_TIME_SCALE={args.time_scale}, {args.repeat} interrupts per case, busy = {args.busy} "
              f"CPU-bound processes on {os.cpu_count()} CPUs")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
