"""`h3bridge serve`: the command that runs the server (registered in cli.py's SUBCOMMANDS)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EngineNotFoundError
from .jobs import DEFAULT_MAX_QUEUED
from .uploads import MiB, UploadLimits
from .wire import API_KEY_ENV

if TYPE_CHECKING:
    from ..model.inventory import ModelInventory

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
ENGINES = ("session", "oneshot")


def default_data_dir() -> Path:
    from ..userdirs import cache_dir
    return cache_dir() / "serve"


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    from ..engine_cli import add_engine_options, add_engine_safety_options
    parser = subparsers.add_parser(
        "serve", help="serve this Mac's engine over the OpenAI Videos API (POST /v1/videos, poll, download)",
        description="Run an HTTP server speaking the OpenAI Videos API subset that SGLang Diffusion and "
                    "vLLM-Omni implement, so `generate --remote`, ComfyUI and any OpenAI client can render "
                    "here. Jobs run one at a time on a warm engine; the queue survives restarts. "
                    f"Binds {DEFAULT_HOST} unless told otherwise; any other address needs an API key "
                    f"(${API_KEY_ENV}).")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0 picks a free one, printed at start)")
    parser.add_argument("--data-dir", type=Path, metavar="DIR",
                        help="where the queue, the uploads and the clips live (default: h3bridge's cache "
                             "folder, serve/); the server reads and writes nothing else")
    parser.add_argument("--engine", choices=ENGINES, default="session",
                        help="session (default): h3's interactive mode, the model stays loaded between jobs "
                             "(what it cannot take runs one-shot); oneshot: one h3 process per job")
    parser.add_argument("--api-key", metavar="KEY",
                        help=f"require Authorization: Bearer KEY (default ${API_KEY_ENV}; prefer the "
                             "variable: a flag shows in the process list and the shell history)")
    parser.add_argument("--max-upload-mb", type=float, default=UploadLimits.max_file_bytes / MiB, metavar="MB",
                        help=f"largest file one request may upload (default {UploadLimits.max_file_bytes // MiB})")
    parser.add_argument("--max-uploads", type=int, default=UploadLimits.max_files, metavar="N",
                        help=f"most files one request may upload (default {UploadLimits.max_files})")
    parser.add_argument("--max-queued", type=_max_queued, default=DEFAULT_MAX_QUEUED, metavar="N",
                        help=f"jobs that may wait behind the running one (default {DEFAULT_MAX_QUEUED}; 0: no "
                             "bound); one more is refused with HTTP 429 and Retry-After, so a load balancer "
                             "sends it to another server (h3bridge fleet: use 1)")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="allow browser pages from ORIGIN to call the API (repeatable; default: none)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_engine_options(parser)
    add_engine_safety_options(parser)
    parser.set_defaults(handler=run_serve)


def _max_queued(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0 (0: no bound; "
                                         f"default {DEFAULT_MAX_QUEUED})")
    return value


def model_health(inventory: ModelInventory) -> dict[str, object]:
    """What /health says about the model (no paths: /health needs no key): whether jobs can
    run, whether reference jobs can, and how many problems stop every job (`h3bridge info` on
    the server lists them)."""
    return {"ready": not inventory.errors, "references": inventory.has_ref2va and not inventory.reference_errors,
            "problems": len(inventory.errors)}


def run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .app import ServeSettings, check_bind, create_app
    except ImportError as error:
        raise EngineNotFoundError(f"h3bridge serve needs the server packages ({error.name} is missing)",
                                  hint="pip install 'h3bridge[serve]'") from None
    from ..engine_cli import engines_from_args
    from ..engines.lock import engine_lock
    from ..model.inventory import inspect_model
    from ..model.memory import preflight
    from .jobs import JobStore
    from .worker import Worker

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, api_key)
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s", stream=sys.stderr)
    engines = engines_from_args(args, session=args.engine == "session")
    one_shot, session = engines.one_shot, engines.warm
    # The model folder is the server's for its life: its headers are read once, not per
    # submission, and a folder that cannot run a job is refused here (exit 2), as a missing folder
    # or engine is, rather than blaming every client with a 400. --force starts it anyway.
    inventory = inspect_model(one_shot.model_dir)
    if args.force and inventory.errors:
        print(f"h3bridge serve: --force: starting with a model that cannot run jobs: {inventory.errors[0].message}",
              file=sys.stderr)
    elif not args.force:
        inventory.raise_for_problems()
    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    store = JobStore(data_dir)
    # With the engine lock held, an engine a killed server left running has been stopped, so
    # what it published is final and nothing more appears.
    with engine_lock():
        for note in store.recover():
            logging.getLogger("h3bridge.serve").warning("h3bridge serve: %s", note)

    def check_like_generate(request) -> None:
        preflight(request, one_shot.model_dir, force=args.force, session=session is not None, inventory=inventory)

    limits = UploadLimits(max_file_bytes=int(args.max_upload_mb * MiB), max_files=args.max_uploads)
    settings = ServeSettings(data_dir=data_dir, api_key=api_key, limits=limits,
                             cors_origins=tuple(args.cors_origin), engine_name=args.engine,
                             preflight=check_like_generate, model=model_health(inventory),
                             max_queued=args.max_queued or None)
    worker = Worker(store, session or one_shot, one_shot if session is not None else None)
    app = create_app(settings, store, worker)
    worker.start()

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    print(f"h3bridge serve: listening on http://{host}:{port} (data {data_dir}, engine {args.engine})",
                          file=sys.stderr, flush=True)

        async def shutdown(self, sockets=None) -> None:
            await super().shutdown(sockets)
            # Here, not only in the `finally` below: uvicorn re-raises the SIGTERM/SIGINT that
            # ended it once serve() returns (capture_signals), and that kills this process before
            # a `finally` runs, which left the running engine's process group alive.
            worker.stop()

    server = AnnouncingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                             access_log=args.log_level == "debug", lifespan="off"))
    try:
        server.run()
    finally:
        worker.stop()
        store.close()
    return 0
