"""`h3bridge fleet`: write the LiteLLM proxy configuration for several video servers (config.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .flags import float_flag, int_flag
from ..wire.videos import API_KEY_ENV
from ..fleet.config import (
    check_env_name,
    DEFAULT_ALLOWED_FAILS,
    DEFAULT_COOLDOWN_SECONDS,
    DEFAULT_MASTER_KEY_ENV,
    DEFAULT_MODEL_NAME,
    DEFAULT_ROUTING,
    DEFAULT_TIMEOUT_SECONDS,
    MAX_RETRIES,
    MAX_SECONDS,
    ROUTING_STRATEGIES,
    FleetServer,
    FleetSettings,
    ServerKind,
    render_fleet_config,
    write_fleet_config,
)


def add_fleet_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fleet", help="write a LiteLLM proxy config that spreads jobs over several video servers",
        description="Write the configuration of LiteLLM's proxy for a fleet: several `h3bridge serve` "
                    "machines (and vLLM-Omni or SGLang servers) behind one OpenAI Videos API URL. Keys "
                    "stay in the environment (os.environ/NAME). Start each h3bridge server with "
                    "--max-queued 1 so a full one answers 429 and the proxy sends the job to another. "
                    "For h3bridge servers alone, a front that queues a whole batch is `h3bridge serve "
                    "--server URL ...`. See docs/fleet.md.")
    parser.add_argument("--server", action="append", default=[], metavar="URL",
                        help="an h3bridge serve base URL, e.g. http://mac1.local:8765 (repeatable)")
    parser.add_argument("--vllm-omni", action="append", default=[], metavar="URL",
                        help="a vLLM-Omni server serving MiniMax-H3 (repeatable)")
    parser.add_argument("--sglang", action="append", default=[], metavar="URL",
                        help="an SGLang Diffusion server serving MiniMax-H3 (repeatable)")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE",
                        help="the config file to write (default: print it)")
    parser.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    parser.add_argument("--key-env", default=API_KEY_ENV, metavar="NAME",
                        help=f"environment variable holding the h3bridge servers' API key on the proxy's "
                             f"machine (default {API_KEY_ENV})")
    parser.add_argument("--peer-key-env", metavar="NAME",
                        help="environment variable holding the vLLM-Omni/SGLang servers' key (default: none)")
    parser.add_argument("--master-key-env", default=DEFAULT_MASTER_KEY_ENV, metavar="NAME",
                        help=f"environment variable holding the key clients give the proxy (default "
                             f"{DEFAULT_MASTER_KEY_ENV})")
    parser.add_argument("--model-name", default=DEFAULT_MODEL_NAME, metavar="NAME",
                        help=f"the model clients ask the proxy for (default {DEFAULT_MODEL_NAME})")
    parser.add_argument("--routing", default=DEFAULT_ROUTING, choices=ROUTING_STRATEGIES,
                        help=f"LiteLLM's routing strategy (default {DEFAULT_ROUTING}; docs/fleet.md has what "
                             "each did with our servers)")
    # The lower bounds are checked by fleet_config, in its own words; the adapters refuse what is no number.
    parser.add_argument("--retries", type=int_flag(maximum=MAX_RETRIES), metavar="N",
                        help="how often the proxy retries a create on another pick of server (default: 4 per server, at least 20: "
                             "the pick is random, so a dead or full server may be picked again)")
    parser.add_argument("--cooldown", type=float_flag(maximum=MAX_SECONDS), default=DEFAULT_COOLDOWN_SECONDS, metavar="SECONDS",
                        help="leave a server that failed alone this long (default 0: no cooldown; with "
                             "LiteLLM 1.110 a cooling server's jobs are polled on another server, "
                             "docs/fleet.md)")
    parser.add_argument("--timeout", type=float_flag(maximum=MAX_SECONDS), default=DEFAULT_TIMEOUT_SECONDS, metavar="SECONDS",
                        help=f"the proxy's wait for one answer of a server (default {DEFAULT_TIMEOUT_SECONDS:g})")
    parser.set_defaults(handler=run_fleet)


def settings_from_args(args: argparse.Namespace) -> FleetSettings:
    # every name given is checked, also one no server uses (--peer-key-env without a peer)
    for flag, name in (("--key-env", args.key_env), ("--peer-key-env", args.peer_key_env),
                       ("--master-key-env", args.master_key_env)):
        if name:
            check_env_name(name, flag)
    servers = ([FleetServer(url, ServerKind.H3BRIDGE, args.key_env) for url in args.server]
               + [FleetServer(url, ServerKind.VLLM_OMNI, args.peer_key_env) for url in args.vllm_omni]
               + [FleetServer(url, ServerKind.SGLANG, args.peer_key_env) for url in args.sglang])
    return FleetSettings(model_name=args.model_name, routing=args.routing, retries=args.retries,
                         cooldown_seconds=args.cooldown, allowed_fails=DEFAULT_ALLOWED_FAILS,
                         timeout_seconds=args.timeout, master_key_env=args.master_key_env or None,
                         servers=tuple(servers))


def run_fleet(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.output is None:
        if args.overwrite:
            print("h3bridge fleet: --overwrite has no file to replace without -o FILE", file=sys.stderr)
            return 2
        sys.stdout.write(render_fleet_config(settings))
        return 0
    path = write_fleet_config(settings, args.output, overwrite=args.overwrite)
    print(f"h3bridge fleet: wrote {path} ({len(settings.servers)} servers); start the proxy with: "
          f"litellm --config {path} --port 4000", file=sys.stderr)
    return 0
