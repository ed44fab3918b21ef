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
    with ServerProcess(tmp_path / "data", model, tmp_path / "logs", engine="oneshot", env=env,
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
    with ServerProcess(tmp_path / "data", model, tmp_path / "logs", engine="oneshot", env=env,
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
