"""What a CPU-bound job beside an h3-sim engine keeps of its speed, with and without --background.

    python bench/bench_background.py [--seconds 10] [--core N]

A counting loop (the "user's job") runs for --seconds on one core, four times in one run: alone,
beside `h3bridge generate` rendering on h3-sim (time scale 0: frame rendering and x264, real CPU
work) at normal priority, beside the same with --background (Linux: nice 19 + idle I/O), and alone
again. Everything is pinned to the same core so the two compete for it whatever else the machine
runs; the baseline is the mean of the two lone runs. Printed: each run's loop rate and the ratio
kept (rate beside the engine / baseline), and the engine's own CPU seconds per wall second, as a
line each and as JSON. The macOS path (PRIO_DARWIN_BG) cannot be measured on Linux.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_common import sim_path
from h3bridge.sim.fixture import write_fixture_model

SPIN = ("import sys, time\n"
        "end = time.monotonic() + float(sys.argv[1]); n = 0\n"
        "while time.monotonic() < end:\n"
        "    for _ in range(10000): n += 1\n"
        "print(n)\n")
ENGINE_FLAGS = ["--width", "864", "--height", "480", "--frames", "124", "--steps", "2", "--quiet"]
WARM_UP_SECONDS = 2.0      # the engine is past its start before the loop begins


def pinned(core: int):
    return lambda: os.sched_setaffinity(0, {core})


def spin(seconds: float, core: int) -> float:
    """The counting loop's rate (iterations per second) over `seconds` on `core`."""
    done = subprocess.run([sys.executable, "-c", SPIN, str(seconds)], capture_output=True, text=True, check=True,
                          preexec_fn=pinned(core))
    return int(done.stdout) / seconds


class EngineLoop:
    """`h3bridge generate` on h3-sim, again and again until stopped, pinned to `core`."""

    def __init__(self, model: Path, workdir: Path, core: int, background: bool) -> None:
        self.argv = [sys.executable, "-m", "h3bridge.cli", "generate", "-p", "a fox in the snow", *ENGINE_FLAGS,
                     "--overwrite", "-o", str(workdir / "engine.mp4"), "--engine-path", sim_path(),
                     "--model-dir", str(model)] + (["--background"] if background else [])
        self.log = workdir / f"sim-{'background' if background else 'normal'}.jsonl"
        self.env = {**os.environ, "H3_SIM_TIME_SCALE": "0", "H3_SIM_LOG": str(self.log)}
        self.core, self.stopping = core, threading.Event()
        self.engine_cpu: dict[int, float] = {}      # h3-sim pid -> its CPU seconds when last seen
        self.process: subprocess.Popen | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.sampler = threading.Thread(target=self._sample, daemon=True)

    @property
    def cpu_seconds(self) -> float:
        return sum(self.engine_cpu.values())

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, preexec_fn=pinned(self.core))
            self.process.wait()

    def _sample(self) -> None:
        """The engines' CPU time (h3-sim and the FFmpeg it runs), read while they live (h3-sim's log
        names each engine's pid)."""
        import psutil
        while not self.stopping.is_set():
            lines = self.log.read_text().splitlines() if self.log.exists() else []
            for line in lines:
                pid = json.loads(line)["pid"]
                try:
                    engine = psutil.Process(pid)
                    group = [engine, *engine.children(recursive=True)]     # its FFmpeg does the encoding
                except psutil.Error:
                    continue
                for process in group:
                    try:
                        times = process.cpu_times()
                    except psutil.Error:
                        continue
                    self.engine_cpu[process.pid] = max(self.engine_cpu.get(process.pid, 0.0),
                                                       times.user + times.system)
            time.sleep(0.1)

    def __enter__(self) -> "EngineLoop":
        self.started = time.monotonic()
        self.thread.start()
        self.sampler.start()
        time.sleep(WARM_UP_SECONDS)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self.started
        self.stopping.set()
        self.sampler.join(10)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)      # the CLI cancels its engine and exits
        self.thread.join(120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each counting run")
    parser.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)), help="the core both run on")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-background-") as folder:
        workdir = Path(folder)
        model = write_fixture_model(workdir / "MiniMax-H3")
        alone = [spin(args.seconds, args.core)]
        beside: dict[str, float] = {}
        engine_share: dict[str, float] = {}
        for name, background in (("normal", False), ("background", True)):
            with EngineLoop(model, workdir, args.core, background) as engine:
                beside[name] = spin(args.seconds, args.core)
            engine_share[name] = engine.cpu_seconds / engine.wall
        alone.append(spin(args.seconds, args.core))
    baseline = sum(alone) / len(alone)
    report = {"core": args.core, "seconds": args.seconds, "alone_rates": alone, "baseline_rate": baseline,
              "rates_beside_engine": beside, "kept": {name: rate / baseline for name, rate in beside.items()},
              "engine_cpu_per_wall_second": engine_share, "load_average": os.getloadavg()}
    print(f"counting loop alone: {alone[0]:.0f} and {alone[1]:.0f} /s (baseline {baseline:.0f} /s) on core {args.core}")
    for name in beside:
        print(f"beside the engine ({name:>10}): {beside[name]:.0f} /s, keeps {report['kept'][name]:.0%} of its "
              f"speed; the engine used {engine_share[name]:.2f} CPU s per wall s")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
