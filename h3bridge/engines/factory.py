"""`open_engine(kind, ...)`: the engine for each engine kind of the vocabulary (issue 34), the one
place that says which class renders `one-shot`, `session`, `library` and `remote`, and that a
session falls back to one-shot (FallbackEngine) for the requests h3's interactive mode cannot take.

Nothing starts here: each engine finds its program or library and model now (errors name what is
missing) and starts its process on the first `generate`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from ..errors import UnsupportedRequestError
from ..vocabulary import EngineKind, read_engine_kind
from .fallback import FallbackEngine
from .protocol import Engine

PathLike = str | os.PathLike[str]


def open_engine(kind: EngineKind | str, *, engine_path: PathLike | None = None, model_dir: PathLike | None = None,
                stall_timeout: float | None = 600.0, lock_path: Path | None = None, shared: bool = False,
                library_path: PathLike | None = None, h3_dir: PathLike | None = None,
                remote_url: str | None = None, fallback: bool = True,
                on_fallback: Callable[[UnsupportedRequestError], None] | None = None, background: bool = False,
                **remote_options: Any) -> Engine:
    """The engine of `kind` (an EngineKind or its spelling; ValueError naming the kinds otherwise).

    engine_path, model_dir: the local `h3` and model (default H3_BIN / PATH, H3_MODEL_DIR).
    shared: the process-wide warm engine for this program and model (a host that renders many
      clips, such as ComfyUI) instead of one of its own.
    library_path, h3_dir: the library engine's libh3 and h3.c folder.
    remote_url, remote_options: the remote engine's server and RemoteEngine's keywords.
    fallback: a session behind its one-shot fallback (FallbackEngine); False: the session alone,
      for a caller that composes its own (ComfyUI's nodes, whose tests give each engine kind).
    on_fallback: told when a session hands a request to its one-shot fallback.
    background: the local engine's children at background priority (engines/priority.py): the
      CLI's --background, ComfyUI's `background` input and the storyboard key all come here. A
      shared engine takes each caller's choice, as its watchdog; one already lowered stays so
      until its child restarts. A remote engine's priority is its server's (refused here).
    """
    kind, _ = read_engine_kind(kind)
    if kind is EngineKind.REMOTE:
        from .remote import RemoteEngine      # httpx and pydantic: only the remote engine needs them
        if background:
            from ..errors import RequestError
            from ..runnable import h3bridge_command
            raise RequestError("background priority is for a local engine; a remote engine renders at its "
                               "server's priority", field="background",
                               hint=f"start the server with `{h3bridge_command('serve', '--background')}`, and "
                                    "drop background=True here")
        if not remote_url:
            from ..errors import RequestError
            raise RequestError("the remote engine needs the server's URL", field="remote_url",
                               hint="give the URL of an h3bridge serve (or a peer's Videos API server)")
        return RemoteEngine(remote_url, **remote_options)
    if remote_options:
        raise TypeError(f"{', '.join(sorted(remote_options))}: options of the remote engine, not the {kind} one")
    if kind is EngineKind.LIBRARY:
        from .library import LibraryEngine, shared_library_engine
        if shared:
            library = shared_library_engine(library_path, model_dir, h3_dir=h3_dir, lock_path=lock_path)
            library.stall_timeout = stall_timeout     # each job's caller decides its watchdog
            library.background = background          # and its priority
            return library
        return LibraryEngine(library_path, model_dir, h3_dir=h3_dir, stall_timeout=stall_timeout,
                             lock_path=lock_path, background=background)
    from .oneshot import OneShotEngine
    if kind is EngineKind.ONE_SHOT:
        return OneShotEngine(engine_path, model_dir, stall_timeout=stall_timeout, lock_path=lock_path,
                             background=background)
    from .session import SessionEngine, shared_session
    if shared:
        session = shared_session(engine_path, model_dir, lock_path=lock_path)
        session.stall_timeout = stall_timeout
        session.background = background
    else:
        session = SessionEngine(engine_path, model_dir, stall_timeout=stall_timeout, lock_path=lock_path,
                                background=background)
    if not fallback:
        return session

    def one_shot() -> Engine:
        # the session's own program, model, watchdog, lock and priority: the two never run at once
        return OneShotEngine(session.engine_path, session.model_dir, stall_timeout=session.stall_timeout,
                             lock_path=session.lock_path, background=session.background)
    return FallbackEngine(session, one_shot, on_fallback=on_fallback)


__all__ = ["open_engine"]
