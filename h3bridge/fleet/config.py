"""The LiteLLM proxy configuration for a fleet of video servers (`h3bridge fleet`).

Every server becomes one deployment of one model group (`model_name`), so a client asks the proxy
for that model and the router picks a server. What we read in LiteLLM 1.110's router (installed
package, litellm/router_utils/cooldown_handlers.py, litellm/router_rust/core.py) and measured with
its real proxy (tests/test_fleet_litellm.py, bench/bench_fleet.py):

* A create returns at once (the job waits in the server's queue), so neither least-busy (the
  proxy's own count of requests in flight) nor usage-based routing (tokens and requests per
  minute, counted by the proxy) can see a server's queue; the router reads no `x-ratelimit-*`
  header and no /health of a backend. What moves a job is the server saying it is full: an HTTP
  429 (`h3bridge serve --max-queued N`), which the router retries on another deployment
  (`num_retries`). With `--max-queued 1` on every server, jobs spread.
* The proxy encodes the deployment's `model_info.id` in every video id it returns and pins the
  job's status and content calls to that deployment; the ids here are stable (kind, host and
  port), so a restarted proxy still finds the jobs of its clients.
* Cooldowns are off unless asked for (`--cooldown`). Measured with 1.110.2: while a deployment
  cools down (after a 429 it does, for its Retry-After; after a failure, for `cooldown_time`), the
  pin of its jobs' polls is dropped and the poll goes to another server, which answers 404 "no
  video" for a job that is alive, or, when every deployment cools, the proxy answers 429. Without
  cooldowns a full server costs a create one retry, and a dead one one refused connection (a
  machine that is off: a connect timeout), and the polls of its jobs fail with the connection's
  reason until it is back.

Keys never appear in the file: the servers' key and the proxy's master key are `os.environ/NAME`
references that the proxy resolves when it starts.
"""
from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import RequestError, shown_value
from ..safeio.numbers import read_float, read_int
from ..safeio.outputs import write_output
from ..wire.videos import API_KEY_ENV, DEFAULT_MODEL

DEFAULT_MODEL_NAME = DEFAULT_MODEL                 # what clients ask the proxy for
DEFAULT_MASTER_KEY_ENV = "LITELLM_MASTER_KEY"      # the key clients give the proxy
# Of the router's strategies only simple-shuffle is not counting something our servers never show
# (see above); with full servers answering 429 it spreads jobs evenly (bench/bench_fleet.py).
DEFAULT_ROUTING = "simple-shuffle"
ROUTING_STRATEGIES = ("simple-shuffle", "least-busy", "usage-based-routing-v2", "latency-based-routing")
# No cooldown by default (see above); with --cooldown S a failing server is left alone S seconds
# after its first failure in a minute, and a full one (429) is never cooled down.
DEFAULT_COOLDOWN_SECONDS = 0.0
DEFAULT_ALLOWED_FAILS = 0
_NEVER = 1_000_000      # RateLimitErrorAllowedFails: a 429 is a full queue, not a failing server
# The proxy's wait for one answer of a server: a create uploads the references, a download
# carries the clip; neither waits for a render.
DEFAULT_TIMEOUT_SECONDS = 600.0
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_ENV_NAME = 255          # a variable's name, not a flood of text
# The most a setting may say: a retry count or a wait in seconds past these is a typo, never a plan.
MAX_RETRIES = 1000
MAX_SECONDS = 7 * 24 * 3600.0
MAX_MODEL_NAME_CHARS = 200
# A host name as DNS spells it (RFC 1123 labels, `_` as docker and mDNS names use it), at most 253
# characters; a name in another script is checked as its IDNA (punycode) form.
_HOST_NAME = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                        r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


class ServerKind(str, enum.Enum):
    """What a server speaks, and so which LiteLLM provider drives it."""

    H3BRIDGE = "h3bridge"      # `h3bridge serve`: vLLM-Omni's multipart /v1/videos
    VLLM_OMNI = "vllm-omni"
    SGLANG = "sglang"          # SGLang Diffusion: the OpenAI Videos API

    @property
    def provider(self) -> str:
        return "openai" if self is ServerKind.SGLANG else "hosted_vllm"


@dataclass(frozen=True)
class FleetServer:
    """One server: its base URL (`http://mac1.local:8765`, with or without `/v1`) and the name of
    the environment variable holding its API key on the proxy's machine (None: no key)."""

    url: str
    kind: ServerKind = ServerKind.H3BRIDGE
    key_env: str | None = API_KEY_ENV

    @property
    def api_base(self) -> str:
        base = self.url.rstrip("/")
        return (base if base.endswith("/v1") else base + "/v1")

    @property
    def deployment_id(self) -> str:
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{self.kind.value}-{parts.hostname}-{port}"


@dataclass(frozen=True)
class FleetSettings:
    model_name: str = DEFAULT_MODEL_NAME
    routing: str = DEFAULT_ROUTING
    retries: int | None = None            # None: default_retries(servers), enough picks to find a live server
    cooldown_seconds: float = DEFAULT_COOLDOWN_SECONDS
    allowed_fails: int = DEFAULT_ALLOWED_FAILS
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    master_key_env: str | None = DEFAULT_MASTER_KEY_ENV
    servers: tuple[FleetServer, ...] = field(default_factory=tuple)


def default_retries(servers: int) -> int:
    """How often the proxy retries a create on another pick. simple-shuffle picks at random and,
    without cooldowns, may pick a dead or full server again: with one retry per other server, a
    fleet of three with one server down failed 1 create in 27 (all three picks the dead one; seen in
    CI). Four picks per server, and at least 20, make that (1/n)^(picks + 1): under one in a million
    for any n (two servers: 1 in 2 million). A pick of a full server costs one refused request
    (~30 ms through the proxy); a dead one, a refused connection."""
    return max(4 * servers, 20)


def check_env_name(name: str, flag: str) -> None:
    """An environment variable's name, never a key pasted in its place."""
    if len(name) > MAX_ENV_NAME or not _ENV_NAME.fullmatch(name):
        # not echoed: what was given in place of a name may well be the key itself
        raise RequestError(f"{flag} takes the name of an environment variable (letters, digits and _, not "
                           f"starting with a digit, at most {MAX_ENV_NAME}), not what was given; the key itself "
                           "never goes into the proxy's file", field=flag,
                           hint=f"put the key in a variable and name it: export {API_KEY_ENV}=...; {flag} {API_KEY_ENV}")


def shown_url(url: str) -> str:
    """A URL as a message may show it: never its user or password (a key pasted into it), cut to
    80 characters, control characters escaped."""
    scheme, sep, rest = url.partition("://")
    if sep:
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            rest = "***@" + authority.rpartition("@")[2] + slash + path
        url = scheme + sep + rest
    elif "@" in url:
        url = "***@" + url.rpartition("@")[2]
    return shown_value(url)


def _host_is_valid(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:          # an empty label, one over 63 characters, a character IDNA refuses
        return False
    return _HOST_NAME.fullmatch(ascii_host) is not None


def check_server(server: FleetServer, flag: str) -> None:
    shown = shown_url(server.url)
    example = f"e.g. {flag} http://mac1.local:8765"
    # urlsplit drops tabs and newlines and keeps other control characters: look at the text first.
    if not server.url.isprintable() or any(char.isspace() for char in server.url):
        raise RequestError(f"{flag} {shown} has a control character or a space in it", field=flag,
                           hint=f"give the server's base URL as plain text, {example}")
    parts = urlsplit(server.url)
    if "@" in parts.netloc:
        # not echoed: what is before the @ is a user name and, most likely, the key itself
        raise RequestError(f"{flag} {shown} carries a user name or key in the URL; the proxy's file holds no "
                           "credentials", field=flag,
                           hint=f"drop the user and key from the URL ({example}); put the key in an environment "
                                f"variable and name it: {'--key-env' if server.kind is ServerKind.H3BRIDGE else '--peer-key-env'} NAME")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or parts.query or parts.fragment \
            or parts.path.rstrip("/") not in ("", "/v1"):
        raise RequestError(f"{flag} {shown} is not a server's base URL", field=flag,
                           hint=f"give it as the server prints it at start, {example}")
    if not _host_is_valid(parts.hostname):
        raise RequestError(f"{flag} {shown}: {shown_value(parts.hostname, limit=40)} is not a host name (letters, "
                           "digits, - and . in labels of up to 63 characters, 253 in all) or an IP address",
                           field=flag, hint=f"give the server's host name or address, {example}")
    if server.key_env is not None:
        check_env_name(server.key_env, "--key-env" if server.kind is ServerKind.H3BRIDGE else "--peer-key-env")


def fleet_config(settings: FleetSettings) -> dict[str, object]:
    """The proxy's configuration (a mapping `yaml.safe_dump` writes); RequestError names the flag
    of anything that cannot work."""
    if not settings.servers:
        raise RequestError("a fleet needs at least one server", field="--server",
                           hint="name each one: h3bridge fleet --server http://mac1.local:8765 "
                                "--server http://mac2.local:8765 -o litellm.yaml")
    seen: dict[str, str] = {}
    for server in settings.servers:
        flag = "--server" if server.kind is ServerKind.H3BRIDGE else f"--{server.kind.value}"
        check_server(server, flag)
        if server.deployment_id in seen:
            raise RequestError(f"{flag} {shown_url(server.url)} names the same server as "
                               f"{shown_url(seen[server.deployment_id])}",
                               field=flag, hint="give each server once")
        seen[server.deployment_id] = server.url
    if settings.routing not in ROUTING_STRATEGIES:
        raise RequestError(f"--routing {settings.routing!r} is not one of LiteLLM's routing strategies here",
                           field="--routing", hint=f"use one of {', '.join(ROUTING_STRATEGIES)} "
                                                   f"(default {DEFAULT_ROUTING})")
    if isinstance(settings.retries, int) and not isinstance(settings.retries, bool) and settings.retries < 0:
        raise RequestError(f"--retries {shown_value(settings.retries)} must be 0 or more", field="--retries",
                           hint="leave it out: one retry per other server")
    if settings.retries is not None:
        read_int(settings.retries, field="--retries", minimum=0, maximum=MAX_RETRIES,
                 hint=f"leave it out (four picks per server, at least 20), or give at most {MAX_RETRIES}")
    if isinstance(settings.cooldown_seconds, (int, float)) and settings.cooldown_seconds < 0:
        raise RequestError(f"--cooldown {settings.cooldown_seconds:g} must be 0 (no cooldown) or more seconds",
                           field="--cooldown", hint="leave it out: no cooldown (docs/fleet.md says why)")
    read_float(settings.cooldown_seconds, field="--cooldown", minimum=0.0, maximum=MAX_SECONDS,
               hint=f"leave it out: no cooldown (docs/fleet.md says why), or give at most {MAX_SECONDS:g} seconds")
    if isinstance(settings.timeout_seconds, (int, float)) and settings.timeout_seconds <= 0:
        raise RequestError(f"--timeout {settings.timeout_seconds:g} must be more than 0 seconds",
                           field="--timeout", hint=f"use e.g. --timeout {DEFAULT_TIMEOUT_SECONDS:g}")
    read_float(settings.timeout_seconds, field="--timeout", greater_than=0.0, maximum=MAX_SECONDS,
               hint=f"use e.g. --timeout {DEFAULT_TIMEOUT_SECONDS:g} (at most {MAX_SECONDS:g} seconds)")
    name = settings.model_name
    if (not name.strip() or ";" in name or not name.isprintable() or len(name) > MAX_MODEL_NAME_CHARS
            or name != name.strip()):
        raise RequestError(f"--model-name {shown_value(name)} must be a name of 1 to {MAX_MODEL_NAME_CHARS} "
                           "printable characters, without ';', line breaks or control characters",
                           field="--model-name", hint=f"use e.g. --model-name {DEFAULT_MODEL_NAME}")
    if settings.master_key_env is not None:
        check_env_name(settings.master_key_env, "--master-key-env")

    model_list = []
    for server in settings.servers:
        params: dict[str, object] = {"model": f"{server.kind.provider}/{settings.model_name}",
                                     "api_base": server.api_base, "timeout": settings.timeout_seconds}
        if server.key_env is not None:
            params["api_key"] = f"os.environ/{server.key_env}"
        model_list.append({"model_name": settings.model_name, "litellm_params": params,
                           "model_info": {"id": server.deployment_id, "mode": "video_generation"}})
    retries = settings.retries if settings.retries is not None else default_retries(len(settings.servers))
    router: dict[str, object] = {
        "routing_strategy": settings.routing,
        "num_retries": retries,
        "retry_after": 0,          # retry on another server at once
    }
    if settings.cooldown_seconds > 0:
        router.update({"allowed_fails": settings.allowed_fails, "cooldown_time": settings.cooldown_seconds,
                       "allowed_fails_policy": {"RateLimitErrorAllowedFails": _NEVER}})
    else:
        router["disable_cooldowns"] = True
    config: dict[str, object] = {"model_list": model_list, "router_settings": router,
                                 "litellm_settings": {"drop_params": False}}
    if settings.master_key_env is not None:
        config["general_settings"] = {"master_key": f"os.environ/{settings.master_key_env}"}
    return config


def render_fleet_config(settings: FleetSettings) -> str:
    try:
        import yaml
    except ImportError:
        raise RequestError("h3bridge fleet writes YAML and needs PyYAML", field="fleet",
                           hint="pip install 'h3bridge[fleet]'") from None
    config = fleet_config(settings)
    header = ("# LiteLLM proxy configuration written by `h3bridge fleet` (docs/fleet.md).\n"
              "# Keys are read from the environment when the proxy starts (os.environ/NAME).\n"
              "# Start every h3bridge server with --max-queued 1, so a full one answers 429 and the\n"
              "# router sends the job to another; then: litellm --config THIS_FILE --port 4000\n")
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def write_fleet_config(settings: FleetSettings, path: Path, *, overwrite: bool = False) -> Path:
    """Write the configuration to `path` through safeio.outputs (checked first, staged beside it,
    fsynced, then linked or renamed into place); an existing file is kept unless `overwrite`, and
    a device node, FIFO, folder or link is never written over."""
    text = render_fleet_config(settings)      # every refusal before anything is written
    return write_output(path, text, overwrite=overwrite, field="-o", make_parents=False)
