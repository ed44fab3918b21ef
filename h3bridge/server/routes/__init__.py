"""The HTTP routes of `h3bridge serve`, one module per concern; each reads the app's AppState
(server/state.py) as a dependency and answers errors through server/answers.py.

- submit.py: POST /v1/videos and /v1/videos/sync (receive, translate, validate, queue).
- videos.py: list, retrieve, download and delete the jobs.
- control.py: pause and resume a running job.
- events.py: a job's progress as server-sent events.
- health.py: readiness.
"""
from __future__ import annotations

from fastapi import APIRouter

from . import control, events, health, submit, videos

ROUTERS: tuple[APIRouter, ...] = (health.router, submit.router, videos.router, control.router,
                                   events.router)
