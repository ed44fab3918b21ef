"""Takes on a warm engine vs one-shot: what `generate --takes N` saves, as a ratio, on h3-sim's time model.

    python bench/bench_takes.py [--takes 3] [--time-scale 0.02] [--size 448x256] [--frames 22] [--steps 10]

Both sides render the same N takes of one request (seeds 1..N) through `generate_takes`, the
function behind `h3bridge generate --takes N`, with h3-sim's time model (M1-Ultra seconds per phase
times H3_SIM_TIME_SCALE). One-shot: a fresh h3 per take, each loading the text encoder, the DiT and
the VAE. Session: one warm engine for all N, so takes 2..N cost their denoise (and decode), not the
loads. Prints both wall times and the ratio, and the engine starts and denoises each side made
(H3_SIM_LOG, H3_SIM_DENOISE_LOG). The small defaults run in well under a minute.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench_common import sim_path
from h3bridge import GenerationRequest, OneShotEngine, SessionEngine, generate_takes
from h3bridge.engines.lock import LOCK_PATH_ENV
from h3bridge.sim.fixture import write_fixture_model

PROMPT = "A red fox runs through fresh snow at dawn, low sun, cinematic"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def side(label: str, engine, request: GenerationRequest, takes: int, workdir: Path) -> tuple[float, int, int]:
    """(wall seconds, engine starts, denoises) of `takes` takes on `engine`."""
    starts, denoises = workdir / f"{label}-starts.jsonl", workdir / f"{label}-denoises.jsonl"
    os.environ["H3_SIM_LOG"], os.environ["H3_SIM_DENOISE_LOG"] = str(starts), str(denoises)
    began = time.perf_counter()
    with engine:
        generate_takes(engine, request, workdir / f"{label}.mp4", takes=takes,
                       on_take=lambda take, seed: print(f"  {label} take {take} (seed {seed})", flush=True))
    return time.perf_counter() - began, len(lines(starts)), len(lines(denoises))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--takes", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=0.02,
                        help="H3_SIM_TIME_SCALE: sleep seconds per simulated M1-Ultra second (default 0.02)")
    parser.add_argument("--size", default="448x256", help="WIDTHxHEIGHT (default 448x256)")
    parser.add_argument("--frames", type=int, default=22)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    width, height = (int(part) for part in args.size.split("x"))
    request = GenerationRequest(PROMPT, width=width, height=height, frames=args.frames, steps=args.steps, seed=1)

    workdir = Path(tempfile.mkdtemp(prefix="bench-takes-"))
    os.environ["H3_SIM_TIME_SCALE"] = str(args.time_scale)
    os.environ["HOME"] = str(workdir / "home")            # interactive h3 writes ~/.h3_history
    (workdir / "home").mkdir()
    os.environ[LOCK_PATH_ENV] = str(workdir / "engine.lock")
    try:
        model = write_fixture_model(workdir / "MiniMax-H3")
        print(f"{args.takes} takes of one request, {width}x{height}, {args.frames} frames, {args.steps} steps, "
              f"H3_SIM_TIME_SCALE={args.time_scale}")
        one_shot = side("one-shot", OneShotEngine(sim_path(), model), request, args.takes, workdir)
        warm = side("session", SessionEngine(sim_path(), model), request, args.takes, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for label, (wall, starts, denoises) in (("one-shot", one_shot), ("session", warm)):
        print(f"{label:<9}: {wall:7.2f} s for {args.takes} takes ({wall / args.takes:.2f} s/take); "
              f"{starts} engine start(s), {denoises} denoise(s)")
    print(f"warm-engine saving for {args.takes} takes: one-shot / session = {one_shot[0] / warm[0]:.2f}x")


if __name__ == "__main__":
    main()
