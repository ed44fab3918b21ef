"""The package's import graph: no two modules import each other, directly or through others
(what two modules share lives below both). Every import counts, module-level or inside a
function (a lazy import is still a dependency); only `if TYPE_CHECKING:` imports are left out."""
from __future__ import annotations

from layout_helpers import import_graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read():
    graph = import_graph()
    assert "h3bridge.cli.engine" in graph["h3bridge.cli.story"]
    assert "h3bridge.model.fold_record" in graph["h3bridge.model.inventory"]
    # a lazy import inside a function counts
    assert "h3bridge.cli.serve" in graph["h3bridge.cli.main"]


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_model_does_not_import_lora():
    """The fold record is the model folder's: model/ (below lora/) holds it, and never reaches up."""
    graph = import_graph()
    upward = {(name, target) for name, targets in graph.items() if name.startswith("h3bridge.model")
              for target in targets if target.startswith("h3bridge.lora")}
    assert upward == set()
