"""Warm session vs one-shot: wall time of N jobs on h3-sim with its realistic time model.

    python bench/bench_session.py [--jobs 5] [--time-scale 0.06] [--vary-prompt] [--want-frames]

Both sides render the same N requests (upstream's default 864x480, 56 frames, 20 steps; the
same prompt with seeds 1..N, the "try a few seeds" workflow) through h3-sim, whose time model
charges M1-Ultra seconds (issue 17: text encoder 10.5 s, DiT load 18.3 s, denoise 86.6 s)
times H3_SIM_TIME_SCALE. One-shot: `OneShotEngine.generate` per job (a fresh h3 process that
loads everything). Session: one `SessionEngine` for all N jobs; h3's interactive mode keeps
the conditioning, the prepared DiT and the video VAE decoder (h3.c caches), so jobs 2..N skip
those phases. Prints both wall times, the ratio, and which phases the session skipped.

With --vary-prompt every job has its own prompt: the conditioning and the prepared DiT are
keyed on the prompt (h3.c h3_conditioning_key / h3_prepared_key), so only the video VAE
decoder is reused and the session's advantage shrinks to that.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench_common import sim_path
from h3bridge import GenerationRequest, OneShotEngine, SessionEngine
from h3bridge.engines.lock import LOCK_PATH_ENV
from h3bridge.sim.fixture import write_fixture_model

PROMPT = "A red fox runs through fresh snow at dawn, low sun, cinematic"


def requests(jobs: int, vary_prompt: bool) -> list[GenerationRequest]:
    return [GenerationRequest(f"{PROMPT}, take {seed}" if vary_prompt else PROMPT, seed=seed)
            for seed in range(1, jobs + 1)]


def run(engine, jobs: list[GenerationRequest], workdir: Path, label: str,
        want_frames: bool) -> tuple[float, list[dict[str, float]]]:
    timings: list[dict[str, float]] = []
    started = time.perf_counter()
    for index, request in enumerate(jobs):
        job_started = time.perf_counter()
        result = engine.generate(request, workdir / f"{label}-{index}.mp4", want_frames=want_frames,
                                 want_audio=True)
        timings.append(result.timings)
        print(f"  {label} job {index + 1}: {time.perf_counter() - job_started:6.2f} s", flush=True)
    return time.perf_counter() - started, timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--time-scale", type=float, default=0.06,
                        help="H3_SIM_TIME_SCALE: sleep seconds per simulated M1-Ultra second (default 0.06)")
    parser.add_argument("--vary-prompt", action="store_true", help="a different prompt for every job")
    parser.add_argument("--want-frames", action="store_true", help="also read frames back (session: from the MP4)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-session-"))
    os.environ["H3_SIM_TIME_SCALE"] = str(args.time_scale)
    os.environ["HOME"] = str(workdir / "home")            # interactive h3 writes ~/.h3_history
    (workdir / "home").mkdir()
    os.environ[LOCK_PATH_ENV] = str(workdir / "engine.lock")
    try:
        model = write_fixture_model(workdir / "MiniMax-H3")
        jobs = requests(args.jobs, args.vary_prompt)
        print(f"{args.jobs} jobs, 864x480, 56 frames, 20 steps, H3_SIM_TIME_SCALE={args.time_scale}, "
              f"{'a new prompt per job' if args.vary_prompt else 'same prompt, seeds 1..N'}")
        one_shot_wall, one_shot_timings = run(OneShotEngine(sim_path(), model), jobs, workdir, "one-shot",
                                              args.want_frames)
        with SessionEngine(sim_path(), model) as session:
            session_wall, session_timings = run(session, jobs, workdir, "session", args.want_frames)
            assert session.starts == 1, "the session restarted during the benchmark"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\none-shot: {one_shot_wall:7.2f} s for {args.jobs} jobs ({one_shot_wall / args.jobs:.2f} s/job)")
    print(f"session : {session_wall:7.2f} s for {args.jobs} jobs ({session_wall / args.jobs:.2f} s/job)")
    print(f"ratio   : session / one-shot = {session_wall / one_shot_wall:.3f} "
          f"({one_shot_wall / session_wall:.2f}x faster)")
    # Phases every one-shot job ran but warm session jobs (2..N) did not report at all.
    always = set.intersection(*(set(t) for t in one_shot_timings)) - {"total"}
    warm = session_timings[1:]
    skipped = sorted((p for p in always if all(p not in t for t in warm)),
                     key=lambda p: -sum(t.get(p, 0.0) for t in one_shot_timings))
    shortened = sorted(p for p in always - set(skipped)
                       if sum(t.get(p, 0.0) for t in warm) < 0.5 * sum(t.get(p, 0.0) for t in one_shot_timings[1:]))
    print("phases the warm session skips on jobs 2..N (one-shot seconds per job, mean):")
    for phase in skipped:
        mean = sum(t[phase] for t in one_shot_timings) / len(one_shot_timings)
        print(f"  {phase:<24} {mean:6.2f} s")
    if skipped:
        saved = sum(sum(t[p] for t in one_shot_timings) / len(one_shot_timings) for p in skipped)
        one_shot_mean = sum(t["total"] for t in one_shot_timings) / len(one_shot_timings)
        print(f"  = {saved:.2f} s of a {one_shot_mean:.2f} s one-shot job ({saved / one_shot_mean:.0%}); "
              f"at H3_SIM_TIME_SCALE=1 (M1-Ultra seconds) about {saved / args.time_scale:.0f} s per warm job")
    if shortened:
        print("phases that still report but are much shorter (cache hits): " + ", ".join(shortened))
    print("phases both still pay: " + ", ".join(sorted(always - set(skipped) - set(shortened))))


if __name__ == "__main__":
    main()
