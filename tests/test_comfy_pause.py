"""Issue 31: the ComfyUI Pause/Resume control's server side (h3bridge/comfy/pause.py), without
ComfyUI: the running jobs' registry, the answers of its routes (registered on an aiohttp app as
PromptServer's routes are), and the broadcast the frontend (web/h3_pause.js) follows. The node in
ComfyUI itself is in tests/test_comfy_integration.py's bed."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from h3bridge.comfy.pause import (PAUSE_ROUTE, RESUME_ROUTE, STATE_EVENT, RunningJobs, pause_answer,
                                  register_pause_routes)

WEB = Path(__file__).parents[1] / "h3bridge" / "comfy" / "web"


def test_pausing_with_no_job_running_says_so() -> None:
    status, body = pause_answer(RunningJobs(), True)
    assert status == 409 and body["running"] == [] and body["paused"] is False
    assert body["error"]["message"] == "no H3 node is running a job, so there is nothing to pause"
    assert "while an H3 node" in body["error"]["hint"]


def test_a_running_jobs_control_is_paused_and_resumed_and_released_when_it_ends() -> None:
    jobs, heard = RunningJobs(), []
    jobs.on_change = heard.append
    with jobs.job("7") as pause:
        assert jobs.state() == {"running": ["7"], "paused": False}
        assert pause_answer(jobs, True) == (200, {"running": ["7"], "paused": True}) and pause.paused
        assert pause_answer(jobs, False) == (200, {"running": ["7"], "paused": False}) and not pause.paused
        pause_answer(jobs, True)
    assert not pause.paused, "a job that ended must not stay paused"
    assert jobs.state() == {"running": [], "paused": False}
    assert heard[0] == {"running": ["7"], "paused": False} and {"running": ["7"], "paused": True} in heard
    assert heard[-1] == {"running": [], "paused": False}


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
                assert (await (await client.get(PAUSE_ROUTE)).json()) == {"running": ["12"], "paused": True}
                answer = await client.post(RESUME_ROUTE)
                assert answer.status == 200 and not pause.paused

    asyncio.run(exercise())
    assert (STATE_EVENT, {"running": ["12"], "paused": True}) in server.sent
    assert server.sent[-1] == (STATE_EVENT, {"running": [], "paused": False})


def test_the_frontend_extension_calls_these_routes() -> None:
    script = (WEB / "h3_pause.js").read_text(encoding="utf-8")
    for name in (PAUSE_ROUTE, RESUME_ROUTE, STATE_EVENT):
        assert f'"{name}"' in script
