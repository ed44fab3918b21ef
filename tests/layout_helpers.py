"""The package's import graph, read from the source (tests/test_layout.py: no cycles;
tests/test_layers.py: no import from a layer above). Every import counts, module-level or inside a
function (a lazy import is still a dependency); only `if TYPE_CHECKING:` imports are left out."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "h3bridge"


def module_names() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package's __init__)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text())
        type_only = {id(node) for branch in ast.walk(tree)
                     if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
                     for node in ast.walk(branch)}
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:     # `from . import x`: x may be a module
                    targets.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


__all__ = ["PACKAGE", "import_graph", "module_names"]
