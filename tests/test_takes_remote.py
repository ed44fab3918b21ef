"""Takes on a remote engine: every take is one job on `h3bridge serve`, and with `parallel` the
takes are in flight together (each its own server job), as a storyboard's parallel shots are.

The server is a child on a free loopback port with folders of its own (remote_helpers)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core_helpers import fast_request, isolated_home, sim_invocations  # noqa: F401 (a fixture)
from h3bridge import RemoteEngine, generate_takes
from remote_helpers import KEY, start_server
from server_helpers import model  # noqa: F401  (the module's fixture model)

WAIT = 120.0      # a safety net for a loaded machine, never an expected time


@pytest.fixture(autouse=True)
def _home(isolated_home: Path) -> None:
    """Every test here with its own HOME and cache."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Path):   # noqa: F811
    started = start_server(tmp_path_factory.mktemp("takes-server"), model)
    yield started
    started.stop()


class TogetherEngine:
    """A remote engine whose jobs all wait until `count` of them are in flight at once: a run that
    sends takes one after another never gets there (the barrier breaks after WAIT)."""

    def __init__(self, inner: RemoteEngine, count: int) -> None:
        self.inner = inner
        self.barrier = threading.Barrier(count, timeout=WAIT)

    @property
    def capabilities(self):
        return self.inner.capabilities

    def check_supported(self, request) -> None:
        self.inner.check_supported(request)

    def generate(self, *args, **kwargs):
        self.barrier.wait()
        return self.inner.generate(*args, **kwargs)

    def close(self) -> None:
        self.inner.close()


def test_parallel_takes_are_server_jobs_in_flight_together(server, tmp_path: Path) -> None:
    with RemoteEngine(server.url, api_key=KEY) as remote:
        engine = TogetherEngine(remote, 3)
        result = generate_takes(engine, fast_request(seed=11), tmp_path / "sea.mp4", takes=3, parallel=3)
    assert [take.seed for take in result.takes] == result.seeds == [11, 12, 13]
    assert [take.video_path for take in result.takes] == [tmp_path / f"sea.take{n}.mp4" for n in (1, 2, 3)]
    assert all(take.video_path.is_file() for take in result.takes) and (tmp_path / "sea.takes.png").is_file()


def test_cli_takes_on_a_server(server, tmp_path: Path) -> None:
    log = Path(server.env["H3_SIM_LOG"])       # the server's one-shot engine: one line per job
    before = len(sim_invocations(log))
    done = subprocess.run([sys.executable, "-m", "h3bridge.cli", "generate", "-p", "a red fox", "--width", "96",
                           "--height", "64", "--frames", "22", "--steps", "2", "--seed", "4,8", "--remote", server.url,
                           "--parallel", "2", "-o", str(tmp_path / "fox.mp4"), "--json"],
                          capture_output=True, text=True, env={**os.environ, "H3BRIDGE_API_KEY": KEY}, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["seeds"] == [4, 8] and [t["seed"] for t in summary["takes"]] == [4, 8]
    assert all(Path(t["video_path"]).is_file() for t in summary["takes"])
    assert Path(summary["contact_sheet"]).is_file()
    assert len(sim_invocations(log)) - before == 2      # one server job per take


def test_a_shots_takes_are_server_jobs_in_flight_together_with_parallel(server, tmp_path: Path) -> None:
    from h3bridge.story import Storyboard, run_story
    story = Storyboard.from_dict({"width": 96, "height": 64, "frames": 22, "steps": 2, "seed": 5,
                                  "shot": [{"prompt": "the harbour at dawn", "takes": 3}]})
    with RemoteEngine(server.url, api_key=KEY) as remote:
        result = run_story(story, tmp_path / "film.mp4", engine=TogetherEngine(remote, 3), parallel=3)
    shot = result.shots[0]
    assert [take.seed for take in shot.takes] == [story.seed_for(1) + n for n in range(3)]
    assert result.rendered_takes == 3 and all(take.video_path.is_file() for take in shot.takes)
    assert result.output is not None and result.output.is_file()
