"""A fleet behind LiteLLM's proxy: a 6-shot storyboard of `cut` shots (six independent jobs) on 1, 2
and 3 `h3bridge serve --max-queued 1` (h3-sim, one-shot engine) on loopback, and what the proxy adds
to one request.

    python bench/bench_fleet.py [--shots 6] [--time-scale 0.2] [--requests 30] [--parallel N] [--threads]

Needs the `fleet` extra (pip install -e '.[fleet]'). Three servers, and one proxy per fleet size
(servers A; A, B; A, B, C), each configured by `h3bridge fleet --retries 8`'s own config function
with its default model group (the one `h3bridge story --remote` asks for), so the three runs differ only in
how many servers the proxy has.

Shots: the storyboard is rendered by the command a user runs, `h3bridge story story.toml -o film.mp4
--remote PROXY --parallel N` (a subprocess, the proxy's key in $H3BRIDGE_API_KEY). N is the fleet's
room, servers x (max-queued + 1), at most the shot count (--parallel overrides it): more would only
meet full servers, a 429 the proxy passes on once its retries have found every server full. A run
that fails on one is run again, as a user would: the job directory keeps the finished shots, and
only the missing ones render (the reruns are counted, their time included). Wall time is the
command's, from start to the joined film; printed per fleet size with its ratio to one server
(issue 23's target: 3 servers <= 0.45x one) and how many shots each server ran (from each
server's own job list). Then one RemoteEngine job through the proxy says whether the proxy passes
the event stream on (LiteLLM 1.110 does not: RemoteEngine polls).
--threads: the same shots created at once by the official `openai` client from six threads, polled
and downloaded: the fleet measured without h3bridge's client (what another client of the proxy
gets), for comparison with the storyboard's numbers.
h3-sim sleeps `--time-scale` of the reference machine's phase seconds, so a shot takes seconds of
sleep, not CPU: on this 2-core machine the servers' renders overlap as Macs would.

Overhead: the same completed job's status (GET /v1/videos/{id}) and its clip (GET .../content)
asked `--requests` times directly of its server and through the proxy; medians and the difference.
Ratios and times are of one run on this machine, loaded or not: compare them with each other.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import httpx  # noqa: E402
import yaml  # noqa: E402

from fleet_helpers import KEY, MASTER_KEY, ProxyProcess, server_job_ids, start_fleet_servers  # noqa: E402
from server_helpers import h3bridge_program  # noqa: E402

from h3bridge.fleet import FleetServer, FleetSettings, fleet_config  # noqa: E402
from h3bridge.sim.fixture import write_fixture_model  # noqa: E402

SIZES = (1, 2, 3)
MAX_QUEUED = 1          # the servers' --max-queued (fleet_helpers' default, docs/fleet.md's advice)
RERUNS = 5              # story reruns (resumes) after a failed run, at most
# The router picks a server at random for each try (simple-shuffle): with one retry per other
# server, a create can meet the same full server twice and the proxy passes its 429 on. More
# tries find the server with room (h3bridge fleet --retries).
ROUTER_RETRIES = 8       # --retries changes it


def client_for(proxy: ProxyProcess):
    import warnings

    import openai
    warnings.filterwarnings("ignore", message="The Sora API", category=DeprecationWarning)
    # A whole fleet full answers 429 with Retry-After: the client waits and asks again, as a
    # storyboard renderer would, for as long as the shots ahead take.
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=MASTER_KEY, max_retries=1000, timeout=120)


def render_shots(proxy: ProxyProcess, group: str, shots: int, out: Path) -> tuple[float, list[str]]:
    client = client_for(proxy)
    out.mkdir(parents=True, exist_ok=True)
    ids: list[str] = []
    lock = threading.Lock()

    def shot(index: int) -> None:
        video = client.videos.create(model=group, prompt=f"shot {index + 1}: a red fox runs through snow, cut",
                                     size="96x64", seconds="1", extra_body={"num_inference_steps": 2, "seed": index})
        with lock:
            ids.append(video.id)
        while video.status not in ("completed", "failed"):
            time.sleep(0.25)
            video = client.videos.retrieve(video.id)
        assert video.status == "completed", video.error
        (out / f"shot-{index + 1}.mp4").write_bytes(client.videos.download_content(video.id).read())

    started = time.monotonic()
    with ThreadPoolExecutor(shots) as pool:
        list(pool.map(shot, range(shots)))
    return time.monotonic() - started, ids


def write_story(path: Path, shots: int) -> Path:
    """`shots` independent shots: the first, then a `cut` each (so every shot may render at once)."""
    lines = ["width = 96", "height = 64", "steps = 2", "seed = 7", ""]
    for index in range(shots):
        lines += ["[[shot]]", f'prompt = "shot {index + 1}: a red fox runs through snow"', "frames = 22"]
        if index:
            lines.append('continue = "cut"')
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def proxy_config(servers, path: Path, retries: int = ROUTER_RETRIES) -> Path:
    """`h3bridge fleet --retries ROUTER_RETRIES`'s configuration for these servers (default model group)."""
    config = fleet_config(FleetSettings(servers=tuple(FleetServer(s.url) for s in servers), retries=retries))
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def render_story(proxy: ProxyProcess, story: Path, film: Path, parallel: int, home: Path) -> tuple[float, int]:
    """`h3bridge story` through the proxy until it succeeds (at most RERUNS reruns): wall seconds, reruns."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "H3BRIDGE_API_KEY": MASTER_KEY, "HOME": str(home), "H3BRIDGE_CACHE_DIR": str(home / "cache"),
           "NO_PROXY": "127.0.0.1,localhost"}
    argv = [h3bridge_program(), "story", str(story), "-o", str(film), "--remote", proxy.url, "--parallel", str(parallel)]
    started = time.monotonic()
    for rerun in range(RERUNS + 1):
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode == 0:
            return time.monotonic() - started, rerun
        last = done.stderr.strip().splitlines()[-8:]
        print(f"  h3bridge story exited {done.returncode} ({' / '.join(last)[:600]}); running it again", flush=True)
    raise SystemExit(f"h3bridge story failed {RERUNS + 1} times through {proxy.url}")


def proxy_passes_events(proxy: ProxyProcess, scratch: Path) -> bool:
    """One job through the proxy with RemoteEngine: True if it followed the event stream, False if it polled."""
    from h3bridge import GenerationRequest, RemoteEngine
    with RemoteEngine(proxy.url, api_key=MASTER_KEY) as engine:
        engine.generate(GenerationRequest("a probe", width=96, height=64, frames=22, steps=2), scratch / "probe.mp4",
                        want_frames=False, want_audio=False)
        return bool(engine._events_offered)


def overhead(proxy: ProxyProcess, server, video_id: str, inner_id: str, requests: int) -> dict[str, tuple[float, float]]:
    direct = httpx.Client(base_url=f"{server.url}/v1", headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    through = httpx.Client(base_url=f"{proxy.url}/v1", headers={"Authorization": f"Bearer {MASTER_KEY}"}, timeout=60)
    results = {}
    for name, direct_path, proxy_path in (("status", f"/videos/{inner_id}", f"/videos/{video_id}"),
                                          ("content", f"/videos/{inner_id}/content", f"/videos/{video_id}/content")):
        timings: dict[str, list[float]] = {"direct": [], "proxy": []}
        for _ in range(requests):
            for label, client, path in (("direct", direct, direct_path), ("proxy", through, proxy_path)):
                began = time.monotonic()
                client.get(path).raise_for_status()
                timings[label].append(time.monotonic() - began)
        results[name] = (statistics.median(timings["direct"]), statistics.median(timings["proxy"]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--shots", type=int, default=6)
    parser.add_argument("--time-scale", default="0.2", help="h3-sim's H3_SIM_TIME_SCALE for the servers")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--parallel", type=int, default=0, metavar="N",
                        help=f"story --parallel for every size (default: servers x {MAX_QUEUED + 1}, at most --shots)")
    parser.add_argument("--retries", type=int, default=ROUTER_RETRIES,
                        help=f"the proxy's retries (h3bridge fleet --retries; default {ROUTER_RETRIES})")
    parser.add_argument("--threads", action="store_true",
                        help="also create the shots with the official openai client from threads (no h3bridge client)")
    args = parser.parse_args()
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from litellm.types.videos.utils import decode_video_id_with_provider
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as scratch:
        root = Path(scratch)
        model = write_fixture_model(root / "model")
        servers = start_fleet_servers(root, model, max(SIZES), max_queued=MAX_QUEUED,
                                      extra_env={"H3_SIM_TIME_SCALE": args.time_scale})
        proxies: dict[int, ProxyProcess] = {}
        try:
            for size in SIZES:
                proxies[size] = ProxyProcess(proxy_config(servers[:size], root / f"litellm-{size}.yaml", args.retries),
                                             root / f"proxy-{size}")
            with ThreadPoolExecutor(len(SIZES)) as pool:      # each takes a minute to start on a loaded machine
                list(pool.map(ProxyProcess.start, proxies.values()))
            print("LiteLLM proxies started in " + ", ".join(f"{p.started_in:.1f} s" for p in proxies.values()))
            story = write_story(root / "story.toml", args.shots)
            walls: dict[int, float] = {}
            for size in SIZES:
                parallel = args.parallel or min(args.shots, size * (MAX_QUEUED + 1))
                before = [len(server_job_ids(s)) for s in servers]
                walls[size], reruns = render_story(proxies[size], story, root / f"film-{size}.mp4", parallel,
                                                   root / f"home-{size}")
                ran = [len(server_job_ids(s)) - b for s, b in zip(servers, before)]
                print(f"{size} server(s): h3bridge story --parallel {parallel}: {args.shots} shots in "
                      f"{walls[size]:.1f} s, ratio to one server {walls[size] / walls[1]:.2f}; shots per server "
                      f"{ran[:size]}; reruns {reruns}", flush=True)
            print(f"target: 3 servers <= 0.45x one: {'met' if walls[3] / walls[1] <= 0.45 else 'NOT met'} "
                  f"({walls[3] / walls[1]:.2f})")
            followed = proxy_passes_events(proxies[1], root)
            print("RemoteEngine through the proxy: " + ("followed the event stream" if followed
                                                        else "no event stream there, polled"))
            last_ids: list[str] = []
            if args.threads:
                group = FleetSettings().model_name
                threads: dict[int, float] = {}
                for size in SIZES:
                    threads[size], last_ids = render_shots(proxies[size], group, args.shots, root / f"threads-{size}")
                    print(f"{size} server(s), openai client from {args.shots} threads: {threads[size]:.1f} s, "
                          f"ratio to one server {threads[size] / threads[1]:.2f}", flush=True)
            else:
                _, last_ids = render_shots(proxies[3], FleetSettings().model_name, 1, root / "one")   # a job to ask about
            decoded = decode_video_id_with_provider(last_ids[0])
            holder = next(s for s in servers if decoded["deployment_id"].endswith("-" + s.url.rsplit(":", 1)[1]))
            for name, (direct, through) in overhead(proxies[3], holder, last_ids[0], decoded["video_id"],
                                                    args.requests).items():
                print(f"proxy overhead, {name}: direct {direct * 1000:.1f} ms, through the proxy "
                      f"{through * 1000:.1f} ms (+{(through - direct) * 1000:.1f} ms) median of {args.requests}")
        finally:
            for proxy in proxies.values():
                proxy.stop()
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
