"""Issue 34: `h3bridge serve`'s HTTP wiring is small route modules over one app-state object, not
one closure. These checks fail if create_app grows handlers back inside it, or a handler grows long."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from h3bridge.server import app as server_app  # noqa: E402
from h3bridge.server.state import AppState  # noqa: E402

SERVER = Path(server_app.__file__).parent
WIRING = [SERVER / "app.py", SERVER / "guards.py", SERVER / "answers.py", SERVER / "state.py",
          *sorted((SERVER / "routes").glob("*.py"))]
MAX_LINES = 25          # a function a reader takes in at once
MAX_BRANCHES = 8
BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.BoolOp, ast.match_case)


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_create_app_defines_no_handlers_inside_it() -> None:
    create_app = next(f for f in _functions(SERVER / "app.py") if f.name == "create_app")
    nested = [getattr(node, "name", "lambda") for node in ast.walk(create_app)
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and node is not create_app]
    assert nested == [], f"create_app defines {nested} inside it; put routes in server/routes/"
    assert create_app.end_lineno - create_app.lineno + 1 <= 15


def test_every_server_wiring_function_is_short() -> None:
    too_long = []
    for path in WIRING:
        for function in _functions(path):
            lines = function.end_lineno - function.lineno + 1
            branches = sum(isinstance(node, BRANCHES) for node in ast.walk(function))
            if lines > MAX_LINES or branches > MAX_BRANCHES:
                too_long.append(f"{path.relative_to(SERVER)}:{function.name} ({lines} lines, {branches} branches)")
    assert too_long == []


def test_app_state_is_one_dataclass_on_the_app(tmp_path: Path) -> None:
    from h3bridge.server.jobs import JobStore
    from h3bridge.server.state import STATE_ATTRIBUTE, ServeSettings
    from h3bridge.server.worker import Worker

    assert dataclasses.is_dataclass(AppState)
    settings = ServeSettings(data_dir=tmp_path, api_key="k" * 20)
    store = JobStore(tmp_path)
    worker = Worker(store, engine=None)  # type: ignore[arg-type]
    app = server_app.create_app(settings, store, worker)
    state = getattr(app.state, STATE_ATTRIBUTE)
    assert (state.settings, state.store, state.worker) == (settings, store, worker)
    assert state.api_key == b"k" * 20


def test_every_documented_endpoint_is_routed(tmp_path: Path) -> None:
    """Each endpoint server/app.py's docstring lists answers as itself: an unrouted one would get
    FastAPI's own 404 'Not Found' or a 405."""
    from fastapi.testclient import TestClient

    from h3bridge.server.jobs import JobStore
    from h3bridge.server.state import ServeSettings
    from h3bridge.server.worker import Worker

    store = JobStore(tmp_path)
    app = server_app.create_app(ServeSettings(data_dir=tmp_path), store, Worker(store, engine=None))  # type: ignore[arg-type]
    documented = [line.split()[:2] for line in (server_app.__doc__ or "").splitlines()
                  if line.split()[:1] in (["GET"], ["POST"], ["DELETE"])]
    assert len(documented) >= 8
    with TestClient(app) as client:
        for method, path in documented:
            answer = client.request(method, path.replace("{id}", "video_" + "0" * 32), json={})
            message = answer.json().get("error", {}).get("message") if answer.status_code >= 400 else None
            assert answer.status_code != 405 and message != "Not Found", f"{method} {path} is not routed"
