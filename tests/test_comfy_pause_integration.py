"""Issue 31: Pause/Resume of the running H3 node in a real ComfyUI (the bed), through the pack's
routes on ComfyUI's own server (h3bridge/comfy/pause.py; the frontend's web/h3_pause.js calls
them): Pause stops the engine's process group (its CPU time stands still), Resume continues it,
and ComfyUI's Interrupt still ends the job while it is paused, leaving no engine behind."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import psutil
from h3bridge.engines.groups import all_stopped
import pytest

from test_comfy_integration import EXAMPLES, WORKFLOWS, Server, _generate_id, _set_engine, server  # noqa: F401
from comfy_workflows import ui_to_api

pytestmark = pytest.mark.comfyui
WAIT = 120.0


def _post(server: Server, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(server.url + path, data=b"{}", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return value


def _stopped(processes: list[psutil.Process]) -> bool:
    return all_stopped(processes)      # (or held in vfork by a child stopped before its exec)


def _cpu(processes: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def test_pause_resume_and_interrupt_while_paused(server: Server) -> None:
    assert _post(server, "/h3bridge/pause")[0] == 409        # nothing runs yet: nothing to pause
    prompt = ui_to_api(json.loads((EXAMPLES / WORKFLOWS[0]).read_text()), server.object_info)
    _set_engine(server, prompt, engine_path=str(server.slow_engine), mode="one-shot")
    prompt[_generate_id(prompt)]["inputs"]["seed"] = 31
    prompt_id = server.queue(prompt)
    _wait_for(lambda: server.get("/h3bridge/pause")["running"], "no H3 node ever ran")
    engines = _wait_for(server.engine_processes, "the engine never started")
    status, state = _post(server, "/h3bridge/pause")
    assert status == 200 and state["paused"] is True and state["running"]
    _wait_for(lambda: _stopped(server.engine_processes()), "the engine was never stopped")
    group = server.engine_processes()
    cpu = _cpu(group)
    time.sleep(2.0)
    assert _cpu(group) == cpu and _stopped(group), "the paused engine used CPU"
    status, state = _post(server, "/h3bridge/resume")
    assert status == 200 and state["paused"] is False
    _wait_for(lambda: not _stopped(server.engine_processes()), "the engine never continued")
    assert _post(server, "/h3bridge/pause")[0] == 200
    _wait_for(lambda: _stopped(server.engine_processes()), "the engine was never stopped again")
    server.post("/interrupt", {})              # ComfyUI's Interrupt, while paused
    entry = server.wait(prompt_id, timeout=60)
    gone, alive = psutil.wait_procs(engines, timeout=10)
    assert not alive, f"engine still running: {alive}"
    assert any(message[0] == "execution_interrupted" for message in entry["status"]["messages"])
    assert server.get("/h3bridge/pause") == {"running": [], "paused": False, "stoppable": [], "stopping": False}
