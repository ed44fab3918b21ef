"""Pause and resume the running H3 node's job from the ComfyUI frontend (web/h3_pause.js).

Each H3 node running a job registers its PauseControl here for as long as the job runs
(`RUNNING_JOBS.job(node_id)`); the routes, added to ComfyUI's own server through PromptServer
(`register_pause_routes`, at the extension's load), pause or resume every registered job (ComfyUI
runs one prompt at a time, so that is the node running now). Pausing stops the engine's process
group where it is (its memory stays in use); ComfyUI's Interrupt still ends the job while paused
(the node's CancelToken checks it, and a cancel continues the engine first to stop it).

This module imports nothing from ComfyUI: the registry and the handlers are tested without it.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from ..cancel import PauseControl

PAUSE_ROUTE = "/h3bridge/pause"        # GET: the state; POST: pause
RESUME_ROUTE = "/h3bridge/resume"      # POST: resume
STATE_EVENT = "h3bridge.pause"         # sent to every open frontend on each change
PAUSED_TEXT = ("paused: the engine is stopped where it was and its memory stays in use; Resume continues it, "
               "Interrupt ends the job")


class RunningJobs:
    """The PauseControls of the H3 jobs running now, by node id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, PauseControl] = {}
        self.on_change: Callable[[dict[str, Any]], None] | None = None     # the server's broadcast

    @contextmanager
    def job(self, node_id: str | None) -> Iterator[PauseControl]:
        """A PauseControl for one node's job, reachable from the routes while the job runs."""
        pause, key = PauseControl(), str(node_id or "")
        with self._lock:
            self._jobs[key] = pause
        self._changed()
        try:
            yield pause
        finally:
            with self._lock:
                if self._jobs.get(key) is pause:
                    del self._jobs[key]
            pause.resume()       # a control nobody can reach any more must not hold anything stopped
            self._changed()

    def set_paused(self, paused: bool) -> dict[str, Any]:
        """Pause or resume every running job; the state after (`changed`: whether any was running)."""
        with self._lock:
            controls = list(self._jobs.values())
        for control in controls:
            control.pause() if paused else control.resume()
        self._changed()
        return {**self.state(), "changed": bool(controls)}

    def state(self) -> dict[str, Any]:
        with self._lock:
            jobs = dict(self._jobs)
        return {"running": sorted(jobs), "paused": any(control.paused for control in jobs.values())}

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self.state())
            except Exception:   # noqa: BLE001 - the broadcast is a courtesy; the job goes on
                pass


RUNNING_JOBS = RunningJobs()


def pause_answer(jobs: RunningJobs, paused: bool) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body for a POST to PAUSE_ROUTE (`paused`) or RESUME_ROUTE."""
    state = jobs.set_paused(paused)
    if not state.pop("changed"):
        verb = "pause" if paused else "resume"
        return 409, {"error": {"message": f"no H3 node is running a job, so there is nothing to {verb}",
                               "hint": "press Pause while an H3 node (H3 Generate, H3 Storyboard) renders"}, **state}
    return 200, state


def register_pause_routes(server: Any, jobs: RunningJobs = RUNNING_JOBS) -> None:
    """Add the routes to ComfyUI's PromptServer (`server`), as custom node packs add theirs (before
    ComfyUI adds its own routes to the app), and broadcast every change to the frontends."""
    from aiohttp import web

    def broadcast(state: dict[str, Any]) -> None:
        server.send_sync(STATE_EVENT, state)

    jobs.on_change = broadcast

    @server.routes.get(PAUSE_ROUTE)
    async def pause_state(request: web.Request) -> web.Response:
        return web.json_response(jobs.state())

    @server.routes.post(PAUSE_ROUTE)
    async def pause(request: web.Request) -> web.Response:
        status, body = pause_answer(jobs, True)
        return web.json_response(body, status=status)

    @server.routes.post(RESUME_ROUTE)
    async def resume(request: web.Request) -> web.Response:
        status, body = pause_answer(jobs, False)
        return web.json_response(body, status=status)
