"""Remote mode is for a machine with no `h3` of its own (issue 34): `story --remote` and H3 Storyboard
with a remote H3 Engine render there, with no `h3` on PATH and no H3_BIN; nothing looks for a local
engine that would not be used (H3 Storyboard built its one-shot fallback eagerly and failed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from h3bridge.comfy import adapter
from h3bridge.errors import EngineNotFoundError
from h3bridge.story.host import render_story_text

from core_helpers import isolated_home  # noqa: F401 (a fixture)
from remote_helpers import KEY, start_server
from server_helpers import model  # noqa: F401  (the module's fixture model)
from story_helpers import CANVAS, decode_film, write_story

TWO_SHOTS = CANVAS + '''
[[shot]]
prompt = "a lighthouse at dusk"
frames = 22

[[shot]]
prompt = "waves on the rocks"
frames = 22
continue = "cut"
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Path):   # noqa: F811
    started = start_server(tmp_path_factory.mktemp("no-local-h3-server"), model)
    yield started
    started.stop()


@pytest.fixture
def no_local_h3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_home: Path) -> dict[str, str]:  # noqa: F811
    """This process and its children see no h3: PATH is an empty folder, H3_BIN and H3_MODEL_DIR unset."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    for name in ("H3_BIN", "H3_MODEL_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("H3BRIDGE_API_KEY", KEY)
    with pytest.raises(EngineNotFoundError):      # there really is no local engine to find
        adapter.open_engine(adapter.EngineHandle(None, None, adapter.ONE_SHOT))
    return dict(os.environ)


def test_story_remote_renders_with_no_local_h3(server, no_local_h3: dict[str, str], tmp_path: Path) -> None:
    story, film = write_story(tmp_path, TWO_SHOTS), tmp_path / "film.mp4"
    done = subprocess.run([sys.executable, "-m", "h3bridge", "story", str(story), "-o", str(film), "--remote",
                           server.url, "--quiet"], capture_output=True, text=True, env=no_local_h3, timeout=240)
    assert done.returncode == 0, done.stderr
    frames, _audio, chapters = decode_film(film)
    assert len(chapters) == 2 and frames.shape[1:3] == (32, 64)


def test_h3_storyboard_with_a_remote_engine_renders_with_no_local_h3(server, no_local_h3: dict[str, str],
                                                                    tmp_path: Path) -> None:
    """What H3 Storyboard runs (comfy/story_nodes.py): the node's engine from engine_for_node, no fallback."""
    handle = adapter.EngineHandle(None, None, adapter.REMOTE, remote_url=server.url)
    engine = adapter.engine_for_node(handle)
    try:
        outputs = render_story_text("[22f]\na lighthouse at dusk\n\n[22f]\nwaves on the rocks",
                                    {"width": 64, "height": 32, "steps": 2}, engine=engine,
                                    jobs_root=tmp_path / "stories", job_name="coast", want_frames=False)
    finally:
        engine.close()
    assert outputs.video_path.is_file()
    frames, _audio, chapters = decode_film(outputs.video_path)
    assert len(chapters) == 2
