"""`h3bridge serve --max-queued N`: a server holding its running job and N waiting ones refuses the next
submission with HTTP 429 and Retry-After (what LiteLLM's router needs to send it to another server),
before reading its body, and takes submissions again once a place is free.

The jobs are kept unfinished without timing: the test holds the server's engine lock (its own
H3BRIDGE_LOCK_PATH), so the worker waits for the engine and no job can finish until it lets go."""
from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from h3bridge.engines.lock import engine_lock
from h3bridge.server.jobs import QUEUE_FULL_RETRY_AFTER
from server_helpers import (  # noqa: F401  (model: a fixture)
    KEY,
    ServerProcess,
    h3bridge_program,
    isolated_env,
    model,
    openai_client,
    wait_finished,
)

AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"prompt": "a red fox runs through snow", "size": "96x64", "num_frames": 22, "num_inference_steps": 2}


def _submit(server: ServerProcess, **extra: object) -> httpx.Response:
    return httpx.post(f"{server.api}/videos", json={**BODY, **extra}, headers=AUTH, timeout=60)


def test_a_full_queue_answers_429_with_retry_after_and_takes_jobs_again_when_a_place_frees(
        tmp_path: Path, model: Path) -> None:  # noqa: F811
    env = isolated_env(tmp_path)
    with ServerProcess(tmp_path / "data", model, tmp_path / "logs", engine="one-shot", env=env,
                       extra_args=["--max-queued", "1"]) as server:
        with engine_lock(path=Path(env["H3BRIDGE_LOCK_PATH"])):
            first, second = _submit(server, seed=1), _submit(server, seed=2)
            assert first.status_code == 200 and second.status_code == 200, (first.text, second.text)
            # a multipart body with a file, as the official client and LiteLLM send it: refused
            # before its upload is kept anywhere
            full = httpx.post(f"{server.api}/videos", data={"prompt": "one more", "size": "96x64"},
                              files={"input_reference": ("frame.png", b"\x89PNG not read", "image/png")},
                              headers=AUTH, timeout=60)
            assert full.status_code == 429, full.text
            assert full.headers["retry-after"] == str(QUEUE_FULL_RETRY_AFTER)
            error = full.json()["error"]
            assert error["code"] == "queue_full" and error["type"] == "rate_limit_error"
            assert "--max-queued is 1" in error["message"] and error["hint"]
            listed = httpx.get(f"{server.api}/videos", headers=AUTH, timeout=30).json()["data"]
            assert sorted(job["id"] for job in listed) == sorted([first.json()["id"], second.json()["id"]])
            # nothing of the refused one was kept (a JSON job without files has no folder yet)
            assert {p.name for p in (tmp_path / "data" / "jobs").iterdir()} <= {j["id"] for j in listed}
        client = openai_client(server, KEY)
        for job in (first.json(), second.json()):
            assert wait_finished(client, job["id"]).status == "completed"
        third = _submit(server, seed=3)
        assert third.status_code == 200, third.text
        assert wait_finished(client, third.json()["id"]).status == "completed"


def test_concurrent_submissions_never_take_more_places_than_there_are(tmp_path: Path, model: Path) -> None:  # noqa: F811
    from concurrent.futures import ThreadPoolExecutor
    env = isolated_env(tmp_path)
    with ServerProcess(tmp_path / "data", model, tmp_path / "logs", engine="one-shot", env=env,
                       extra_args=["--max-queued", "2"]) as server:
        with engine_lock(path=Path(env["H3BRIDGE_LOCK_PATH"])):
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda seed: _submit(server, seed=seed), range(8)))
            codes = sorted(answer.status_code for answer in answers)
            assert codes == [200] * 3 + [429] * 5, [a.text for a in answers]
            listed = httpx.get(f"{server.api}/videos", headers=AUTH, timeout=30).json()["data"]
            assert len(listed) == 3


def test_max_queued_refuses_a_bad_value_naming_the_flag(tmp_path: Path, model: Path) -> None:  # noqa: F811
    done = subprocess.run([h3bridge_program(), "serve", "--max-queued", "-3", "--model-dir", str(model),
                           "--data-dir", str(tmp_path / "data")], capture_output=True, text=True, timeout=120,
                          env={**isolated_env(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 2
    assert "--max-queued" in done.stderr and "'-3' is not a whole number >= 0" in done.stderr


def _hold_full_then_render(tmp_path: Path, model: Path, *, cancel_while_full: bool):  # noqa: F811
    """A server with --max-queued 1 whose engine the test holds: two jobs fill it, then
    RemoteEngine submits a third. Its first answers are 429 for as long as the lock is held (no
    timing involved): the engine waits, reporting it, until the test cancels or lets go."""
    import threading

    from h3bridge import GenerationRequest, RemoteEngine
    from h3bridge.cancel import CancelToken
    from h3bridge.engines.remote import FULL_SERVER_PHASE

    env = isolated_env(tmp_path)
    outcome: dict[str, object] = {}
    waiting = threading.Event()
    phases: list[str] = []
    cancel = CancelToken()

    def on_progress(event) -> None:
        phases.append(event.phase)
        if event.phase == FULL_SERVER_PHASE:
            waiting.set()

    with ServerProcess(tmp_path / "data", model, tmp_path / "logs", engine="one-shot", env=env,
                       extra_args=["--max-queued", "1"]) as server:
        lock = engine_lock(path=Path(env["H3BRIDGE_LOCK_PATH"]))
        lock.__enter__()
        try:
            filled = [_submit(server, seed=seed) for seed in (1, 2)]
            assert [answer.status_code for answer in filled] == [200, 200], [a.text for a in filled]
            engine = RemoteEngine(server.url, api_key=KEY, poll_interval=0.05)

            def render() -> None:
                try:
                    outcome["result"] = engine.generate(
                        GenerationRequest("a third fox", width=96, height=64, frames=22, steps=2, seed=3),
                        tmp_path / "third.mp4", on_progress=on_progress, cancel=cancel)
                except BaseException as error:     # noqa: BLE001 - handed to the test thread
                    outcome["error"] = error

            thread = threading.Thread(target=render, daemon=True)
            thread.start()
            assert waiting.wait(120), f"RemoteEngine never reported the full queue: {phases} {outcome}"
            if cancel_while_full:
                cancel.cancel()
                thread.join(60)
        finally:
            lock.__exit__(None, None, None)
        thread.join(180)
        assert not thread.is_alive(), "the render did not end"
        listed = httpx.get(f"{server.api}/videos", headers=AUTH, timeout=30).json()["data"]
        return outcome, listed, phases


def test_remote_engine_submits_again_after_retry_after_while_the_queue_is_full(
        tmp_path: Path, model: Path) -> None:  # noqa: F811
    """RemoteEngine used to fail the job with the server's 429 (a --parallel story over more shots
    than a server's queue, or a proxy's burst, lost shots). Now it waits Retry-After, reports the
    wait as progress, submits again, and the job is queued exactly once."""
    outcome, listed, phases = _hold_full_then_render(tmp_path, model, cancel_while_full=False)
    assert "error" not in outcome, outcome.get("error")
    assert (tmp_path / "third.mp4").is_file()
    assert len(listed) == 3, [job["id"] for job in listed]      # the 429s queued nothing twice
    assert phases.index("waiting for room in the server's queue") < len(phases) - 1


def test_a_cancel_while_the_queue_is_full_stops_at_once_and_queues_nothing(tmp_path: Path, model: Path) -> None:  # noqa: F811
    from h3bridge.errors import GenerationCancelled
    outcome, listed, _ = _hold_full_then_render(tmp_path, model, cancel_while_full=True)
    assert isinstance(outcome.get("error"), GenerationCancelled), outcome
    assert "queue was full" in str(outcome["error"])
    assert len(listed) == 2 and not (tmp_path / "third.mp4").exists()


def test_a_server_full_for_longer_than_full_server_wait_fails_the_job_naming_the_fixes() -> None:
    from h3bridge import GenerationRequest, RemoteEngine
    from h3bridge.errors import RemoteError
    asked: list[str] = []

    def always_full(request: httpx.Request) -> httpx.Response:
        asked.append(request.method)
        return httpx.Response(429, headers={"Retry-After": "0.2"},
                              json={"error": {"code": "queue_full", "message": "the queue is full"}})

    engine = RemoteEngine("http://studio.test:8765", transport=httpx.MockTransport(always_full),
                          full_server_wait=0.5)
    try:
        engine.generate(GenerationRequest("a fox", width=96, height=64, frames=22, steps=2), None,
                        want_frames=False, want_audio=False)
    except RemoteError as error:
        assert error.status == 429 and "queue is full" in error.message
        assert "--max-queued" in error.hint and "full_server_wait" in error.hint
    else:
        raise AssertionError("a server that is always full must fail the job")
    assert asked == ["POST"] * 3      # 0.2 s apart, within 0.5 s: three tries, no poll, no DELETE
