"""Is a parallel story's film the serial film, every time? (issue 29)

    python bench/story_film_repeat.py [--runs 20] [--parallel 2]

Starts one `h3bridge serve --engine oneshot` on loopback (h3-sim and the fixture model), renders
the three-shot storyboard of docs/parallel-and-progress.md (64x32, 2 steps, seed 11; shot 2
`anchor`, shot 3 `cut`) shot after shot once through `h3bridge story --remote URL`, then `--runs`
times with `--parallel N`, each into a fresh folder, and compares every film's decoded frames and
audio samples with the serial film's. Prints how many were identical and the parallel runs' mean
wall time over the serial run's.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np

from bench_common import sim_path
from h3bridge.media.decode import decode_audio
from h3bridge.sim.fixture import write_fixture_model

STORY = '''width = 64
height = 32
steps = 2
seed = 11

[[shot]]
prompt = "a lighthouse at dusk"
frames = 22

[[shot]]
prompt = "the camera climbs the stairs"
frames = 22
continue = "anchor"

[[shot]]
prompt = "the open sea"
frames = 22
continue = "cut"
'''


def decoded(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with av.open(str(path)) as container:
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
    return frames, decode_audio(path)


def render(folder: Path, url: str, parallel: int, env: dict[str, str]) -> tuple[Path, float]:
    folder.mkdir()
    (folder / "story.toml").write_text(STORY, encoding="utf-8")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "h3bridge.cli", "story", str(folder / "story.toml"), "-o",
                           str(folder / "film.mp4"), "--remote", url, "--parallel", str(parallel)],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"story --parallel {parallel} failed:\n{done.stderr}")
    return folder / "film.mp4", time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=2)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="h3bridge-film-repeat-") as scratch:
        root = Path(scratch)
        model = write_fixture_model(root / "model" / "MiniMax-H3")
        env = {**os.environ, "HOME": str(root / "home"), "XDG_CACHE_HOME": str(root / "cache"),
               "H3BRIDGE_LOCK_PATH": str(root / "engine.lock")}
        log = root / "serve.log"
        with open(log, "wb") as stderr:
            server = subprocess.Popen([sys.executable, "-m", "h3bridge.cli", "serve", "--engine", "oneshot",
                                       "--engine-path", sim_path(), "--model-dir", str(model), "--port", "0",
                                       "--data-dir", str(root / "data")], stdout=subprocess.DEVNULL, stderr=stderr,
                                      env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not (found := re.search(r"listening on (http://[0-9.]+:\d+)", log.read_text(errors="replace"))):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start:\n{log.read_text(errors='replace')}")
                time.sleep(0.05)
            url = found[1]
            serial, serial_seconds = render(root / "serial", url, 1, env)
            expected = decoded(serial)
            identical, seconds = 0, []
            for run in range(1, options.runs + 1):
                film, wall = render(root / f"parallel-{run}", url, options.parallel, env)
                frames, audio = decoded(film)
                same = (frames.shape == expected[0].shape and np.array_equal(frames, expected[0])
                        and audio.shape == expected[1].shape and np.array_equal(audio, expected[1]))
                identical += same
                seconds.append(wall)
                if not same:
                    differing = int(np.count_nonzero(np.any(frames != expected[0], axis=(1, 2, 3)))) \
                        if frames.shape == expected[0].shape else -1
                    print(f"run {run}: differs ({differing} of {len(expected[0])} frames)", flush=True)
        finally:
            server.terminate()
            server.wait(60)
    print(f"parallel film identical to the serial film: {identical} of {options.runs} runs "
          f"(--parallel {options.parallel}, decoded frames and audio samples)")
    print(f"parallel run wall time over the serial run's: {sum(seconds) / len(seconds) / serial_seconds:.2f}x")


if __name__ == "__main__":
    main()
