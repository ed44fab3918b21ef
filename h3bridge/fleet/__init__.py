"""A fleet of video servers behind one URL: the LiteLLM proxy configuration `h3bridge fleet` writes
(config.py) for several `h3bridge serve` machines and vLLM-Omni / SGLang servers."""
from .config import (
    DEFAULT_COOLDOWN_SECONDS,
    DEFAULT_MASTER_KEY_ENV,
    DEFAULT_MODEL_NAME,
    DEFAULT_ROUTING,
    FleetServer,
    FleetSettings,
    ServerKind,
    fleet_config,
    render_fleet_config,
    write_fleet_config,
)

__all__ = ["DEFAULT_COOLDOWN_SECONDS", "DEFAULT_MASTER_KEY_ENV", "DEFAULT_MODEL_NAME", "DEFAULT_ROUTING",
           "FleetServer", "FleetSettings", "ServerKind", "fleet_config", "render_fleet_config", "write_fleet_config"]
