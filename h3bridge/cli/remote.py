"""`h3bridge generate --remote URL`: the command line's words for RemoteEngine (engines/remote.py).

The API key comes from $H3BRIDGE_API_KEY only, never a flag (a flag lands in shell history and
in `ps`). The flags that configure a local engine mean nothing for a server, which runs its own
engine and model: given with --remote they are refused, before anything is sent.
"""
from __future__ import annotations

import argparse

from ..wire.peers import DIALECTS, Dialect
from ..errors import RequestError
from ..wire.videos import API_KEY_ENV

# dest -> (the flag, why it does not apply to a server)
LOCAL_ONLY_FLAGS: dict[str, tuple[str, str]] = {
    "engine_path": ("--engine-path", "the server runs its own engine (chosen with `h3bridge serve --engine-path`)"),
    "model_dir": ("--model-dir", "the server uses its own model (chosen with `h3bridge serve --model-dir`)"),
    "force": ("--force", "the model check and memory plan run on the server, for its machine"),
    "stall_timeout": ("--stall-timeout", "the engine's watchdog runs on the server"),
    "background": ("--background", "the server sets its engine's priority (`h3bridge serve --background`)"),
}


def add_remote_option(parser: argparse.ArgumentParser) -> None:
    """Add --remote to a subcommand, after its other options (their defaults are kept to tell
    which local-engine flags were given)."""
    parser.set_defaults(local_flag_defaults={dest: parser.get_default(dest) for dest in LOCAL_ONLY_FLAGS})
    parser.add_argument("--remote", metavar="URL",
                        help="render on a video server instead of this machine: `h3bridge serve` on another Mac, "
                             "or an SGLang Diffusion / vLLM-Omni server (e.g. http://studio-mac.local:8765). "
                             f"The API key, if the server needs one, is read from ${API_KEY_ENV}")
    parser.add_argument("--remote-dialect", choices=DIALECTS, default=Dialect.H3BRIDGE.value,
                        help="the request shape --remote's server speaks: h3bridge (default: `h3bridge serve`, "
                             "every setting), vllm-omni or sglang (their MiniMax-H3 servers; settings they have no "
                             "field for are refused before sending; docs/dialects.md)")


def refuse_local_only_flags(args: argparse.Namespace) -> None:
    """RequestError naming each local-engine flag given with --remote (a value other than its default)."""
    defaults = getattr(args, "local_flag_defaults", {})
    given = [dest for dest in LOCAL_ONLY_FLAGS if dest in defaults and getattr(args, dest) != defaults[dest]]
    if not given:
        return
    flags = [LOCAL_ONLY_FLAGS[dest][0] for dest in given]
    reasons = "; ".join(f"{LOCAL_ONLY_FLAGS[dest][0]}: {LOCAL_ONLY_FLAGS[dest][1]}" for dest in given)
    raise RequestError(f"{' and '.join(flags)} {'is' if len(flags) == 1 else 'are'} for a local engine and cannot "
                       f"be combined with --remote ({reasons})", field="remote",
                       hint=f"drop {' and '.join(flags)}, or drop --remote to render on this machine")


__all__ = ["LOCAL_ONLY_FLAGS", "add_remote_option", "refuse_local_only_flags"]
