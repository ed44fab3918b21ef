"""Load on `h3bridge serve`: N concurrent clients submitting and polling on loopback for a bounded time.

    python bench/bench_serve.py [--clients 50] [--seconds 120] [--engine session]

Starts `h3bridge serve` over h3-sim and a fixture model (tests/server_helpers.ServerProcess), then
each client loops until the deadline: submit a tiny job (one in ten deliberately invalid: frames
23, which must come back 400), poll it every 50 ms until it finishes, download the clip, and
sometimes delete it mid-render (--submitters N: only N clients submit; the others poll their jobs
and list). A monitor samples the job list and the server's engine processes all
the while. Prints the poll-latency percentiles (p50/p99/max), the responses by status, every
response that is not a designed one (a designed one: 200, the 400 for the invalid job, 404 for a
deleted job, 409 for content not ready), the most jobs seen in progress at once and the most
engine processes seen at once (both must be 1). tests/test_server_load.py runs a short version
and asserts the last three.
"""
from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_helpers import KEY, ServerProcess, isolated_env  # noqa: E402  (the tests' launcher)

TINY = {"prompt": "a red fox runs through snow", "size": "96x64", "num_frames": 22, "steps": 2}
INVALID = TINY | {"num_frames": 23}
DESIGNED = {200, 400, 404, 409}
POLL_SECONDS = 0.05


@dataclass
class LoadReport:
    poll_latencies: list[float] = field(default_factory=list)
    statuses: collections.Counter = field(default_factory=collections.Counter)
    undesigned: list[str] = field(default_factory=list)
    completed: int = 0
    refused: int = 0
    max_in_progress: int = 0
    max_engine_processes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, what: str, response: httpx.Response | None, error: Exception | None = None,
               expected: set[int] = DESIGNED) -> None:
        with self.lock:
            if response is None:
                self.undesigned.append(f"{what}: {type(error).__name__}: {error}")
                return
            self.statuses[response.status_code] += 1
            if response.status_code not in expected:
                self.undesigned.append(f"{what}: {response.status_code} {response.text[:200]}")

    def percentile(self, fraction: float) -> float:
        ordered = sorted(self.poll_latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def _client(url: str, deadline: float, seed: int, submits: bool, report: LoadReport, known: list[str]) -> None:
    """Until the deadline: submit a job (one in ten invalid) and poll it to the end, then the next;
    a client that does not submit polls the jobs others submitted. A job submitted before the
    deadline is followed to its end (within a safety net), so every valid job is seen finished."""
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url + "/v1", headers=headers, timeout=60) as http:
        def call(what: str, method: str, path: str, expected: set[int], **kwargs) -> httpx.Response | None:
            try:
                response = http.request(method, path, **kwargs)
            except httpx.HTTPError as error:
                report.record(what, None, error)
                return None
            report.record(what, response, expected=expected)
            return response

        def poll(video_id: str, expected: set[int] = {200}) -> httpx.Response | None:
            started = time.perf_counter()
            polled = call("poll", "GET", f"/videos/{video_id}", expected=expected)
            with report.lock:
                report.poll_latencies.append(time.perf_counter() - started)
            return polled

        while time.monotonic() < deadline:
            invalid = rng.random() < 0.1
            if invalid or submits:
                response = call("submit", "POST", "/videos", expected={400} if invalid else {200},
                                json=(INVALID if invalid else TINY) | {"seed": rng.randrange(2**32)})
                if response is None:
                    continue
                if invalid:
                    with report.lock:
                        report.refused += 1
                    continue
            if not submits:       # poll what others submitted (deleted ones answer 404)
                if known:
                    poll(rng.choice(known), expected={200, 404})
                if rng.random() < 0.05:
                    call("list", "GET", "/videos", expected={200}, params={"limit": 20})
                time.sleep(POLL_SECONDS)
                continue
            video_id = response.json()["id"]
            with report.lock:
                known.append(video_id)
            delete = rng.random() < 0.1
            safety_net = time.monotonic() + 300
            while time.monotonic() < safety_net:
                polled = poll(video_id)
                if polled is None:
                    break
                status = polled.json()["status"]
                if delete and status == "in_progress":
                    call("delete", "DELETE", f"/videos/{video_id}", expected={200})
                    call("poll deleted", "GET", f"/videos/{video_id}", expected={404})
                    break
                if status in ("completed", "failed"):
                    if status == "completed":
                        content = call("content", "GET", f"/videos/{video_id}/content", expected={200})
                        with report.lock:
                            report.completed += content is not None and content.status_code == 200
                    else:
                        report.record("job failed", polled, expected=set())
                    break
                time.sleep(POLL_SECONDS)


def _monitor(server: ServerProcess, stop: threading.Event, report: LoadReport) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    assert server.process is not None
    root = psutil.Process(server.process.pid)
    with httpx.Client(headers=headers, timeout=60) as http:
        while not stop.is_set():
            try:
                jobs = http.get(f"{server.api}/videos", params={"limit": 100}).json()["data"]
                running = sum(job["status"] == "in_progress" for job in jobs)
            except httpx.HTTPError:
                running = 0
            simulators: dict[int, int] = {}      # pid -> parent pid, of every process with h3-sim's command line
            for child in root.children(recursive=True):
                try:
                    if any("h3-sim" in part for part in child.cmdline()[:2]):
                        simulators[child.pid] = child.ppid()
                except psutil.Error:
                    pass
            # A child the engine forks (FFmpeg, between its fork and its exec) shows h3-sim's command
            # line too: it is that engine, not a second one.
            engines = sum(parent not in simulators for parent in simulators.values())
            with report.lock:
                report.max_in_progress = max(report.max_in_progress, running)
                report.max_engine_processes = max(report.max_engine_processes, engines)
            stop.wait(0.05)


def run_load(server: ServerProcess, *, clients: int, seconds: float, submitters: int | None = None,
             seed: int = 0) -> LoadReport:
    """`clients` threads for `seconds`; the first `submitters` (default: all) submit jobs, the
    others poll them (and submit only the invalid ones)."""
    report = LoadReport()
    known: list[str] = []
    submitters = clients if submitters is None else submitters
    stop = threading.Event()
    monitor = threading.Thread(target=_monitor, args=(server, stop, report), daemon=True)
    monitor.start()
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=_client, args=(server.url, deadline, seed * 1000 + n, n < submitters,
                                                      report, known), daemon=True)
               for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 600)
    stop.set()
    monitor.join(30)
    return report


def measure_cancel(server: ServerProcess, trials: int) -> list[float]:
    """Seconds each DELETE of a running job takes to answer; it answers once the engine's process
    group is stopped. Jobs are upstream's default shape, which the server's slow H3_SIM_TIME_SCALE
    makes last seconds, so each is caught while denoising."""
    seconds = []
    with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
        for trial in range(trials):
            video_id = http.post("/videos", json={"prompt": "cancel me", "seed": trial}).raise_for_status().json()["id"]
            while (job := http.get(f"/videos/{video_id}").json())["phase"] not in ("denoise", "denoise enqueue"):
                if job["status"] in ("completed", "failed"):
                    raise SystemExit(f"{video_id} finished before it could be cancelled: raise H3_SIM_TIME_SCALE")
                time.sleep(0.01)
            started = time.perf_counter()
            http.delete(f"/videos/{video_id}").raise_for_status()
            seconds.append(time.perf_counter() - started)
    return seconds


def summary(report: LoadReport, clients: int, seconds: float) -> str:
    latencies = report.poll_latencies
    lines = [f"{clients} clients for {seconds:g} s: {len(latencies)} polls, {report.completed} clips downloaded, "
             f"{report.refused} invalid jobs refused",
             f"poll latency: p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {report.percentile(0.99) * 1000:.1f} ms, "
             f"max {max(latencies) * 1000:.1f} ms" if latencies else "no polls",
             f"responses: {dict(sorted(report.statuses.items()))}",
             f"most jobs in progress at once: {report.max_in_progress}; most engine processes at once: "
             f"{report.max_engine_processes}",
             f"responses that are not designed ones: {len(report.undesigned)}"]
    lines += [f"  {line}" for line in report.undesigned[:20]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--submitters", type=int, help="clients that submit jobs (default: all)")
    parser.add_argument("--engine", choices=["session", "oneshot"], default="session")
    parser.add_argument("--cancel-trials", type=int, default=5,
                        help="then time this many DELETEs of a running job (0: none)")
    args = parser.parse_args()
    from h3bridge.sim.fixture import write_fixture_model
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as scratch:
        root = Path(scratch)
        model = write_fixture_model(root / "MiniMax-H3")
        with ServerProcess(root / "data", model, root / "logs", engine=args.engine, env=isolated_env(root)) as server:
            report = run_load(server, clients=args.clients, seconds=args.seconds, submitters=args.submitters)
        print(summary(report, args.clients, args.seconds))
        if args.cancel_trials:
            slow = isolated_env(root / "cancel") | {"H3_SIM_TIME_SCALE": "0.05"}    # ~6 s jobs
            with ServerProcess(root / "cancel-data", model, root / "logs", engine=args.engine, env=slow) as server:
                cancels = measure_cancel(server, args.cancel_trials)
            print(f"DELETE of a running job answered (engine stopped) in: median {statistics.median(cancels):.3f} s, "
                  f"max {max(cancels):.3f} s over {len(cancels)}")
    ok = not report.undesigned and report.max_in_progress <= 1 and report.max_engine_processes <= 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
