"""The library engine (libh3 in a warm worker) against the CLI engines, on the libh3 double.

    python bench/bench_library.py [--jobs 5] [--time-scale 0.02] [--width 864 --height 480 --frames 56]

In one run, on the same N-job series (one prompt, seeds 1..N, upstream's default canvas), with
h3-sim's time model (M1-Ultra seconds x H3_SIM_TIME_SCALE) behind both the `h3-sim` program and
the C double of libh3 (which runs the very same engine):

1. wall time of one-shot (`OneShotEngine`, a fresh process per job), the warm CLI session
   (`SessionEngine`) and the warm library (`LibraryEngine`); frames read back on every side
   (one-shot: --frames-dir PPMs, session: decoded from the MP4, library: the mapped file);
2. preview overhead: the library series again with `on_preview` (upstream's preview VAE load
   and one preview decode per step, as the cost model charges them);
3. cancel: seconds from `cancel()` until the worker's process group is gone, in a phase that
   reports (the callback returns 1) and in a silent one (the group is killed after the grace);
4. frame hand-off: the host's peak memory growth while the library hands back a clip's frames,
   against the array's size (measured in a fresh child process: ru_maxrss after the job less the
   RSS before it, the frames touched once so every page is counted).

Ratios are measured in this one run; absolute seconds depend on the machine and the time scale.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import sim_path
from h3bridge import GenerationRequest, LibraryEngine, OneShotEngine, SessionEngine
from h3bridge.engines.lock import LOCK_PATH_ENV
from h3bridge.sim.fixture import write_fixture_model
from h3bridge.sim.library import build_double

PROMPT = "A red fox runs through fresh snow at dawn, low sun, cinematic"


def series(engine, jobs: list[GenerationRequest], workdir: Path, label: str, **options) -> float:
    started = time.perf_counter()
    for index, request in enumerate(jobs):
        job_started = time.perf_counter()
        engine.generate(request, workdir / f"{label}-{index}.mp4", want_frames=True, want_audio=True, **options)
        print(f"  {label:<17} job {index + 1}: {time.perf_counter() - job_started:6.2f} s", flush=True)
    return time.perf_counter() - started


def handoff_child(library: str, model: str, width: int, height: int, frames: int) -> None:
    """Runs in a fresh process: prints {"array": bytes, "growth": bytes} as JSON. The peak is
    sampled by a thread every millisecond during the job and after every page of the frames was
    read once (ru_maxrss would also count peaks from before the job: imports, the first job)."""
    import threading

    import numpy as np
    import psutil
    request = GenerationRequest(PROMPT, width=width, height=height, frames=frames, steps=2)
    process = psutil.Process()
    with LibraryEngine(library, model) as engine:
        engine.generate(request, None, want_frames=False, want_audio=False)     # worker up, imports done
        before = process.memory_info().rss
        peak = [before]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.001):
                peak[0] = max(peak[0], process.memory_info().rss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result = engine.generate(request, None, want_frames=True, want_audio=False)
        checksum = int(np.asarray(result.frames).sum(dtype=np.uint64))           # touch every page
        peak[0] = max(peak[0], process.memory_info().rss)
        done.set()
        sampler.join()
        print(json.dumps({"array": result.frames.nbytes, "growth": peak[0] - before, "checksum": checksum}))


def handoff(library: Path, model: Path, args: argparse.Namespace) -> str:
    child = subprocess.run([sys.executable, __file__, "--handoff-child", str(library), str(model),
                            "--width", str(args.width), "--height", str(args.height), "--frames", str(args.frames)],
                           capture_output=True, text=True, check=True, env=dict(os.environ, H3_SIM_TIME_SCALE="0"))
    measured = json.loads(child.stdout.strip().splitlines()[-1])
    return (f"{measured['array'] / 2**20:.1f} MiB of frames, host peak grew {measured['growth'] / 2**20:.1f} MiB "
            f"= {measured['growth'] / measured['array']:.2f}x the array")


def cancel_latency(library: Path, model: Path, workdir: Path) -> dict[str, float]:
    """Seconds from cancel() to the worker's group being gone, per way of stopping."""
    from h3bridge import CancelToken, GenerationCancelled
    from h3bridge.engines.process import group_alive
    request = GenerationRequest(PROMPT, width=96, height=64, frames=22, steps=4)
    latencies: dict[str, float] = {}
    notice = workdir / "silent"
    for label, env in (("callback returns 1 (denoise)", {}),
                       ("silent phase, group killed", {"H3_SIM_HANG_PHASE": "video VAE load:36",
                                                       "H3_SIM_HANG_NOTICE": str(notice)})):
        engine = LibraryEngine(library, model, env=dict(os.environ, **env))
        if not env:      # warm first: the cancel then hits a running job, not the start
            engine.generate(request.with_changes(seed=99), None, want_audio=False)
        cancel = CancelToken()
        marks: dict[str, float] = {}
        pids: list[int] = []

        def on_progress(event, env=env) -> None:
            pids.append(engine.pid or 0)
            if not env and event.phase == "denoise" and "at" not in marks:
                marks["at"] = time.perf_counter()
                cancel.cancel()

        if env:
            def silent() -> bool:
                if notice.exists() and "at" not in marks:
                    marks["at"] = time.perf_counter()
                return notice.exists()
            cancel = CancelToken(check=silent)
        try:
            engine.generate(request, None, want_audio=False, on_progress=on_progress, cancel=cancel)
        except GenerationCancelled:
            pass
        while group_alive(pids[-1]):
            time.sleep(0.001)
        latencies[label] = time.perf_counter() - marks["at"]
        engine.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--time-scale", type=float, default=0.02,
                        help="H3_SIM_TIME_SCALE: sleep seconds per simulated M1-Ultra second (default 0.02)")
    parser.add_argument("--width", type=int, default=864)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--frames", type=int, default=56)
    parser.add_argument("--cancel-only", action="store_true", help="only measure the cancel latencies")
    parser.add_argument("--handoff-only", action="store_true", help="only the cancel latencies and the frame hand-off")
    parser.add_argument("--handoff-child", nargs=2, metavar=("LIBRARY", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.handoff_child:
        handoff_child(*args.handoff_child, args.width, args.height, args.frames)
        return

    workdir = Path(tempfile.mkdtemp(prefix="bench-library-"))
    os.environ["H3_SIM_TIME_SCALE"] = str(args.time_scale)
    os.environ["HOME"] = str(workdir / "home")            # interactive h3 writes ~/.h3_history
    (workdir / "home").mkdir()
    os.environ[LOCK_PATH_ENV] = str(workdir / "engine.lock")
    try:
        library = build_double()
        model = write_fixture_model(workdir / "MiniMax-H3")
        cancels = cancel_latency(library, model, workdir)
        for label, seconds in cancels.items():
            print(f"cancel, {label:<29}: group gone {seconds:.3f} s after cancel()", flush=True)
        if args.cancel_only:
            return
        if args.handoff_only:
            print(f"frame hand-off: {handoff(library, model, args)}")
            return
        jobs = [GenerationRequest(PROMPT, seed=seed, width=args.width, height=args.height, frames=args.frames)
                for seed in range(1, args.jobs + 1)]
        print(f"{args.jobs} jobs, {args.width}x{args.height}, {args.frames} frames, 20 steps, "
              f"H3_SIM_TIME_SCALE={args.time_scale}, same prompt, seeds 1..N, frames read back")
        one_shot = series(OneShotEngine(sim_path(), model), jobs, workdir, "one-shot")
        with SessionEngine(sim_path(), model) as session:
            warm_cli = series(session, jobs, workdir, "warm CLI session")
        with LibraryEngine(library, model) as engine:
            warm_library = series(engine, jobs, workdir, "warm library")
            assert engine.starts == 1
        previews: list[object] = []
        with LibraryEngine(library, model) as engine:
            with_previews = series(engine, jobs, workdir, "library+previews", on_preview=previews.append)
        handoff_line = handoff(library, model, args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    n = args.jobs
    print(f"\none-shot          : {one_shot:7.2f} s ({one_shot / n:.2f} s/job)")
    print(f"warm CLI session  : {warm_cli:7.2f} s ({warm_cli / n:.2f} s/job)")
    print(f"warm library      : {warm_library:7.2f} s ({warm_library / n:.2f} s/job)")
    print(f"ratios            : library / one-shot = {warm_library / one_shot:.3f}, "
          f"library / session = {warm_library / warm_cli:.3f}, session / one-shot = {warm_cli / one_shot:.3f}")
    print(f"previews          : {with_previews:7.2f} s with {len(previews)} previews "
          f"({len(previews) / n:.0f} per job); overhead x{with_previews / warm_library:.3f}")
    print(f"frame hand-off    : {handoff_line}")


if __name__ == "__main__":
    main()
