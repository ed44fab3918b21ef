"""A fleet for real: LiteLLM's proxy (the base `litellm` package and the proxy's dependencies, the
`fleet` extra) in front of three `h3bridge serve --max-queued 1` on loopback, configured by
`h3bridge fleet`'s writer, driven by the official `openai` client. Skipped when litellm or a
dependency of its proxy is not installed.

One test, so one proxy start (about a minute on a loaded machine) even when the suite is spread
over workers. What keeps it free of timing: the test holds each server's engine lock (every server
has its own, H3BRIDGE_LOCK_PATH), so no job finishes until the test lets go; a server then holds
exactly its running job and one waiting one, and the seventh job finds the whole fleet full."""
from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from server_helpers import model, mp4_frame_count, wait_finished  # noqa: F401  (model: a fixture)

PROXY_MODULES = ("litellm", "apscheduler", "backoff", "fastapi_sso", "gunicorn", "orjson", "rq", "uvloop",
                 "multipart", "cryptography", "email_validator", "websockets", "jwt", "semver", "expression",
                 "mcp", "soundfile", "yaml", "openai")
_missing = [name for name in PROXY_MODULES if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(bool(_missing), reason=f"LiteLLM's proxy needs {', '.join(_missing)}: "
                                                       "pip install -e '.[fleet]'")

from fleet_helpers import KEY, ProxyProcess, proxy_client, server_job_ids, start_fleet_servers  # noqa: E402

def _create(client, index: int):
    return client.videos.create(model="MiniMax-H3", prompt=f"shot {index}: a red fox runs through snow",
                                size="96x64", seconds="1", extra_body={"num_inference_steps": 2, "seed": 100 + index})


def _direct_content(server, job_id: str) -> bytes:
    response = httpx.get(f"{server.url}/v1/videos/{job_id}/content", headers={"Authorization": f"Bearer {KEY}"},
                         timeout=60)
    response.raise_for_status()
    return response.content


def test_a_fleet_behind_litellm_spreads_jobs_routes_polls_and_survives_a_killed_server(
        tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    import openai
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")     # importing litellm reaches for none
    from litellm.types.videos.utils import decode_video_id_with_provider

    from h3bridge.engines.lock import engine_lock
    from h3bridge.fleet import FleetServer, FleetSettings, write_fleet_config

    servers = start_fleet_servers(tmp_path, model, 3)
    proxy = None
    try:
        config = write_fleet_config(FleetSettings(servers=tuple(FleetServer(s.url) for s in servers)),
                                    tmp_path / "litellm.yaml")
        assert KEY not in config.read_text()
        proxy = ProxyProcess(config, tmp_path / "proxy").start()
        print(f"LiteLLM proxy ready in {proxy.started_in:.1f} s")
        by_deployment = {FleetServer(s.url).deployment_id: s for s in servers}
        client = proxy_client(proxy, max_retries=8)     # a 429 of a fleet full for a second is retried

        def holder(video_id: str):
            decoded = decode_video_id_with_provider(video_id)
            server = by_deployment[decoded["deployment_id"]]
            assert decoded["video_id"] in server_job_ids(server), "the id names the server holding the job"
            return server, decoded["video_id"]

        # 1. Six creates at once over three servers that cannot finish a job: two on each.
        with ExitStack() as held:
            for server in servers:
                held.enter_context(engine_lock(path=Path(server.env["H3BRIDGE_LOCK_PATH"])))
            with ThreadPoolExecutor(6) as pool:
                videos = list(pool.map(lambda index: _create(client, index), range(6)))
            assert all(video.status in ("queued", "in_progress") for video in videos), [v.status for v in videos]
            counts = sorted(len(server_job_ids(server)) for server in servers)
            assert counts == [2, 2, 2], counts
            # the whole fleet is full: the proxy says so with a 429, and no server took the job
            with pytest.raises(openai.RateLimitError):
                _create(proxy_client(proxy, max_retries=0), 6)
            assert sorted(len(server_job_ids(server)) for server in servers) == [2, 2, 2]
            # and right after those 429s every job's status still comes from its own server (a
            # router cooling the full servers down dropped that pin: 404 "no video" from another)
            for video in videos:
                assert proxy_client(proxy, max_retries=0).videos.retrieve(video.id).status in ("queued", "in_progress")
            placed = {video.id: holder(video.id) for video in videos}
            assert len({inner for _, inner in placed.values()}) == 6
            # extra_body reached the server as its own fields
            for index, video in enumerate(videos):
                server, inner = placed[video.id]
                job = httpx.get(f"{server.url}/v1/videos/{inner}", headers={"Authorization": f"Bearer {KEY}"},
                                timeout=30).json()
                assert job["seed"] == 100 + index and job["prompt"].startswith(f"shot {index}:")

            # 2. One server is killed while it holds two jobs (one started, waiting for its engine).
            victim = servers[2]
            victim_port = int(victim.url.rsplit(":", 1)[1])
            victim_jobs = [vid for vid, (server, _) in placed.items() if server is victim]
            victim.kill()
        # its jobs' polls fail with the connection's reason (never a 404 from another server)
        with pytest.raises(openai.APIStatusError) as lost:
            proxy_client(proxy, max_retries=0).videos.retrieve(victim_jobs[0])
        print(f"a poll of the killed server's job: HTTP {lost.value.status_code}: {str(lost.value)[:300]}")
        assert lost.value.status_code >= 500 and "connect" in str(lost.value).lower()

        # 3. The live servers' jobs complete; status and content come from the server that holds each.
        downloaded: dict[str, bytes] = {}
        for video_id, (server, inner) in placed.items():
            if server is victim:
                continue
            assert wait_finished(client, video_id, timeout=120).status == "completed"
            downloaded[video_id] = client.videos.download_content(video_id).read()
            assert downloaded[video_id] == _direct_content(server, inner)

        # 4. New creates while the victim is down: every one lands on a live server, no error reaches
        # the client (which does not retry here: the proxy does).
        live = {FleetServer(s.url).deployment_id for s in servers[:2]}
        no_retries = proxy_client(proxy, max_retries=0)
        later = []
        for index in range(7, 11):
            video = _create(no_retries, index)
            assert decode_video_id_with_provider(video.id)["deployment_id"] in live
            later.append(video)
            assert wait_finished(client, video.id, timeout=120).status == "completed"
            server, inner = holder(video.id)
            downloaded[video.id] = client.videos.download_content(video.id).read()
            assert downloaded[video.id] == _direct_content(server, inner)

        # 5. The victim restarts on its port with its queue: its interrupted job runs again, and
        # both of its jobs complete and are fetched through the proxy under their first ids.
        victim.extra_args += ["--port", str(victim_port)]
        victim.start()
        for video_id in victim_jobs:
            assert wait_finished(client, video_id, timeout=120).status == "completed"
            downloaded[video_id] = client.videos.download_content(video_id).read()
            assert downloaded[video_id] == _direct_content(victim, placed[video_id][1])

        # Nothing lost, nothing fetched twice: ten jobs, ten different complete clips.
        assert sorted(downloaded) == sorted([v.id for v in videos] + [v.id for v in later])
        assert len(set(downloaded.values())) == 10
        assert all(mp4_frame_count(data) > 0 for data in downloaded.values())
        assert sum(len(server_job_ids(server)) for server in servers) == 10
    finally:
        if proxy is not None:
            proxy.stop()
        for server in servers:
            server.stop()
