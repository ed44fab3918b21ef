"""Storyboards: the film's assembly memory, and a warm engine against one-shot per shot.

    python bench/bench_story.py [--shots 10] [--width 384 --height 224] [--frames 56] [--time-scale 0.02]

1. Story time: the same N-shot story (anchors and cuts alternating; every shot its own prompt)
   rendered on the warm session (one h3 for the whole story: model loads once) and one-shot (a
   fresh h3 per shot), each into a fresh job directory, through `run_story`. h3-sim charges
   M1-Ultra seconds per phase times H3_SIM_TIME_SCALE (see h3bridge/sim/engine.py), so the
   ratio says how much of a story the warm engine saves under upstream's cost model. Every shot
   has its own prompt, and h3 keys its conditioning and prepared-DiT caches on the prompt
   (h3.c h3_conditioning_key / h3_prepared_key), so the saving is the process start and the
   video VAE decoder, not the DiT preparation (see bench_session.py --vary-prompt).
2. Assembly memory: the finished job assembled again into a new film in a child process (the
   shots are reused, only the assembly runs); its peak RSS growth during the assembly (RSS
   sampled every 2 ms by psutil, the peak less the RSS just before) against ONE shot's frame
   array (F x H x W x 3 bytes). A film that held its frames would need about N shots' worth.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import sim_path
from h3bridge import OneShotEngine, SessionEngine
from h3bridge.engines.lock import LOCK_PATH_ENV
from h3bridge.sim.fixture import write_fixture_model
from h3bridge.story import Storyboard, run_story

CHILD = r'''
import sys, threading, time
from pathlib import Path
import psutil
from h3bridge import OneShotEngine
from h3bridge.story import Storyboard, run_story
story, job, film, engine, model = sys.argv[1:6]
board = Storyboard.from_toml(story)
process = psutil.Process()
baseline = process.memory_info().rss
peak = [baseline]
running = threading.Event()
running.set()
def sample():
    while running.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        time.sleep(0.002)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
started = time.monotonic()
with OneShotEngine(engine, model) as one_shot:
    result = run_story(board, Path(film), engine=one_shot, job_dir=Path(job))
seconds = time.monotonic() - started
running.clear()
sampler.join()
assert result.rendered == 0 and result.assembled
print(baseline, peak[0], seconds)
'''


def story_text(shots: int, width: int, height: int, frames: int) -> str:
    lines = [f"width = {width}", f"height = {height}", "steps = 2", "seed = 1", ""]
    for index in range(1, shots + 1):
        lines += ["[[shot]]", f'prompt = "shot {index}: waves against a lighthouse, take {index}"',
                  f"frames = {frames}"]
        if index > 1 and index % 2 == 0:
            lines.append('continue = "anchor"')
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shots", type=int, default=10)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--height", type=int, default=224)
    parser.add_argument("--frames", type=int, default=56)
    parser.add_argument("--time-scale", default="0.02", help="H3_SIM_TIME_SCALE (default 0.02)")
    args = parser.parse_args()
    engine = sim_path()
    with tempfile.TemporaryDirectory(prefix="h3bridge-bench-story-") as scratch:
        root = Path(scratch)
        os.environ[LOCK_PATH_ENV] = str(root / "engine.lock")
        os.environ["H3_SIM_TIME_SCALE"] = args.time_scale
        model = write_fixture_model(root / "MiniMax-H3")
        story_path = root / "story.toml"
        story_path.write_text(story_text(args.shots, args.width, args.height, args.frames))
        story = Storyboard.from_toml(story_path)
        times = {}
        for name, make in (("warm session", lambda: SessionEngine(engine, model)),
                           ("one-shot", lambda: OneShotEngine(engine, model))):
            started = time.monotonic()
            with make() as chosen:
                run_story(story, root / f"{name}.mp4", engine=chosen, job_dir=root / f"{name}.job")
            times[name] = time.monotonic() - started
        print(f"story of {args.shots} shots ({args.width}x{args.height}, {args.frames} frames, "
              f"H3_SIM_TIME_SCALE={args.time_scale}):")
        for name, seconds in times.items():
            print(f"  {name:<13} {seconds:7.1f} s")
        print(f"  warm / one-shot time ratio: {times['warm session'] / times['one-shot']:.2f}")

        done = subprocess.run([sys.executable, "-c", CHILD, str(story_path), str(root / "one-shot.job"),
                               str(root / "again.mp4"), engine, str(model)], capture_output=True, text=True,
                              check=True)
        before, after, seconds = (float(x) for x in done.stdout.split())
        one_shot_array = args.frames * args.width * args.height * 3
        growth = after - before
        print(f"assembly of {args.shots} shots in {seconds:.1f} s: RSS {before / 2**20:.1f} MiB before, peak "
              f"{after / 2**20:.1f} MiB (grew {growth / 2**20:.1f} MiB); one "
              f"shot's frame array is {one_shot_array / 2**20:.1f} MiB")
        print(f"  assembly peak growth / one shot's frames: {growth / one_shot_array:.2f} "
              f"(holding the film's frames would be ~{args.shots})")


if __name__ == "__main__":
    main()
