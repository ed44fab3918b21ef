"""RemoteEngine over a real `h3bridge serve` on loopback (h3-sim): what a remote job costs beyond
the same job run locally, and how long a cancel takes to delete the server's running job.

    python bench/bench_remote.py [--jobs 5] [--cancels 5]

Jobs: the cheapest legal clip (96x64, 22 frames, 2 steps) N times through OneShotEngine and N
times through RemoteEngine against a server on the same machine running the same one-shot engine;
prints both medians and their ratio (the HTTP round trips, polling and the download on top).
Cancels: a server whose h3-sim hangs in the denoise loop; each job is cancelled as soon as the
server reports the engine in that loop; prints the time from `cancel()` to the server answering
404 for the job (median and max), against the 1 s the issue asks for. Ratios and times are of
one run on this machine, loaded or not: compare them with each other, not across machines.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from remote_helpers import KEY, start_server  # noqa: E402

from h3bridge import CancelToken, GenerationCancelled, GenerationRequest, OneShotEngine, RemoteEngine  # noqa: E402
from h3bridge.sim.fixture import write_fixture_model  # noqa: E402
from core_helpers import sim_engine_path  # noqa: E402

REQUEST = GenerationRequest("a red fox runs through snow", width=96, height=64, frames=22, steps=2)


def timed_jobs(engine, count: int, folder: Path) -> list[float]:
    seconds = []
    for index in range(count):
        started = time.monotonic()
        engine.generate(REQUEST.with_changes(seed=index), folder / f"{index}.mp4", want_frames=True)
        seconds.append(time.monotonic() - started)
    return seconds


def cancel_latencies(url: str, count: int) -> list[float]:
    import httpx
    latencies = []
    for index in range(count):
        cancel = CancelToken()
        cancelled_at: list[float] = []
        job_ids: list[str] = []
        engine = RemoteEngine(url, api_key=KEY, poll_interval=0.1)
        submit = engine._submit

        def remember(*args, submit=submit, **options):
            job = submit(*args, **options)
            job_ids.append(job.id)
            return job

        engine._submit = remember

        def on_progress(event, cancel=cancel, cancelled_at=cancelled_at) -> None:
            if event.phase == "denoise enqueue" and not cancelled_at:
                cancelled_at.append(time.monotonic())
                cancel.cancel()

        try:
            engine.generate(REQUEST.with_changes(seed=index), None, want_frames=False, want_audio=False,
                            on_progress=on_progress, cancel=cancel)
        except GenerationCancelled:
            pass
        while httpx.get(f"{url}/v1/videos/{job_ids[0]}", headers={"Authorization": f"Bearer {KEY}"}).status_code != 404:
            time.sleep(0.01)
        latencies.append(time.monotonic() - cancelled_at[0])
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--cancels", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as scratch:
        root = Path(scratch)
        model = write_fixture_model(root / "model")
        server = start_server(root / "serve", model)
        hanging = start_server(root / "serve-hang", model, extra_env={
            "H3_SIM_HANG_PHASE": "denoise enqueue:1", "H3_SIM_HANG_NOTICE": str(root / "hung.pid")})
        try:
            local = timed_jobs(OneShotEngine(sim_engine_path(), model), args.jobs, root / "local")
            remote = timed_jobs(RemoteEngine(server.url, api_key=KEY, poll_interval=0.05), args.jobs, root / "remote")
            cancels = cancel_latencies(hanging.url, args.cancels)
        finally:
            server.stop()
            hanging.stop()
    print(f"local one-shot job: median {statistics.median(local):.3f} s over {args.jobs}")
    print(f"remote job (loopback serve, same engine): median {statistics.median(remote):.3f} s; "
          f"ratio remote/local {statistics.median(remote) / statistics.median(local):.2f}")
    print(f"cancel -> server job gone: median {statistics.median(cancels) * 1000:.0f} ms, "
          f"max {max(cancels) * 1000:.0f} ms over {args.cancels} (issue: within 1 s)")


if __name__ == "__main__":
    main()
