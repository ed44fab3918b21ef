"""`h3bridge serve`: the command that runs the server (registered in main.py's SUBCOMMANDS)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EngineNotFoundError, MemoryPlanError, RequestError, shown_value
from ..safeio.numbers import read_int
from .flags import float_flag, int_flag
from ..server.jobs import DEFAULT_MAX_QUEUED, FRONT_MAX_QUEUED
from ..server.uploads import MiB, UploadLimits
from ..vocabulary import EngineKind
from ..wire.videos import API_KEY_ENV

if TYPE_CHECKING:
    from ..model.inventory import ModelInventory
    from ..model.memory import MachineFacts, MemoryPlan

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
# The engines a server runs on its own machine (vocabulary.EngineKind; `remote` is h3bridge fleet's job)
SERVE_ENGINES = (EngineKind.ONE_SHOT.value, EngineKind.SESSION.value, EngineKind.LIBRARY.value)


def default_data_dir() -> Path:
    from ..userdirs import cache_dir
    return cache_dir() / "serve"


MAX_API_KEY_CHARS = 1024      # an HTTP header line; far more than any generated key
MAX_ORIGIN_CHARS = 2048       # a browser origin is a scheme, a host and a port


def _data_folder(text: str) -> Path:
    """--data-dir: a folder, or a path where one can be made; a FIFO, a device, a file or a dangling
    link there was found only when the job store opened it (exit 1, "Not a directory")."""
    from ..safeio.paths import not_a_folder
    path = Path(text)
    what = not_a_folder(path)
    if what is not None:
        raise argparse.ArgumentTypeError(f"{text!r} is {what}, not a folder; give a folder "
                                         "for the queue, the uploads and the clips (made if missing)")
    return path


def _header_text(flag: str, limit: int):
    """A value that travels in an HTTP header (a key, an origin): one line of printable text."""
    def check(text: str) -> str:
        if not text or len(text) > limit or not text.isprintable():
            raise argparse.ArgumentTypeError(f"{flag} must be one line of at most {limit} printable characters")
        return text
    check.__name__ = flag.strip("-").replace("-", "_")
    return check


def add_serve_command(subparsers: argparse._SubParsersAction) -> None:
    from .engine import add_background_option, add_engine_choice, add_engine_options, add_engine_safety_options
    parser = subparsers.add_parser(
        "serve", help="serve this Mac's engine over the OpenAI Videos API (POST /v1/videos, poll, download)",
        description="Run an HTTP server speaking the OpenAI Videos API subset that SGLang Diffusion and "
                    "vLLM-Omni implement, so `generate --remote`, ComfyUI and any OpenAI client can render "
                    "here. Jobs run one at a time on a warm engine; the queue survives restarts. "
                    f"Binds {DEFAULT_HOST} unless told otherwise; any other address needs an API key "
                    f"(${API_KEY_ENV}).")
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    parser.add_argument("--port", type=int_flag(0, 65535), default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0 picks a free one, printed at start)")
    parser.add_argument("--data-dir", type=_data_folder, metavar="DIR",
                        help="where the queue, the uploads and the clips live (default: h3bridge's cache "
                             "folder, serve/); the server reads and writes nothing else")
    add_engine_choice(parser, parser, kinds=SERVE_ENGINES, default=EngineKind.SESSION)
    parser.add_argument("--previews", action="store_true",
                        help="stream each job's denoise previews on GET /v1/videos/{id}/events (needs --engine "
                             "library; the preview VAE, the video decoder the library's warm context keeps, "
                             "is in the memory plan at start and for every job)")
    parser.add_argument("--api-key", metavar="KEY", type=_header_text("--api-key", MAX_API_KEY_CHARS),
                        help=f"require Authorization: Bearer KEY (default ${API_KEY_ENV}; prefer the "
                             "variable: a flag shows in the process list and the shell history)")
    parser.add_argument("--max-upload-mb", type=float_flag(greater_than=0, maximum=1024 * 1024), default=UploadLimits.max_file_bytes / MiB, metavar="MB",
                        help=f"largest file one request may upload (default {UploadLimits.max_file_bytes // MiB})")
    parser.add_argument("--max-uploads", type=int_flag(1, 10_000), default=UploadLimits.max_files, metavar="N",
                        help=f"most files one request may upload (default {UploadLimits.max_files})")
    parser.add_argument("--max-queued", type=_max_queued, metavar="N",
                        help=f"jobs that may wait behind the running one (default {DEFAULT_MAX_QUEUED}, and "
                             f"{FRONT_MAX_QUEUED} with --server; 0: no bound); one more is refused with HTTP 429 "
                             "and Retry-After")
    fleet = parser.add_argument_group("a fleet's front (docs/fleet.md)")
    fleet.add_argument("--server", action="append", default=[], metavar="URL",
                       help="run the jobs on this h3bridge server instead of this machine's engine (repeatable): "
                            "jobs wait in this server's queue and each runs on the first server that is free")
    fleet.add_argument("--servers-file", type=Path, metavar="FILE",
                       help="more servers, one URL a line, read again whenever the file changes (a server "
                            "added takes waiting jobs at once)")
    fleet.add_argument("--server-key-env", default=API_KEY_ENV, metavar="NAME",
                       help=f"environment variable holding the servers' API key (default {API_KEY_ENV})")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        type=_header_text("--cors-origin", MAX_ORIGIN_CHARS),
                        help="allow browser pages from ORIGIN to call the API (repeatable; default: none)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_engine_options(parser)
    add_engine_safety_options(parser)
    add_background_option(parser)
    from .library import add_library_location_options
    add_library_location_options(parser.add_argument_group("library engine (--engine library)"))
    parser.set_defaults(handler=run_serve)


def _max_queued(text: str) -> int:
    try:
        value = read_int(text, field=None)
    except RequestError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{shown_value(text)} is not a whole number >= 0 (0: no bound; "
                                         f"default {DEFAULT_MAX_QUEUED}); fix: give a whole number of jobs, "
                                         "e.g. --max-queued 1 behind h3bridge fleet")
    return value


def model_health(inventory: ModelInventory) -> dict[str, object]:
    """What /health says about the model (no paths: /health needs no key): whether jobs can
    run, whether reference jobs can, and how many problems stop every job (`h3bridge info` on
    the server lists them)."""
    return {"ready": not inventory.errors, "references": inventory.has_ref2va and not inventory.reference_errors,
            "problems": len(inventory.errors)}


def refuse_unusable_library_options(args: argparse.Namespace) -> None:
    """The flags that only the library engine reads, refused with another engine (before anything starts):
    --library-path / --h3-dir by engine_kind, as generate and story refuse them; --previews here."""
    from .engine import engine_kind
    if engine_kind(args) is not EngineKind.LIBRARY and args.previews:
        raise RequestError("--previews needs --engine library: only libh3 hands its denoise previews over (the h3 "
                           "program shows them on a terminal only)", field="previews",
                           hint="add --engine library --library-path PATH (or set $H3_LIBRARY), or drop --previews")


def check_previews_fit(inventory: ModelInventory, machine: MachineFacts | None, *, force: bool) -> MemoryPlan:
    """--previews keeps upstream's preview VAE loaded through each job's denoise. The library's warm
    context decodes its previews with the video decoder it retains between jobs (h3.c
    h3_acquire_video_decoder), which is how memory.plan_memory counts it for a warm engine, and how
    every submission is planned (as `generate --engine library --preview-dir` plans). Here, at start:
    when not even the smallest settings fit the engine's device with it, no job could run, and the
    server refuses to start (unless --force) instead of refusing every job."""
    from ..model.memory import plan_memory
    from ..request import GenerationRequest
    from ..runnable import h3bridge_command
    plan = plan_memory(GenerationRequest("h3bridge serve --previews"), inventory, machine=machine, preview=True,
                       session=True)
    if plan.fits or plan.suggestion is not None or force:
        return plan
    raise MemoryPlanError(f"--previews: no job fits this device with the preview VAE loaded ({plan.verdict()})",
                          plan=plan, hint=f"see `{h3bridge_command('plan', '--engine', 'library', '--show')}` for the plan on a Mac with more "
                                          "memory (--memory-gb), or pass --force to start anyway")


def _queue_bound(given: int | None, default: int) -> int | None:
    """--max-queued as the server applies it: the default when not given, None (no bound) for 0."""
    return (default if given is None else given) or None



def _local(args: argparse.Namespace, api_key: str | None, limits: UploadLimits, data_dir: Path):
    """This machine's engine behind the queue: the settings, the queue and its one worker."""
    from .engine import engine_from_args, machine_facts_of
    from ..engines.fallback import choose_engine
    from ..engines.lock import engine_lock
    from ..model.inventory import inspect_model
    from ..model.memory import preflight
    from ..server.app import ServeSettings
    from ..server.jobs import JobStore
    from ..server.worker import Worker

    refuse_unusable_library_options(args)
    engine = engine_from_args(args)
    # The model folder is the server's for its life: its headers are read once, not per
    # submission, and a folder that cannot run a job is refused here (exit 2), as a missing folder
    # or engine is, rather than blaming every client with a 400. --force starts it anyway.
    inventory = inspect_model(engine.model_dir)
    if args.force and inventory.errors:
        print(f"h3bridge serve: --force: starting with a model that cannot run jobs: {inventory.errors[0].message}",
              file=sys.stderr)
    elif not args.force:
        inventory.raise_for_problems()
    # The library plans with its own device's facts (h3_device: Metal's working set), read once
    # here by a probe worker; the h3 program's engines plan with this machine's (None: detected).
    machine = machine_facts_of(engine)
    if args.previews:
        check_previews_fit(inventory, machine, force=args.force)
    store = JobStore(data_dir)
    # With the engine lock held, an engine a killed server left running has been stopped, so
    # what it published is final and nothing more appears.
    with engine_lock():
        for note in store.recover():
            logging.getLogger("h3bridge.serve").warning("h3bridge serve: %s", note)

    def check_like_generate(request) -> None:
        preflight(request, engine.model_dir, force=args.force, inventory=inventory, machine=machine,
                  session=choose_engine(engine, request).engine.capabilities.warm_model, preview=args.previews)

    settings = ServeSettings(data_dir=data_dir, api_key=api_key, limits=limits,
                             cors_origins=tuple(args.cors_origin), engine_name=args.engine_kind.value,
                             preflight=check_like_generate, model=model_health(inventory),
                             max_queued=_queue_bound(args.max_queued, DEFAULT_MAX_QUEUED), previews=args.previews)
    return settings, store, Worker(store, engine, previews=args.previews)


def _front(args: argparse.Namespace, api_key: str | None, limits: UploadLimits, data_dir: Path):
    """A fleet's front (fleet/front.py): the same queue, one worker per --server, no engine here.
    The servers check each job against their own model and memory when they take it."""
    from ..fleet.front import FleetWorkers, check_server_url, read_servers_file
    from ..server.app import ServeSettings
    from ..server.jobs import JobStore

    if args.previews:
        raise RequestError("--previews needs this machine's library engine; a fleet's front (--server) runs no engine "
                           "and passes no previews on", field="previews", hint="drop --previews")
    servers = []
    for url in args.server:
        url = check_server_url(url, "--server")
        if url not in servers:
            servers.append(url)
    if args.servers_file is not None:
        read_servers_file(args.servers_file)       # refused now (exit 2), not in the watcher's log
    store = JobStore(data_dir)
    # No engine here, so nothing to stop first: a job that was running is queued again (and sent
    # under the same Idempotency-Key, so the server that has it hands it back).
    for note in store.recover():
        logging.getLogger("h3bridge.serve").warning("h3bridge serve: %s", note)
    settings = ServeSettings(data_dir=data_dir, api_key=api_key, limits=limits, cors_origins=tuple(args.cors_origin),
                             engine_name="fleet", model=None,
                             max_queued=_queue_bound(args.max_queued, FRONT_MAX_QUEUED))
    return settings, store, FleetWorkers(store, servers, servers_file=args.servers_file, key_env=args.server_key_env)


def run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..server.app import check_bind, create_app
    except ImportError as error:
        raise EngineNotFoundError(f"h3bridge serve needs the server packages ({error.name} is missing)",
                                  hint="pip install 'h3bridge[serve]'") from None
    from ..fleet.config import check_env_name
    check_env_name(args.server_key_env, "--server-key-env")     # also when no --server reads it
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, api_key)
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s", stream=sys.stderr)
    limits = UploadLimits(max_file_bytes=int(args.max_upload_mb * MiB), max_files=args.max_uploads)
    data_dir = (args.data_dir or default_data_dir()).expanduser().resolve()
    if args.server or args.servers_file is not None:
        settings, store, worker = _front(args, api_key, limits, data_dir)
    else:
        settings, store, worker = _local(args, api_key, limits, data_dir)
    app = create_app(settings, store, worker)
    worker.start()

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    print(f"h3bridge serve: listening on http://{host}:{port} (data {data_dir}, engine {settings.engine_name})",
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
