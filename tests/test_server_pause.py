"""Issue 31: POST /v1/videos/{id}/pause and /resume on `h3bridge serve`.

A running job pauses (status `paused`; its engine's process group is stopped where it is, its CPU
time does not advance, the jobs queued behind it wait; the event stream says so) and resumes to
the clip an unpaused run makes. A job that is not running cannot be paused: 409 in the job's own
dialect, with the fix. RemoteEngine pauses its server job through the same endpoints.

The refusals run on the app alone (TestClient, no worker); the pauses on a live server in this
process (test_server_events.serving) over the one-shot engine on h3-sim."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from fastapi.testclient import TestClient

from core_helpers import fast_request, isolated_home, model_dir, sim_engine_path, sim_invocations  # noqa: F401
from fleet_helpers import start_front
from remote_helpers import start_server
from server_helpers import KEY
from story_helpers import decode_film
from test_server_events import AUTH, WAIT, read_stream, serving, submit

from h3bridge import CancelToken, PauseControl, RemoteEngine
from h3bridge.engines.oneshot import OneShotEngine
from h3bridge.server.app import ServeSettings, create_app
from h3bridge.server.jobs import JobStore
from h3bridge.server.worker import Worker
from h3bridge.wire.videos import JobStatus, request_to_wire
from h3bridge.engines.groups import all_stopped

PEERS = Path(__file__).parent / "fixtures" / "peers"
SGLANG_T2VA = next(example["json"] for example in json.loads((PEERS / "sglang_requests.json").read_text())["examples"]
                   if example["name"] == "H3 t2va canonical")
NO_SUCH_JOB = "video_" + "0" * 32
LONG_PHASE = "load transformer core"     # h3-sim's longest phase for a small clip: caught mid-way


@pytest.fixture(autouse=True)
def _home(isolated_home: Path) -> None:
    """Every test here with its own HOME and cache."""


@pytest.fixture
def idle_app(tmp_path: Path):
    """The app with a worker that never starts: every accepted job stays queued."""
    store = JobStore(tmp_path / "data")
    app = create_app(ServeSettings(data_dir=tmp_path / "data", max_queued=None), store,
                     Worker(store, engine=None))  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, store
    store.close()


# ----------------------------------------------------------------------------- refusals

def test_a_queued_job_cannot_be_paused_and_says_what_to_do(idle_app) -> None:
    client, _ = idle_app
    job = client.post("/v1/videos", json=request_to_wire(fast_request()).fields).json()
    refused = client.post(f"/v1/videos/{job['id']}/pause")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "not_running" and error["param"] == "video_id"
    assert error["message"] == f"video {job['id']} is queued; only a running job can be paused"
    assert f"GET /v1/videos/{job['id']}" in error["hint"] and f"DELETE /v1/videos/{job['id']}" in error["hint"]
    resumed = client.post(f"/v1/videos/{job['id']}/resume")
    assert resumed.status_code == 409 and "can be resumed" in resumed.json()["error"]["message"]
    assert client.get(f"/v1/videos/{job['id']}").json()["status"] == "queued"      # nothing changed


def test_an_unknown_job_is_404(idle_app) -> None:
    client, _ = idle_app
    for action in ("pause", "resume"):
        answer = client.post(f"/v1/videos/{NO_SUCH_JOB}/{action}")
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"


def test_refusals_are_in_the_jobs_dialect(idle_app) -> None:
    """A job sent in SGLang's shape hears SGLang's error shape ({"detail": message} beside the object)."""
    client, _ = idle_app
    accepted = client.post("/v1/videos", json=SGLANG_T2VA)
    assert accepted.status_code == 200, accepted.text
    refused = client.post(f"/v1/videos/{accepted.json()['id']}/pause")
    assert refused.status_code == 409
    body = refused.json()
    assert body["detail"] == body["error"]["message"] and body["error"]["code"] == "not_running"


def test_a_paused_job_reads_paused_and_in_progress_to_the_peers(idle_app) -> None:
    """`paused` is h3bridge's own status; a peer's client (it knows the OpenAI four) reads in_progress."""
    client, store = idle_app
    ours = client.post("/v1/videos", json=request_to_wire(fast_request()).fields).json()["id"]
    peers = client.post("/v1/videos", json=SGLANG_T2VA).json()["id"]
    for job_id in (ours, peers):
        assert store.start(job_id) and store.set_paused(job_id, True)
    assert client.get(f"/v1/videos/{ours}").json()["status"] == "paused"
    assert client.get(f"/v1/videos/{peers}").json()["status"] == "in_progress"
    assert not store.set_paused(ours, True)          # paused already: no change
    assert store.set_paused(ours, False) and store.get(ours).status is JobStatus.IN_PROGRESS


def test_a_paused_job_is_run_again_after_a_restart(tmp_path: Path) -> None:
    """The server stopped (or died) with a job paused: recover queues it again, as a running one."""
    store = JobStore(tmp_path / "data")
    job_id = "video_" + "1" * 32
    store.inputs_dir(job_id).mkdir(parents=True)
    store.add(job_id, model="m", fields=request_to_wire(fast_request()).fields, uploads=[], shape={})
    assert store.start(job_id) and store.set_paused(job_id, True)
    store.close()
    store = JobStore(tmp_path / "data")
    try:
        notes = store.recover()
        assert store.get(job_id).status is JobStatus.QUEUED and "queued to run again" in notes[0]
    finally:
        store.close()


# ----------------------------------------------------------------------------- live pauses

def _wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _group(pid: int) -> list[psutil.Process]:
    engine = psutil.Process(pid)
    return [engine, *engine.children(recursive=True)]


def _cpu(processes: list[psutil.Process]) -> float:
    return sum(sum(process.cpu_times()[:2]) for process in processes)


@pytest.fixture
def slow_sim(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """h3-sim slow enough to be caught mid-job (its phases sleep), logging each engine's pid."""
    monkeypatch.setenv("H3_SIM_TIME_SCALE", "0.05")
    log = tmp_path / "sim-log.jsonl"
    monkeypatch.setenv("H3_SIM_LOG", str(log))
    return log


def test_pause_stops_the_engine_queued_jobs_wait_and_resume_finishes_the_same_clip(
        tmp_path: Path, model_dir: Path, slow_sim: Path) -> None:
    request = fast_request(steps=8)
    with OneShotEngine(sim_engine_path(), model_dir) as engine:
        reference = engine.generate(request, tmp_path / "reference.mp4", want_frames=False)
    engines_before = len(sim_invocations(slow_sim))
    with serving(tmp_path / "data", OneShotEngine(sim_engine_path(), model_dir), start=False) as served:
        first = submit(served.url, request)
        second = submit(served.url, fast_request(prompt="the second job"))
        events: list = []
        reader = threading.Thread(target=lambda: events.extend(read_stream(served.url, first)), daemon=True)
        reader.start()
        served.start_when_watched()
        job = lambda: httpx.get(f"{served.url}/v1/videos/{first}", headers=AUTH, timeout=30).json()  # noqa: E731
        _wait_for(lambda: job().get("phase") == LONG_PHASE, "the job never reached its DiT load")
        paused = httpx.post(f"{served.url}/v1/videos/{first}/pause", headers=AUTH, timeout=30)
        assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text
        pid = sim_invocations(slow_sim)[engines_before]["pid"]
        group = _wait_for(lambda: (g := _group(pid)) and all_stopped(g) and g,
                          "the engine's group was never stopped")
        cpu, progress = _cpu(group), job()["progress"]
        time.sleep(2.0)      # longer than the whole job's sleeps at this time scale: it would have finished
        assert _cpu(group) == cpu, "the paused engine used CPU"
        assert job()["status"] == "paused" and job()["progress"] == progress
        assert httpx.get(f"{served.url}/v1/videos/{second}", headers=AUTH, timeout=30).json()["status"] == "queued"
        again = httpx.post(f"{served.url}/v1/videos/{first}/pause", headers=AUTH, timeout=30)
        assert again.status_code == 200 and again.json()["status"] == "paused"       # no change
        resumed = httpx.post(f"{served.url}/v1/videos/{first}/resume", headers=AUTH, timeout=30)
        assert resumed.status_code == 200 and resumed.json()["status"] == "in_progress", resumed.text
        _wait_for(lambda: httpx.get(f"{served.url}/v1/videos/{second}", headers=AUTH, timeout=30)
                  .json()["status"] == "completed", "the queued job never ran")
        reader.join(WAIT)
        content = httpx.get(f"{served.url}/v1/videos/{first}/content", headers=AUTH, timeout=30)
        (tmp_path / "paused.mp4").write_bytes(content.content)
    frames, audio, _ = decode_film(tmp_path / "paused.mp4")
    expected_frames, expected_audio, _ = decode_film(reference.video_path)
    assert np.array_equal(frames, expected_frames) and np.array_equal(audio, expected_audio)
    kinds = [(event.event, json.loads(event.data).get("status")) for event in events]
    assert ("progress", "paused") in kinds, kinds
    after = kinds[kinds.index(("progress", "paused")) + 1:]
    assert ("progress", "in_progress") in after and kinds[-1] == ("end", "completed")
    pause_event = json.loads(events[kinds.index(("progress", "paused"))].data)
    assert pause_event["phase"] == "paused" and pause_event["eta"] is None


def test_delete_while_paused_stops_everything_and_leaves_nothing(tmp_path: Path, model_dir: Path,
                                                                 slow_sim: Path) -> None:
    with serving(tmp_path / "data", OneShotEngine(sim_engine_path(), model_dir)) as served:
        job_id = submit(served.url, fast_request(steps=8))
        _wait_for(lambda: httpx.get(f"{served.url}/v1/videos/{job_id}", headers=AUTH, timeout=30)
                  .json().get("phase") == LONG_PHASE, "the job never reached its DiT load")
        assert httpx.post(f"{served.url}/v1/videos/{job_id}/pause", headers=AUTH, timeout=30).status_code == 200
        pid = sim_invocations(slow_sim)[0]["pid"]
        deleted = httpx.delete(f"{served.url}/v1/videos/{job_id}", headers=AUTH, timeout=60)
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert not (tmp_path / "data" / "jobs" / job_id).exists()


def test_remote_engine_pauses_its_server_job(tmp_path: Path, model_dir: Path, slow_sim: Path) -> None:
    """RemoteEngine.generate(pause=...): pause() stops the server's engine (its job reads paused),
    resume() continues it; the clip arrives as usual."""
    with serving(tmp_path / "data", OneShotEngine(sim_engine_path(), model_dir)) as served:
        pause, cancel = PauseControl(), CancelToken()
        phases: list[str] = []
        remote = RemoteEngine(served.url, api_key=KEY)
        result: list = []
        thread = threading.Thread(target=lambda: result.append(remote.generate(
            fast_request(steps=8), tmp_path / "remote.mp4", want_frames=False, pause=pause, cancel=cancel,
            on_progress=lambda event: phases.append(event.phase))), daemon=True)
        thread.start()
        _wait_for(lambda: LONG_PHASE in phases, "the remote job never reached its DiT load")
        job_id = httpx.get(f"{served.url}/v1/videos", headers=AUTH, timeout=30).json()["data"][0]["id"]
        pause.pause()
        _wait_for(lambda: httpx.get(f"{served.url}/v1/videos/{job_id}", headers=AUTH, timeout=30)
                  .json()["status"] == "paused", "the server's job never paused")
        pid = sim_invocations(slow_sim)[0]["pid"]
        _wait_for(lambda: all_stopped(_group(pid)), "the server's engine group was never stopped")
        pause.resume()
        thread.join(WAIT)
        assert result and result[0].video_path == tmp_path / "remote.mp4" and result[0].video_path.is_file()
        remote.close()


def test_a_fleets_front_pauses_the_job_on_the_server_that_runs_it(tmp_path: Path, model_dir: Path) -> None:
    """POST .../pause on a front (`h3bridge serve --server URL`): the server running the job pauses
    it (its engine's group stopped, the job there reads paused), the front's job reads paused;
    resume goes on there and the front's job completes."""
    log = tmp_path / "sim-log.jsonl"
    server = start_server(tmp_path / "server", model_dir,
                          extra_env={"H3_SIM_TIME_SCALE": "0.05", "H3_SIM_LOG": str(log)})
    try:
        front = start_front(tmp_path / "front", model_dir, [server.url])
        try:
            job_id = submit(front.url, fast_request(steps=8))
            job = lambda url, name: httpx.get(f"{url}/v1/videos/{name}", headers=AUTH, timeout=30).json()  # noqa: E731
            _wait_for(lambda: job(front.url, job_id).get("phase") == LONG_PHASE,
                      "the job never reached its DiT load on the server")
            paused = httpx.post(f"{front.url}/v1/videos/{job_id}/pause", headers=AUTH, timeout=30)
            assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text
            server_job = httpx.get(f"{server.url}/v1/videos", headers=AUTH, timeout=30).json()["data"][0]["id"]
            _wait_for(lambda: job(server.url, server_job)["status"] == "paused", "the server's job never paused")
            _wait_for(lambda: (g := _group(sim_invocations(log)[0]["pid"]))
                      and all_stopped(g),
                      "the server's engine group was never stopped")
            assert job(front.url, job_id)["status"] == "paused"
            resumed = httpx.post(f"{front.url}/v1/videos/{job_id}/resume", headers=AUTH, timeout=30)
            assert resumed.status_code == 200 and resumed.json()["status"] == "in_progress", resumed.text
            _wait_for(lambda: job(front.url, job_id)["status"] == "completed", "the job never completed")
        finally:
            front.stop()
    finally:
        server.stop()
