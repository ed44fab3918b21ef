"""Issue 31: the ComfyUI Pause/Resume control's server side (h3bridge/comfy/pause.py), without
ComfyUI: the running jobs' registry, the answers of its routes (registered on an aiohttp app as
PromptServer's routes are), and the broadcast the frontend (web/h3_pause.js) follows. The node in
ComfyUI itself is in tests/test_comfy_integration.py's bed."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import threading

from h3bridge.comfy.pause import (PAUSE_ROUTE, RESUME_ROUTE, STATE_EVENT, STOP_AFTER_SHOT_ROUTE, RunningJobs,
                                  pause_answer, register_pause_routes, stop_after_shot_answer)

IDLE = {"running": [], "paused": False, "stoppable": [], "stopping": False}

WEB = Path(__file__).parents[1] / "h3bridge" / "comfy" / "web"


def test_pausing_with_no_job_running_says_so() -> None:
    status, body = pause_answer(RunningJobs(), True)
    assert status == 409 and {key: body[key] for key in IDLE} == IDLE
    assert body["error"]["message"] == "no H3 node is running a job, so there is nothing to pause"
    assert "while an H3 node" in body["error"]["hint"]


def test_a_running_jobs_control_is_paused_and_resumed_and_released_when_it_ends() -> None:
    jobs, heard = RunningJobs(), []
    jobs.on_change = heard.append
    with jobs.job("7") as pause:
        assert jobs.state() == {**IDLE, "running": ["7"]}
        assert pause_answer(jobs, True) == (200, {**IDLE, "running": ["7"], "paused": True}) and pause.paused
        assert pause_answer(jobs, False) == (200, {**IDLE, "running": ["7"]}) and not pause.paused
        pause_answer(jobs, True)
    assert not pause.paused, "a job that ended must not stay paused"
    assert jobs.state() == IDLE
    assert heard[0] == {**IDLE, "running": ["7"]} and {**IDLE, "running": ["7"], "paused": True} in heard
    assert heard[-1] == IDLE


def test_the_routes_on_a_prompt_server_like_object() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    class Server:          # what register_pause_routes uses of ComfyUI's PromptServer
        def __init__(self) -> None:
            self.routes = web.RouteTableDef()
            self.sent: list[tuple[str, dict]] = []

        def send_sync(self, event: str, data: dict) -> None:
            self.sent.append((event, data))

    server, jobs = Server(), RunningJobs()
    register_pause_routes(server, jobs)
    app = web.Application()
    app.add_routes(server.routes)

    async def exercise() -> None:
        async with TestClient(TestServer(app)) as client:
            assert (await client.post(PAUSE_ROUTE)).status == 409
            with jobs.job("12") as pause:
                answer = await client.post(PAUSE_ROUTE)
                assert answer.status == 200 and (await answer.json())["paused"] is True and pause.paused
                assert (await (await client.get(PAUSE_ROUTE)).json()) == {**IDLE, "running": ["12"], "paused": True}
                answer = await client.post(RESUME_ROUTE)
                assert answer.status == 200 and not pause.paused

    asyncio.run(exercise())
    assert (STATE_EVENT, {**IDLE, "running": ["12"], "paused": True}) in server.sent
    assert server.sent[-1] == (STATE_EVENT, IDLE)


def test_the_frontend_extension_calls_these_routes() -> None:
    script = (WEB / "h3_pause.js").read_text(encoding="utf-8")
    for name in (PAUSE_ROUTE, RESUME_ROUTE, STOP_AFTER_SHOT_ROUTE, STATE_EVENT):
        assert f'"{name}"' in script


def test_stop_after_shot_reaches_only_a_storyboard_and_says_so_with_none() -> None:
    jobs = RunningJobs()
    status, body = stop_after_shot_answer(jobs)
    assert status == 409 and "no H3 Storyboard is rendering" in body["error"]["message"]
    with jobs.job("3"):                      # a single clip (H3 Generate): nothing to stop after
        assert stop_after_shot_answer(jobs)[0] == 409
    stop = threading.Event()
    with jobs.job("5", stop):
        assert jobs.state() == {**IDLE, "running": ["5"], "stoppable": ["5"]}
        assert stop_after_shot_answer(jobs) == (200, {**IDLE, "running": ["5"], "stoppable": ["5"], "stopping": True})
        assert stop.is_set()
    assert jobs.state() == IDLE


def test_the_stop_after_shot_route_on_a_prompt_server_like_object() -> None:
    pytest.importorskip("aiohttp")
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    class Server:
        def __init__(self) -> None:
            self.routes = web.RouteTableDef()

        def send_sync(self, event: str, data: dict) -> None:
            pass

    server, jobs, stop = Server(), RunningJobs(), threading.Event()
    register_pause_routes(server, jobs)
    app = web.Application()
    app.add_routes(server.routes)

    async def exercise() -> None:
        async with TestClient(TestServer(app)) as client:
            assert (await client.post(STOP_AFTER_SHOT_ROUTE)).status == 409
            with jobs.job("9", stop):
                answer = await client.post(STOP_AFTER_SHOT_ROUTE)
                assert answer.status == 200 and (await answer.json())["stopping"] is True

    asyncio.run(exercise())
    assert stop.is_set()
