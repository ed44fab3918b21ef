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

import ast
from pathlib import Path

import h3bridge

PACKAGE = Path(h3bridge.__file__).resolve().parent

LAYERS: list[set[str]] = [
    # what every package shares
    {"errors", "vocabulary", "runnable", "cancel", "geometry", "prompt", "userdirs", "upstream_costs", "safeio",
     "progress", "request", "result", "media", "libh3"},
    # the model folder, the HTTP wire (server and RemoteEngine), the job history, the hexagon grid
    {"model", "wire", "history", "hexgrid"},
    # the engines and what runs beside them
    {"engines", "lora", "engine_build", "sim"},
    # many clips: storyboards, the server, the fleet's proxy configuration
    {"story", "server", "fleet"},
    # the interfaces
    {"cli", "engine_cli", "remote_cli", "comfy", "__main__", "__init__"},
]
TOP = len(LAYERS) - 1

# The command line, wherever it lives for now: the top layer.
COMMAND_LINE_MODULES = {
    "h3bridge.story.cli", "h3bridge.model.download_cli", "h3bridge.server.command", "h3bridge.engines.library_cli",
    "h3bridge.history.cli", "h3bridge.lora.cli", "h3bridge.hexgrid.cli",
    "h3bridge.fleet.cli", "h3bridge.sim.fixture_cli",
}


def _module_name(path: Path) -> str:
    parts = ["h3bridge", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    if module in COMMAND_LINE_MODULES:
        return TOP
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    return next(index for index, names in enumerate(LAYERS) if top in names)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every h3bridge module `path` imports, at any depth of the file."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "h3bridge":        # `from h3bridge import X` / `from .. import X`: X's own module
                found += [(node.lineno, f"h3bridge.{alias.name}") for alias in node.names]
            elif target.startswith("h3bridge."):
                found.append((node.lineno, target))
                # `from . import submodule`: the submodule itself
                found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names
                          if (PACKAGE.parent / f"{target}.{alias.name}".replace(".", "/")).with_suffix(".py").exists()]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("h3bridge.")]
    return found


def _known(module: str) -> bool:
    parts = module.split(".")
    return len(parts) > 1 and any(parts[1] in names for names in LAYERS) or module in COMMAND_LINE_MODULES


def test_every_package_has_a_layer() -> None:
    tops = {path.relative_to(PACKAGE).parts[0].removesuffix(".py") for path in PACKAGE.iterdir()
            if (path.suffix == ".py" or (path / "__init__.py").is_file())}
    placed = set().union(*LAYERS)
    assert tops <= placed, f"give these a layer in LAYERS (and a paragraph in docs/architecture.md): {tops - placed}"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for line, target in _imports(path):
            if _known(target) and _layer(target) > _layer(module):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {module} (layer {_layer(module)}) "
                              f"imports {target} (layer {_layer(target)})")
    assert not upward, "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The walk above would catch today's removed one: an engine importing the server's wire."""
    engine = PACKAGE / "engines" / "remote.py"
    imports = {target for _, target in _imports(engine)}
    assert "h3bridge.wire.videos" in imports and _layer("h3bridge.wire.videos") < _layer("h3bridge.engines.remote")
    assert _layer("h3bridge.server.app") > _layer("h3bridge.engines.remote")
