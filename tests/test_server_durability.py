"""The durable queue: `h3bridge serve` SIGKILLed at random (seeded) moments with 10 jobs submitted,
and restarted, in 10 trials. Every accepted job ends completed or failed with a reason; none is
lost; none is run again once its clip was finished; a download is always the whole clip.

The one-shot engine runs each job in its own h3-sim process, so H3_SIM_LOG (one line per engine
run, with its start time and the job's output folder in its argv) counts engine runs per job.
The kill moments are random on purpose: the properties hold whichever moment it is."""
from __future__ import annotations

import random
import threading
from pathlib import Path

import httpx
import pytest

from h3bridge.server.jobs import MAX_ATTEMPTS

from core_helpers import sim_invocations, wait_until
from server_helpers import KEY, ServerProcess, isolated_env, model, mp4_frame_count  # noqa: F401  (model: a fixture)

JOBS = 10
FRAMES = 22
BODY = {"prompt": "a red fox runs through snow", "size": "96x64", "num_frames": FRAMES, "steps": 2}
HEADERS = {"Authorization": f"Bearer {KEY}"}
POLL = 0.1      # seconds between two looks at the queue (each is a request the server answers)


class ContentWatcher(threading.Thread):
    """Downloads every accepted job's content over and over while the trial runs: each answer
    must be 409 (not ready) or the whole clip, never part of one."""

    def __init__(self, server: ServerProcess, ids: list[str]) -> None:
        super().__init__(daemon=True)
        self.server, self.ids = server, ids
        self.stopping = threading.Event()
        self.served: list[tuple[str, int]] = []      # (id, frames) of each 200
        self.unexpected: list[str] = []

    def run(self) -> None:
        with httpx.Client(headers=HEADERS, timeout=30) as client:
            while not self.stopping.is_set():
                for video_id in list(self.ids):
                    url = self.server.url
                    if not url:
                        continue
                    try:
                        response = client.get(f"{url}/v1/videos/{video_id}/content")
                    except httpx.TransportError:
                        continue         # killed under us
                    if response.status_code == 200:
                        self.served.append((video_id, mp4_frame_count(response.content)))
                    elif response.status_code != 409:
                        self.unexpected.append(f"{video_id}: {response.status_code} {response.text[:200]}")
                self.stopping.wait(0.05)


def statuses(server: ServerProcess, client: httpx.Client) -> dict[str, dict]:
    # One client per trial: a new one per poll reads the CA bundle again each time (~70 ms of CPU,
    # at every 10 ms poll), which starved the server and the engines the trial waits for.
    response = client.get(f"{server.api}/videos", params={"limit": 100}, headers=HEADERS, timeout=30)
    response.raise_for_status()
    return {video["id"]: video for video in response.json()["data"]}


@pytest.mark.parametrize("seed", range(10))
def test_a_killed_server_loses_no_job_and_reruns_none_that_finished(seed: int, tmp_path: Path, model: Path) -> None:  # noqa: F811
    rng = random.Random(seed)
    env = isolated_env(tmp_path)
    log = Path(env["H3_SIM_LOG"])
    server = ServerProcess(tmp_path / "data", model, tmp_path / "logs", engine="one-shot", env=env).start()
    accepted: list[str] = []
    watcher = ContentWatcher(server, accepted)
    watcher.start()
    try:
        with httpx.Client(headers=HEADERS, timeout=30) as client:
            for index in range(JOBS):
                response = client.post(f"{server.api}/videos", json=BODY | {"seed": index})
                assert response.status_code == 200, response.text
                accepted.append(response.json()["id"])
            kills = 1 + (seed % 2)             # odd seeds: killed twice
            for _ in range(kills):
                # A random moment while the queue runs: some jobs done, one maybe mid-render.
                done_before = rng.randint(0, JOBS - 1)
                wait_until(lambda: sum(v["status"] == "completed" for v in statuses(server, client).values())
                           >= done_before, timeout=60, interval=POLL)
                threading.Event().wait(rng.uniform(0.0, 0.6))
                server.kill()
                server.start()
            assert wait_until(lambda: all(v["status"] in ("completed", "failed")
                                          for v in statuses(server, client).values()),
                              timeout=120, interval=POLL), statuses(server, client)
            final = statuses(server, client)
    finally:
        watcher.stopping.set()
        watcher.join(30)
        server.stop()

    # None lost: every accepted job is there, finished.
    assert set(accepted) <= set(final)
    runs = {video_id: [record for record in sim_invocations(log) if video_id in " ".join(record["argv"])]
            for video_id in accepted}
    for video_id in accepted:
        video = final[video_id]
        if video["status"] == "failed":
            assert video["error"]["code"] == "interrupted" and video["error"]["message"], video
            continue
        assert video["status"] == "completed", video
        clip = tmp_path / "data" / "jobs" / video_id / "video.mp4"
        assert mp4_frame_count(clip.read_bytes()) == FRAMES
        # Run at most MAX_ATTEMPTS times, and never again once the clip was finished.
        assert 1 <= len(runs[video_id]) <= MAX_ATTEMPTS, runs[video_id]
        finished_at = clip.stat().st_mtime
        assert all(run["time"] <= finished_at for run in runs[video_id]), (video_id, runs[video_id], finished_at)
    # Nothing partial was ever served, and every answer was a designed one.
    assert watcher.unexpected == []
    assert all(frames == FRAMES for _, frames in watcher.served)


def test_a_second_server_on_the_same_data_directory_is_refused(tmp_path: Path, model: Path) -> None:  # noqa: F811
    """Two servers sharing one queue would both run its jobs, and the second's recovery would take
    the first's running job for an interrupted one: the second exits 2 naming the directory, the
    first goes on, and once it stops the directory is free again."""
    data_dir = tmp_path / "data"
    first = ServerProcess(data_dir, model, tmp_path / "logs-first", engine="one-shot", env=isolated_env(tmp_path / "a"))
    second = ServerProcess(data_dir, model, tmp_path / "logs-second", engine="one-shot", env=isolated_env(tmp_path / "b"))
    with first:
        try:
            with pytest.raises(AssertionError, match="exited 2") as refused:
                second.start()
        finally:
            second.stop()       # if it did start (the old code), it must not outlive the test
        assert f"another h3bridge serve is using the data directory {data_dir.resolve()}" in str(refused.value)
        assert "--data-dir" in str(refused.value)
        with httpx.Client(headers=HEADERS, timeout=30) as client:
            response = client.post(f"{first.api}/videos", json=BODY)
            assert response.status_code == 200, response.text
            video_id = response.json()["id"]
            assert wait_until(lambda: statuses(first, client)[video_id]["status"] in ("completed", "failed"),
                              timeout=120, interval=POLL)
            assert statuses(first, client)[video_id]["status"] == "completed", statuses(first, client)[video_id]
    with second, httpx.Client(headers=HEADERS, timeout=30) as client:
        assert statuses(second, client)[video_id]["status"] == "completed"
