"""Benchmark: how long h3-sim takes to start, against a bare Python.

    python bench/bench_sim_startup.py [--repeat 15]

h3-sim is launched once per job by every engine test (hundreds of times a suite run), so its
start-up is paid again each time. Times, in one run and interleaved (so a busy machine slows all
alike), the median wall and CPU time (user + system, the child's own) of:

  bare        python -c pass
  sim         python -m h3bridge.sim --help     (h3-sim's cheapest invocation: parse, print, exit)
  eager api   python -c "import h3bridge" + every name in h3bridge.__all__ (what every h3-sim
              start paid while h3bridge/__init__.py imported the whole public API)

and prints each one's ratio to the bare Python. CPU time is the steadier figure on a shared machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent

COMMANDS = {
    "bare": [sys.executable, "-c", "pass"],
    "sim": [sys.executable, "-m", "h3bridge.sim", "--help"],
    "eager api": [sys.executable, "-c", "import h3bridge; [getattr(h3bridge, name) for name in h3bridge.__all__]"],
}


def run_once(command: list[str]) -> tuple[float, float]:
    """(wall seconds, the child's user + system CPU seconds)."""
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    arguments = parser.parse_args()
    for command in COMMANDS.values():     # warm the page cache and the bytecode caches first
        run_once(command)
    walls: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpus: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(arguments.repeat):
        for name, command in COMMANDS.items():
            wall, cpu = run_once(command)
            walls[name].append(wall)
            cpus[name].append(cpu)
    bare_wall, bare_cpu = statistics.median(walls["bare"]), statistics.median(cpus["bare"])
    print(f"median of {arguments.repeat} runs each      wall      cpu   wall/bare  cpu/bare")
    for name in COMMANDS:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name:<28} {wall * 1000:7.1f} ms {cpu * 1000:6.1f} ms  {wall / bare_wall:8.2f}x {cpu / bare_cpu:8.2f}x")
    sim_cpu, eager_cpu = statistics.median(cpus["sim"]), statistics.median(cpus["eager api"])
    print(f"h3-sim start-up CPU / eager h3bridge import CPU: {sim_cpu / eager_cpu:.2f}")


if __name__ == "__main__":
    main()
