"""Each layer of h3bridge imports only what lies below it (issue 34; docs/architecture.md).

From the bottom: the vocabulary every package shares (errors, requests, results, progress,
media, safe I/O); the model folder, the wire and the job history; the engines and what runs
beside them (LoRA folds, the engine build, the simulator); what drives engines for many clips
(storyboards, the server, the fleet); and on top the interfaces (the command line, ComfyUI, the
package's public names). A module importing from a layer above its own fails here, naming the
import: an engine that needs something of the server's means that something belongs in the wire.

The command-line modules still live beside what they drive (story/cli.py, model/download_cli.py,
server/command.py, ...): they are the top layer wherever they are, and nothing below imports them.
"""
from __future__ import annotations

from layout_helpers import PACKAGE, import_graph

LAYERS: list[set[str]] = [
    # what every package shares
    {"errors", "vocabulary", "runnable", "cancel", "geometry", "prompt", "userdirs", "upstream_costs", "safeio",
     "progress", "request", "result", "media", "libh3"},
    # the model folder, the HTTP wire (server and RemoteEngine), the job history, the hexagon grid
    {"model", "wire", "history", "hexgrid"},
    # the engines and what runs beside them
    {"engines", "lora", "engine_build", "sim"},
    # many clips: storyboards, the server, the fleet's proxy configuration; the selftest of every engine
    {"story", "server", "fleet", "selftest"},
    # the interfaces
    {"cli", "engine_cli", "remote_cli", "selftest_cli", "comfy", "__main__", "__init__"},
]
TOP = len(LAYERS) - 1

# The command line, wherever it lives for now: the top layer.
COMMAND_LINE_MODULES = {
    "h3bridge.story.cli", "h3bridge.model.download_cli", "h3bridge.server.command", "h3bridge.engines.library_cli",
    "h3bridge.history.cli", "h3bridge.lora.cli", "h3bridge.hexgrid.cli",
    "h3bridge.fleet.cli", "h3bridge.sim.fixture_cli",
}


def _layer(module: str) -> int:
    if module in COMMAND_LINE_MODULES:
        return TOP
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    return next(index for index, names in enumerate(LAYERS) if top in names)


def _known(module: str) -> bool:
    parts = module.split(".")
    return len(parts) > 1 and any(parts[1] in names for names in LAYERS) or module in COMMAND_LINE_MODULES


def test_every_package_has_a_layer() -> None:
    tops = {path.relative_to(PACKAGE).parts[0].removesuffix(".py") for path in PACKAGE.iterdir()
            if (path.suffix == ".py" or (path / "__init__.py").is_file())}
    placed = set().union(*LAYERS)
    assert tops <= placed, f"give these a layer in LAYERS (and a paragraph in docs/architecture.md): {tops - placed}"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = [f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
              for module, targets in sorted(import_graph().items()) for target in sorted(targets)
              if _known(module) and _known(target) and _layer(target) > _layer(module)]
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import() -> None:
    """The walk above would catch the one this layering removed: an engine importing the server's wire."""
    graph = import_graph()
    assert "h3bridge.wire.videos" in graph["h3bridge.engines.remote"]
    assert _layer("h3bridge.wire.videos") < _layer("h3bridge.engines.remote") < _layer("h3bridge.server.app")
    assert _layer("h3bridge.story.cli") > _layer("h3bridge.story.runner")      # the command line is the top
