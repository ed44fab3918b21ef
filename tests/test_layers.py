"""Each layer of h3bridge imports only what lies below it (issue 34; docs/architecture.md).

From the bottom: the vocabulary every package shares (errors, requests, results, progress,
media, safe I/O); the model folder, the wire and the job history; the engines and what runs
beside them (LoRA folds, the engine build, the simulator); what drives engines for many clips
(storyboards, the server, the fleet); and on top the interfaces (the command line, ComfyUI, the
package's public names). A module importing from a layer above its own fails here, naming the
import: an engine that needs something of the server's means that something belongs in the wire.

All command-line code is one package, `cli/`: nothing outside it imports it (bar `__main__`, which
is `python -m h3bridge`), and no module outside it imports argparse. The simulator's own programs
(h3-sim, h3-sim-model, h3-sim-lib) are the one exception: they are other programs, the doubles of
upstream's `h3` and of a model folder, not h3bridge's command line.
"""
from __future__ import annotations

import ast
from pathlib import Path

from layout_helpers import PACKAGE, import_graph, module_names

LAYERS: list[set[str]] = [
    # what every package shares
    {"errors", "fixes", "vocabulary", "runnable", "cancel", "geometry", "prompt", "userdirs", "upstream_costs", "safeio",
     "progress", "request", "result", "media", "libh3"},
    # the model folder, the HTTP wire (server and RemoteEngine), the job history, the hexagon grid
    {"model", "wire", "history", "hexgrid"},
    # the engines and what runs beside them
    {"engines", "lora", "engine_build", "sim"},
    # many clips: takes of one request, storyboards, the server, the fleet's proxy configuration;
    # the selftest of every engine
    {"takes", "story", "server", "fleet", "selftest"},
    # the interfaces
    {"cli", "comfy", "__main__", "__init__"},
]
TOP = len(LAYERS) - 1

# Programs of their own that may read their arguments with argparse outside cli/: the simulator's
# fixture model folder (h3-sim-model: fixture_cli.py) and the libh3 double's build (h3-sim-lib:
# sim/library.py). (h3-sim itself, sim/cli.py, reads its flags as upstream's h3 does, by hand.)
OWN_PROGRAMS = {"h3bridge.sim.fixture_cli", "h3bridge.sim.library"}
# Who may import the command line: itself, and `python -m h3bridge`.
CLI_IMPORTERS = {"h3bridge.__main__"}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    return next(index for index, names in enumerate(LAYERS) if top in names)


def _known(module: str) -> bool:
    parts = module.split(".")
    return len(parts) > 1 and any(parts[1] in names for names in LAYERS)


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
    assert _layer("h3bridge.cli.story") > _layer("h3bridge.story.runner")      # the command line is the top


def _is_cli(module: str) -> bool:
    return module == "h3bridge.cli" or module.startswith("h3bridge.cli.")


def test_nothing_outside_the_command_line_imports_it() -> None:
    importers = [f"{module} imports {target}" for module, targets in sorted(import_graph().items())
                 for target in sorted(targets)
                 if _is_cli(target) and not _is_cli(module) and module not in CLI_IMPORTERS]
    assert not importers, "\n".join(importers)


def _imports_argparse(path) -> bool:
    tree = ast.parse(path.read_text())
    return any((isinstance(node, ast.Import) and any(alias.name == "argparse" for alias in node.names))
               or (isinstance(node, ast.ImportFrom) and node.module == "argparse") for node in ast.walk(tree))


def test_argparse_is_imported_only_in_the_command_line() -> None:
    outside = sorted(name for name, (path, _) in module_names().items()
                     if _imports_argparse(path) and not _is_cli(name) and name not in OWN_PROGRAMS)
    assert not outside, f"move the argument parsing of these into h3bridge/cli/: {outside}"
    # the rule reads what it claims to: the command line does import argparse, as the programs do
    assert _imports_argparse(module_names()["h3bridge.cli.main"][0])
    assert all(_imports_argparse(module_names()[name][0]) for name in OWN_PROGRAMS)


def test_the_argparse_check_sees_a_lazy_import(tmp_path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("def parse():\n    from argparse import ArgumentParser\n    return ArgumentParser()\n")
    assert _imports_argparse(planted)
    planted.write_text("# argparse is mentioned, not imported\nimport json\n")
    assert not _imports_argparse(planted)


# Inside engines/: what every engine shares lies below every engine (issue 34.2). The job skeleton
# (job.py) and the child-job helper (child.py) know how a job runs and how to wait on a child, and
# nothing of a particular engine; each engine imports them, never the other way round.
ENGINE_CORE = {"h3bridge.engines.job", "h3bridge.engines.child", "h3bridge.engines.waiting", "h3bridge.engines.groups"}
WAITS = {"h3bridge.engines.child", "h3bridge.engines.waiting"}     # wait_until lives in waiting.py, child.py re-exports it
ENGINES = {"h3bridge.engines.oneshot", "h3bridge.engines.session", "h3bridge.engines.library",
           "h3bridge.engines.remote", "h3bridge.engines.warm", "h3bridge.engines.lock", "h3bridge.engines.fallback",
           "h3bridge.engines.factory"}


def test_the_job_skeleton_and_the_child_helper_lie_below_every_engine() -> None:
    graph = import_graph()
    reaches = {module: _reachable(graph, module) for module in ENGINE_CORE}
    upward = sorted(f"{module} reaches {target}" for module, found in reaches.items() for target in found & ENGINES)
    assert not upward, "\n".join(upward)
    # ... and every engine that runs a job uses them
    for engine in ("oneshot", "session", "library", "remote"):
        assert "h3bridge.engines.job" in graph[f"h3bridge.engines.{engine}"], engine
    for waiting in ("oneshot", "session", "library", "lock", "warm", "remote", "groups"):
        assert WAITS & graph[f"h3bridge.engines.{waiting}"], waiting


# A loop that sleeps, waits or polls inside engines/ is a second wait loop: it goes through
# waiting.wait_until (re-exported by child.py) instead (issue 34.2: the waits in every engine became one). What is left reads a
# stream of events, each wait of which is a bounded read with a cancel check, not a wait for an end.
WAITING_CALLS = {"sleep", "wait", "poll", "select", "join", "get"}
EVENT_READERS = {
    ("remote_events.py", "follow_events"): "reads the server's event stream off a queue, item by item",
    ("session.py", "_command"): "reads the replies to one ! command; each read waits in _next_event's wait_until",
    ("session.py", "_forward_stderr"): "a thread forwarding h3's stderr pieces to the event queue until EOF",
    ("library_worker.py", "read_host"): "the worker process's stdin reader thread (messages until EOF)",
    ("library_worker.py", "run"): "the worker process's job queue (jobs until the host says none)",
}


def waiting_loops(folder: Path) -> list[tuple[str, str, int]]:
    found = []
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for loop in ast.walk(function):
                if isinstance(loop, ast.While) and any(
                        isinstance(call, ast.Call) and getattr(call.func, "attr", getattr(call.func, "id", None))
                        in WAITING_CALLS for call in ast.walk(loop)):
                    found.append((path.name, function.name, loop.lineno))
    return sorted(set(found))


def test_every_wait_in_the_engines_goes_through_wait_until() -> None:
    loops = [(name, function, line) for name, function, line in waiting_loops(PACKAGE / "engines")
             if name != "waiting.py" and (name, function) not in EVENT_READERS]
    assert not loops, f"wait through waiting.wait_until, not a loop of your own: {loops}"


def test_the_wait_loop_check_sees_a_sleeping_loop(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text("import time\n\ndef run(done):\n    while not done():\n        time.sleep(0.1)\n")
    assert waiting_loops(tmp_path) == [("engine.py", "run", 4)]


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), set()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen
