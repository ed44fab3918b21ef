"""Suite-wide test isolation (kept minimal: per-area helpers live in tests/*_helpers.py).

Every engine (one-shot or warm session) takes the machine-wide engine lock (h3bridge/lock.py).
Each test gets its own lock file (and its own machine-wide folder, H3BRIDGE_MACHINE_DIR) so tests
never queue behind one another or behind a real h3bridge run on the same machine; tests about the
lock itself set H3BRIDGE_LOCK_PATH explicitly. Likewise every test records its jobs in a job
history of its own (H3BRIDGE_HISTORY_PATH, h3bridge/history/store.py), never the user's real one.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import settings

from h3bridge.engines.lock import LOCK_PATH_ENV
from h3bridge.history.store import HISTORY_PATH_ENV
from h3bridge.userdirs import MACHINE_DIR_ENV

# The slowest test files, slowest first (from `--durations` of a whole run on a loaded 2-core
# machine: 330 s down to 50 s of a worker's time each). xdist hands whole files to its workers in
# collection order (pyproject.toml: --no-loadscope-reorder), and pytest_collection_modifyitems puts
# these first: the many short files then fill both workers to the end, instead of a long file
# starting last while the other worker has nothing left. Only the order changes; a file not named
# here runs after these, in the usual order.
SLOWEST_FILES = (
    "test_server_durability.py", "test_engine.py", "test_session.py", "test_library_engine.py",
    "test_upstream_build.py", "test_docs.py", "test_cli.py", "test_story_resume.py", "test_readme.py",
    "test_story.py", "test_selftest.py", "test_hexgrid.py", "test_story_parallel.py", "test_comfy_install.py",
    "test_remote_server.py", "test_lora_layout.py", "test_differential.py", "test_lock_accounts.py",
    "test_newcomer_cli.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: place for place, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))     # stable: a file's tests stay together, in order


# Hypothesis's per-example deadline (200 ms) measures the machine, not the code: on a loaded CI
# runner a pause fails a property that holds. The properties are checked without it.
settings.register_profile("h3bridge", deadline=None)
settings.load_profile("h3bridge")


@pytest.fixture(scope="session", autouse=True)
def _bytecode_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """With PYTHONDONTWRITEBYTECODE set (as on some CI images), every child Python the tests start
    (thousands: h3-sim per job, h3bridge CLIs and servers) compiled every h3bridge module it imports
    from source again. Bytecode is written instead to one folder per run, shared by the xdist
    workers, outside the checkout (PYTHONPYCACHEPREFIX), so the checkout stays as clean as the
    variable keeps it and each module is compiled once a run. Without the variable nothing changes."""
    if not sys.flags.dont_write_bytecode and "PYTHONDONTWRITEBYTECODE" not in os.environ:
        yield
        return
    run_root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_root = run_root.parent       # popen-gwN's parent: this run's folder, shared by the workers
    prefix = run_root / "pycache"
    prefix.mkdir(exist_ok=True)
    saved = {name: os.environ.get(name) for name in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    saved_flag, saved_prefix = sys.dont_write_bytecode, sys.pycache_prefix
    sys.dont_write_bytecode, sys.pycache_prefix = False, str(prefix)
    try:
        yield
    finally:
        sys.dont_write_bytecode, sys.pycache_prefix = saved_flag, saved_prefix
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(autouse=True)
def _isolated_engine_lock(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path_factory.mktemp("engine-lock") / "engine.lock"
    monkeypatch.setenv(LOCK_PATH_ENV, str(path))
    # A test that unsets H3BRIDGE_LOCK_PATH gets a machine-wide folder of its own, never the real
    # one (/var/tmp/h3bridge, /Users/Shared/h3bridge) other programs on this machine share.
    monkeypatch.setenv(MACHINE_DIR_ENV, str(path.parent / "machine"))
    monkeypatch.setenv(HISTORY_PATH_ENV, str(tmp_path_factory.mktemp("history") / "history.sqlite"))
    return path
