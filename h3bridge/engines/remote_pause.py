"""A remote job paused and resumed with its caller's PauseControl: each pause()/resume() is a POST
to the server's /v1/videos/{id}/pause or /resume (an `h3bridge serve`: the engine there stops with
its memory resident). A server that cannot pause (a peer's, or the job already ended) is said so
in the log; the job then runs on there."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from ..cancel import PauseControl
from ..errors import H3BridgeError
from ..wire.videos import pause_path, server_message

if TYPE_CHECKING:
    from .remote import RemoteEngine

_log = logging.getLogger("h3bridge.remote")


def follow_pause(engine: "RemoteEngine", job_id: str, pause: PauseControl | None) -> Callable[[], None]:
    """Pause and resume `job_id` on `engine`'s server as `pause` does (at once if it is paused
    now); returns the function that stops following (call it when the job ends)."""
    if pause is None:
        return lambda: None

    def changed(paused: bool) -> None:
        what = f"{'pausing' if paused else 'resuming'} job {job_id}"
        try:
            response = engine._exchange("POST", pause_path(job_id, paused), what=what)
        except H3BridgeError as error:
            _log.warning("%s: %s", what, error.message)
            return
        if response.status_code >= 400:
            _log.warning("%s: the server at %s did not (HTTP %d: %s); the job runs on there", what,
                         engine.base_url, response.status_code, server_message(response))

    return pause.on_change(changed)
