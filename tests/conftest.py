"""Suite-wide test isolation (kept minimal: per-area helpers live in tests/*_helpers.py).

Every engine (one-shot or warm session) takes the machine-wide engine lock (h3bridge/lock.py).
Each test gets its own lock file (and its own machine-wide folder, H3BRIDGE_MACHINE_DIR) so tests
never queue behind one another or behind a real h3bridge run on the same machine; tests about the
lock itself set H3BRIDGE_LOCK_PATH explicitly. Likewise every test records its jobs in a job
history of its own (H3BRIDGE_HISTORY_PATH, h3bridge/history/store.py), never the user's real one.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from h3bridge.engines.lock import LOCK_PATH_ENV
from h3bridge.history.store import HISTORY_PATH_ENV
from h3bridge.userdirs import MACHINE_DIR_ENV

# Hypothesis's per-example deadline (200 ms) measures the machine, not the code: on a loaded CI
# runner a pause fails a property that holds. The properties are checked without it.
settings.register_profile("h3bridge", deadline=None)
settings.load_profile("h3bridge")


@pytest.fixture(autouse=True)
def _isolated_engine_lock(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path_factory.mktemp("engine-lock") / "engine.lock"
    monkeypatch.setenv(LOCK_PATH_ENV, str(path))
    # A test that unsets H3BRIDGE_LOCK_PATH gets a machine-wide folder of its own, never the real
    # one (/var/tmp/h3bridge, /Users/Shared/h3bridge) other programs on this machine share.
    monkeypatch.setenv(MACHINE_DIR_ENV, str(path.parent / "machine"))
    monkeypatch.setenv(HISTORY_PATH_ENV, str(tmp_path_factory.mktemp("history") / "history.sqlite"))
    return path
