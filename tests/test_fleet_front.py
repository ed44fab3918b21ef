"""A fleet's front for real on loopback (issue 32): `h3bridge serve --server URL ...` in front of three
`h3bridge serve` (one-shot engine over h3-sim), driven by the stock `openai` client with its default
retries, every status code it saw recorded by an httpx event hook.

What keeps these free of timing: every backend's h3-sim holds each job at its FFmpeg step until the
test releases that one job (H3_SIM_HOLD_ONCE: a release file per job, consumed as the job goes on).
The test releases a held job only on a server that has run no more jobs than any other live one
(or when nothing waits on the front any more), so the servers run their shares in lockstep
whatever the machine's load: a server that the front left idle while jobs wait would stall the
batch (the safety-net timeout), never pass by luck. What each server ran is counted from its own
job list, never from the front."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fleet_helpers import start_front
from remote_helpers import KEY, ServerProcess, start_server
from server_helpers import model  # noqa: F401  (a fixture)

HOLD_PHASE = "FFmpeg:0"       # every job reports it once, before its clip is published
JOBS = 20
BATCH_TIMEOUT = 240.0         # a safety net on a loaded machine, not an expected time


@dataclass
class Gated:
    """One backend whose every job waits at HOLD_PHASE for a release of its own."""

    server: ServerProcess
    notice: Path
    release: Path
    released: int = 0
    alive: bool = True

    def holding(self) -> bool:
        return self.notice.exists()

    def let_one_go(self) -> None:
        # the notice first: the next job of this server makes a new one only after this release
        self.notice.unlink()
        self.release.write_text("go\n")
        self.released += 1


def start_gated(root: Path, model_dir: Path, name: str, *extra_args: str) -> Gated:
    folder = root / name
    notice, release = folder / "held", folder / "release"
    env = {"H3_SIM_HOLD_PHASE": HOLD_PHASE, "H3_SIM_HOLD_NOTICE": str(notice), "H3_SIM_HOLD_RELEASE": str(release),
           "H3_SIM_HOLD_ONCE": "1"}
    return Gated(start_server(folder, model_dir, extra_env=env, extra_args=extra_args), notice, release)


def backend_jobs(server: ServerProcess) -> list[dict]:
    """The jobs a server holds, from its own list."""
    response = httpx.get(f"{server.url}/v1/videos", params={"limit": 100, "order": "asc"},
                         headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    response.raise_for_status()
    return response.json()["data"]


def front_jobs(front: ServerProcess) -> list[dict]:
    response = httpx.get(f"{front.url}/v1/videos", params={"limit": 100, "order": "asc"},
                         headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    response.raise_for_status()
    return response.json()["data"]


def stock_client(front: ServerProcess, statuses: list[int]):
    """The official client with its default retries; every HTTP status it receives is recorded."""
    import warnings

    import openai
    warnings.filterwarnings("ignore", message="The Sora API", category=DeprecationWarning)
    http = httpx.Client(event_hooks={"response": [lambda response: statuses.append(response.status_code)]},
                        timeout=60)
    return openai.OpenAI(base_url=front.api, api_key=KEY, http_client=http)


def create(client, index: int):
    return client.videos.create(model="MiniMax-H3", prompt=f"shot {index}: a red fox runs through snow",
                                size="96x64", seconds="1", extra_body={"num_inference_steps": 2, "seed": 100 + index})


def run_gated(front: ServerProcess, gated: list[Gated], expected: int, *, on_step=None) -> list[dict]:
    """Release held jobs, the least-served live server first, until the front has `expected`
    finished jobs; `on_step()` is called each turn (the test acts on the fleet there)."""
    deadline = time.monotonic() + BATCH_TIMEOUT
    while True:
        jobs = front_jobs(front)
        if sum(job["status"] in ("completed", "failed") for job in jobs) == expected:
            return jobs
        assert time.monotonic() < deadline, f"the batch stalled: {[job['status'] for job in jobs]}"
        if on_step is not None:
            on_step(jobs)
        live = [g for g in gated if g.alive]
        least = min(g.released for g in live)
        nothing_waits = not any(job["status"] == "queued" for job in jobs)
        for g in live:
            if g.holding() and (g.released == least or nothing_waits):
                g.let_one_go()
        time.sleep(0.02)


def follow_one_through_the_front(front: ServerProcess, output: Path, phases: list[str]) -> bool:
    """One job with RemoteEngine against the front: True if it followed the event stream."""
    from h3bridge import GenerationRequest, RemoteEngine
    with RemoteEngine(front.url, api_key=KEY, poll_interval=0.05) as engine:
        engine.generate(GenerationRequest("followed through the front", width=96, height=64, frames=22, steps=2),
                        output, want_frames=False, want_audio=False, on_progress=lambda event: phases.append(event.phase))
        assert output.is_file()
        return bool(engine._events_offered)


def prompts_run(servers: list[ServerProcess]) -> list[str]:
    return [job["prompt"] for server in servers for job in backend_jobs(server)]


def test_the_stock_client_batch_of_twenty_is_accepted_and_spread_over_three_servers(
        tmp_path: Path, model: Path) -> None:  # noqa: F811
    gated = [start_gated(tmp_path, model, f"server-{index}") for index in range(3)]
    front = None
    try:
        front = start_front(tmp_path / "front", model, [g.server.url for g in gated])
        statuses: list[int] = []
        client = stock_client(front, statuses)
        videos = [create(client, index) for index in range(JOBS)]
        assert len({video.id for video in videos}) == JOBS
        # the front holds the batch; what waits for a server is `queued`
        assert all(video.status in ("queued", "in_progress") for video in videos)
        assert sum(job["status"] == "queued" for job in front_jobs(front)) >= JOBS - len(gated)

        # one more job, followed by RemoteEngine through the front's event stream
        phases: list[str] = []
        with ThreadPoolExecutor(1) as pool:
            followed = pool.submit(follow_one_through_the_front, front, tmp_path / "followed.mp4", phases)
            jobs = run_gated(front, gated, JOBS + 1)
            assert followed.result() is True, "RemoteEngine polled: the front offered no event stream"
        assert "FFmpeg" in phases      # the server's own phase, passed on by the front as it happened
        assert [job["status"] for job in jobs] == ["completed"] * (JOBS + 1)
        ran = [len(backend_jobs(g.server)) for g in gated]
        assert all(count >= 5 for count in ran) and sum(ran) == JOBS + 1, ran
        # each job ran once: 21 different prompts over the servers' own lists, all completed
        assert sorted(prompts_run([g.server for g in gated])) == sorted(
            [f"shot {i}: a red fox runs through snow" for i in range(JOBS)] + ["followed through the front"])
        assert all(job["status"] == "completed" for g in gated for job in backend_jobs(g.server))
        # content through the front is the clip the server rendered
        first = client.videos.download_content(videos[0].id).read()
        assert first[4:8] == b"ftyp" and len(first) > 1000
        assert 429 not in statuses and all(status < 400 for status in statuses), sorted(set(statuses))
    finally:
        if front is not None:
            front.stop()
        for g in gated:
            g.server.stop()


def test_a_server_killed_mid_batch_fails_its_one_job_and_a_server_added_takes_waiting_jobs(
        tmp_path: Path, model: Path) -> None:  # noqa: F811
    gated = [start_gated(tmp_path, model, f"server-{index}") for index in range(3)]
    servers_file = tmp_path / "servers.txt"
    servers_file.write_text("".join(f"{g.server.url}\n" for g in gated))
    victim = gated[2]
    killed: dict = {}
    front = None
    try:
        front = start_front(tmp_path / "front", model, [], servers_file=servers_file)
        statuses: list[int] = []
        client = stock_client(front, statuses)
        videos = [create(client, index) for index in range(JOBS)]

        def act(jobs: list[dict]) -> None:
            # After every server has run two jobs: kill one while it holds its third, and add a
            # fourth server while jobs wait (the other two hold theirs until the new one has run one).
            if victim.alive and victim.released == 2 and victim.holding() and all(g.released >= 2 for g in gated):
                its_jobs = backend_jobs(victim.server)
                held = [job for job in its_jobs if job["status"] == "in_progress"]
                assert len(held) == 1 and len(its_jobs) == 3, its_jobs
                killed["prompt"] = held[0]["prompt"]
                killed["ran"] = [job["prompt"] for job in its_jobs]
                victim.server.kill()
                victim.alive = False
                added = start_gated(tmp_path, model, "server-added")
                gated.append(added)
                with servers_file.open("a") as handle:
                    handle.write(f"{added.server.url}\n")

        jobs = run_gated(front, gated, JOBS, on_step=act)
        assert killed, "the victim was never killed"
        failed = [job for job in jobs if job["status"] == "failed"]
        assert len(failed) == 1 and failed[0]["prompt"] == killed["prompt"], failed
        assert "went away while it held this job" in failed[0]["error"]["message"]
        assert failed[0]["error"]["hint"].startswith("submit it again")
        assert sum(job["status"] == "completed" for job in jobs) == JOBS - 1
        added = gated[3]
        assert len(backend_jobs(added.server)) >= 1, "the server added while jobs waited took none"
        # none lost, none run twice: the servers' own records hold each prompt exactly once
        live = [g.server for g in gated if g.alive]
        run_live = prompts_run(live)
        assert len(run_live) == len(set(run_live)) == JOBS - 1 - 2     # the victim ran 2 and held its 3rd
        assert killed["prompt"] not in run_live
        every = [f"shot {i}: a red fox runs through snow" for i in range(JOBS)]
        assert len(killed["ran"]) == 3 and killed["prompt"] in killed["ran"]
        assert sorted(run_live + killed["ran"]) == sorted(every)
        assert 429 not in statuses and all(status < 400 for status in statuses), sorted(set(statuses))
        assert [v.id for v in videos] == [job["id"] for job in jobs]
    finally:
        if front is not None:
            front.stop()
        for g in gated:
            g.server.stop()


def test_the_front_killed_and_restarted_loses_no_job_and_renders_none_twice(tmp_path: Path, model: Path) -> None:  # noqa: F811
    gated = [start_gated(tmp_path, model, f"server-{index}") for index in range(2)]
    front = None
    try:
        front = start_front(tmp_path / "front", model, [g.server.url for g in gated])
        statuses: list[int] = []
        videos = [create(stock_client(front, statuses), index) for index in range(5)]
        while not all(g.holding() for g in gated):      # each server holds one job mid-render
            time.sleep(0.02)
        front.kill()
        front.start()          # the same data directory (a new port: the client is pointed at it again)
        jobs = front_jobs(front)
        assert [job["id"] for job in jobs] == [video.id for video in videos]
        assert all(job["status"] in ("queued", "in_progress") for job in jobs)

        # the first job, held on a server since before the restart, deleted through the front: gone there too
        client = stock_client(front, statuses)
        assert client.videos.delete(videos[0].id).deleted
        assert videos[0].prompt not in prompts_run([g.server for g in gated])
        jobs = run_gated(front, gated, len(videos) - 1)
        assert [job["id"] for job in jobs] == [video.id for video in videos[1:]]
        assert [job["status"] for job in jobs] == ["completed"] * (len(videos) - 1)
        # the other job the servers were rendering when the front died was followed there again
        ran = prompts_run([g.server for g in gated])
        assert sorted(ran) == sorted(f"shot {i}: a red fox runs through snow" for i in range(1, len(videos)))
        assert all(job["status"] == "completed" for g in gated for job in backend_jobs(g.server))
        assert client.videos.download_content(videos[1].id).read()[4:8] == b"ftyp"
        assert 429 not in statuses and all(status < 400 for status in statuses), sorted(set(statuses))
    finally:
        if front is not None:
            front.stop()
        for g in gated:
            g.server.stop()


def test_the_servers_file_is_read_one_url_a_line_and_a_bad_line_is_named(tmp_path: Path) -> None:
    from h3bridge.errors import RequestError
    from h3bridge.fleet.front import read_servers_file

    listed = tmp_path / "servers.txt"
    listed.write_text("# the studio's Macs\nhttp://mac1.local:8765/\n\nhttp://mac2.local:8765/v1  # upstairs\n"
                      "http://mac1.local:8765\n")
    assert read_servers_file(listed) == ["http://mac1.local:8765", "http://mac2.local:8765"]
    listed.write_text("http://mac1.local:8765\nmac2 upstairs\n")
    with pytest.raises(RequestError) as refused:
        read_servers_file(listed)
    assert f"--servers-file {listed} line 2:" in refused.value.message
    assert refused.value.hint == "write one server's base URL a line, e.g. http://mac1.local:8765"
    with pytest.raises(RequestError) as missing:
        read_servers_file(tmp_path / "none.txt")
    assert "cannot read it" in missing.value.message and missing.value.field == "--servers-file"


def test_a_server_full_of_other_clients_jobs_gives_the_job_back_and_another_runs_it(
        tmp_path: Path, model: Path) -> None:  # noqa: F811
    busy = start_gated(tmp_path, model, "busy", "--max-queued", "1")
    free = start_gated(tmp_path, model, "free")
    front = None
    try:
        # another client fills the busy server: one job held mid-render, one waiting behind it
        for index in range(2):
            httpx.post(f"{busy.server.url}/v1/videos", json={"prompt": f"someone else's job {index}", "size": "96x64",
                                                             "seconds": "1", "num_inference_steps": 2},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=30).raise_for_status()
        while not busy.holding():
            time.sleep(0.02)
        front = start_front(tmp_path / "front", model, [busy.server.url, free.server.url])
        statuses: list[int] = []
        video = create(stock_client(front, statuses), 0)
        busy.alive = False          # never released: only the free server can run the front's job
        jobs = run_gated(front, [busy, free], 1)
        assert jobs[0]["id"] == video.id and jobs[0]["status"] == "completed"
        assert [job["prompt"] for job in backend_jobs(free.server)] == [video.prompt]
        # the busy server's 429s queued nothing there
        assert sorted(job["prompt"] for job in backend_jobs(busy.server)) == ["someone else's job 0",
                                                                              "someone else's job 1"]
        assert 429 not in statuses
    finally:
        if front is not None:
            front.stop()
        for g in (busy, free):
            g.server.stop()
