"""What every route of `h3bridge serve` reads: the settings, the job store and the worker, held in
one AppState on the FastAPI app (app.state.h3bridge) rather than in closure variables, so each
route module takes it as a dependency (`state: State`) and stays a short function."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable

from fastapi import Depends, Request

from ..request import GenerationRequest
from .jobs import DEFAULT_MAX_QUEUED, JobStore
from .progress_feed import StreamSlots
from .uploads import UploadLimits
from .worker import Worker


@dataclass
class ServeSettings:
    data_dir: Path
    api_key: str | None = None
    limits: UploadLimits = field(default_factory=UploadLimits)
    cors_origins: tuple[str, ...] = ()
    engine_name: str = "session"
    # The checks `generate` makes before it starts an engine, beyond the request's own rules
    # (cli.preflight_generate: the model check and the memory plan); raises H3BridgeError.
    preflight: Callable[[GenerationRequest], None] | None = None
    model: dict[str, object] | None = None     # /health's model state (cli/serve.py model_health)
    sync_timeout: float = 1800.0               # POST /v1/videos/sync waits at most this long for its clip
    stream_slots: StreamSlots = field(default_factory=StreamSlots)     # open event streams, bounded
    max_queued: int | None = DEFAULT_MAX_QUEUED    # jobs waiting behind the running one; None: no bound
    previews: bool = False                     # the event streams carry denoise previews (serve --previews)


@dataclass
class AppState:
    settings: ServeSettings
    store: JobStore
    worker: Worker

    @property
    def api_key(self) -> bytes | None:
        """The key as compared (bytes, for hmac.compare_digest); None: no key is asked for."""
        return self.settings.api_key.encode("utf-8") if self.settings.api_key else None


STATE_ATTRIBUTE = "h3bridge"


def app_state(request: Request) -> AppState:
    return getattr(request.app.state, STATE_ATTRIBUTE)


State = Annotated[AppState, Depends(app_state)]
