"""Pause and resume the running H3 node's job from the ComfyUI frontend (web/h3_pause.js), and
stop a storyboard after the shot it is rendering.

Each H3 node running a job registers its PauseControl here for as long as the job runs
(`RUNNING_JOBS.job(node_id)`); the routes, added to ComfyUI's own server through PromptServer
(`register_pause_routes`, at the extension's load), pause or resume every registered job (ComfyUI
runs one prompt at a time, so that is the node running now). Pausing stops the engine's process
group where it is (its memory stays in use); ComfyUI's Interrupt still ends the job while paused
(the node's CancelToken checks it, and a cancel continues the engine first to stop it).

An H3 Storyboard also registers its stop-after-shot event: `STOP_AFTER_SHOT_ROUTE` sets it, the
story finishes the shot rendering now and ends (story/host.py raises StoryStoppedError), which
frees the engine's memory; running the workflow again goes on from the next shot.

This module imports nothing from ComfyUI: the registry and the handlers are tested without it.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..cancel import PauseControl

PAUSE_ROUTE = "/h3bridge/pause"        # GET: the state; POST: pause
RESUME_ROUTE = "/h3bridge/resume"      # POST: resume
STOP_AFTER_SHOT_ROUTE = "/h3bridge/stop-after-shot"     # POST: a storyboard stops after its current shot
STATE_EVENT = "h3bridge.pause"         # sent to every open frontend on each change
PAUSED_TEXT = ("paused: the engine is stopped where it was and its memory stays in use; Resume continues it, "
               "Interrupt ends the job")


@dataclass
class RunningJob:
    pause: PauseControl
    stop_after_shot: threading.Event | None = None      # a storyboard's; None for a single clip


class RunningJobs:
    """The H3 jobs running now, by node id: each one's PauseControl (and a storyboard's stop event)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, RunningJob] = {}
        self.on_change: Callable[[dict[str, Any]], None] | None = None     # the server's broadcast

    @contextmanager
    def job(self, node_id: str | None, stop_after_shot: threading.Event | None = None) -> Iterator[PauseControl]:
        """A PauseControl for one node's job, reachable from the routes while the job runs; a
        storyboard also gives the event that stops it after its current shot."""
        pause, key = PauseControl(), str(node_id or "")
        running = RunningJob(pause, stop_after_shot)
        with self._lock:
            self._jobs[key] = running
        self._changed()
        try:
            yield pause
        finally:
            with self._lock:
                if self._jobs.get(key) is running:
                    del self._jobs[key]
            pause.resume()       # a control nobody can reach any more must not hold anything stopped
            self._changed()

    def set_paused(self, paused: bool) -> dict[str, Any]:
        """Pause or resume every running job; the state after (`changed`: whether any was running)."""
        with self._lock:
            controls = [job.pause for job in self._jobs.values()]
        for control in controls:
            control.pause() if paused else control.resume()
        self._changed()
        return {**self.state(), "changed": bool(controls)}

    def stop_after_shot(self) -> dict[str, Any]:
        """Ask every running storyboard to stop after its current shot; the state after (`changed`:
        whether one was running)."""
        with self._lock:
            events = [job.stop_after_shot for job in self._jobs.values() if job.stop_after_shot is not None]
        for event in events:
            event.set()
        self._changed()
        return {**self.state(), "changed": bool(events)}

    def state(self) -> dict[str, Any]:
        """`running`: node ids; `paused`; `stoppable`: the storyboards among them; `stopping`: one
        was asked to stop after its shot."""
        with self._lock:
            jobs = dict(self._jobs)
        stoppable = {key: job.stop_after_shot for key, job in jobs.items() if job.stop_after_shot is not None}
        return {"running": sorted(jobs), "paused": any(job.pause.paused for job in jobs.values()),
                "stoppable": sorted(stoppable), "stopping": any(event.is_set() for event in stoppable.values())}

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


def stop_after_shot_answer(jobs: RunningJobs) -> tuple[int, dict[str, Any]]:
    """The HTTP status and JSON body for a POST to STOP_AFTER_SHOT_ROUTE."""
    state = jobs.stop_after_shot()
    if not state.pop("changed"):
        return 409, {"error": {"message": "no H3 Storyboard is rendering, so there is no shot to stop after",
                               "hint": "press Stop after shot while an H3 Storyboard renders (a single clip "
                                       "can be paused or interrupted)"}, **state}
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

    @server.routes.post(STOP_AFTER_SHOT_ROUTE)
    async def stop_after_shot(request: web.Request) -> web.Response:
        status, body = stop_after_shot_answer(jobs)
        return web.json_response(body, status=status)
