"""A fleet behind LiteLLM's proxy: a 6-shot storyboard of `cut` shots (six independent jobs) on 1, 2
and 3 `h3bridge serve --max-queued 1` (h3-sim, one-shot engine) on loopback, and what the proxy adds
to one request.

    python bench/bench_fleet.py [--shots 6] [--time-scale 0.2] [--requests 30]

Needs the `fleet` extra (pip install -e '.[fleet]'). One proxy serves three model groups: `fleet-1`
(server A), `fleet-2` (A, B) and `fleet-3` (A, B, C), each written by `h3bridge fleet`'s own
config function, so the three runs differ only in how many servers the group has.

Shots: the storyboard's six shots are submitted at once, the way `h3bridge story --parallel 6`
would: six threads, each creating its shot with the official `openai` client through the proxy,
polling it and downloading the clip (a client that meets a whole fleet full, a 429, waits for its
Retry-After and asks again). Wall time is from the first create to the last download; printed per
fleet size with its ratio to one server (issue 23's target: 3 servers <= 0.45x one) and how many
shots each server ran (from each server's own job list).
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

from h3bridge.fleet import FleetServer, FleetSettings, fleet_config  # noqa: E402
from h3bridge.sim.fixture import write_fixture_model  # noqa: E402

SIZES = (1, 2, 3)


def write_config(servers, path: Path) -> None:
    """One model group per fleet size; deployment ids made unique across groups (a server is a
    deployment of each group it is in)."""
    merged: dict[str, object] = {}
    model_list: list[dict] = []
    for size in SIZES:
        config = fleet_config(FleetSettings(model_name=f"fleet-{size}",
                                            servers=tuple(FleetServer(s.url) for s in servers[:size])))
        for deployment in config["model_list"]:
            deployment["model_info"]["id"] += f"-of-{size}"
            model_list.append(deployment)
        merged = config
    merged["model_list"] = model_list
    merged["router_settings"]["num_retries"] = len(servers) - 1
    path.write_text(yaml.safe_dump(merged, sort_keys=False))


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shots", type=int, default=6)
    parser.add_argument("--time-scale", default="0.2", help="h3-sim's H3_SIM_TIME_SCALE for the servers")
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from litellm.types.videos.utils import decode_video_id_with_provider
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as scratch:
        root = Path(scratch)
        model = write_fixture_model(root / "model")
        servers = start_fleet_servers(root, model, max(SIZES), extra_env={"H3_SIM_TIME_SCALE": args.time_scale})
        proxy = None
        try:
            config = root / "litellm.yaml"
            write_config(servers, config)
            proxy = ProxyProcess(config, root / "proxy").start()
            print(f"LiteLLM proxy started in {proxy.started_in:.1f} s")
            walls: dict[int, float] = {}
            last_ids: list[str] = []
            for size in SIZES:
                before = [len(server_job_ids(s)) for s in servers]
                walls[size], last_ids = render_shots(proxy, f"fleet-{size}", args.shots, root / f"film-{size}")
                ran = [len(server_job_ids(s)) - b for s, b in zip(servers, before)]
                print(f"{size} server(s): {args.shots} shots in {walls[size]:.1f} s, ratio to one server "
                      f"{walls[size] / walls[1]:.2f}; shots per server {ran[:size]}", flush=True)
            print(f"target: 3 servers <= 0.45x one: {'met' if walls[3] / walls[1] <= 0.45 else 'NOT met'} "
                  f"({walls[3] / walls[1]:.2f})")
            decoded = decode_video_id_with_provider(last_ids[0])
            holder = next(s for s in servers if f"-{s.url.rsplit(':', 1)[1]}-of-" in decoded["deployment_id"])
            for name, (direct, through) in overhead(proxy, holder, last_ids[0], decoded["video_id"],
                                                    args.requests).items():
                print(f"proxy overhead, {name}: direct {direct * 1000:.1f} ms, through the proxy "
                      f"{through * 1000:.1f} ms (+{(through - direct) * 1000:.1f} ms) median of {args.requests}")
        finally:
            if proxy is not None:
                proxy.stop()
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
