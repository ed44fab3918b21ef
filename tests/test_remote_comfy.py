"""The H3 Engine node's remote mode, through h3bridge.comfy.adapter without ComfyUI: the handle
holds the URL and never the key (read from H3BRIDGE_API_KEY when a job is sent), the local
engine's inputs are refused, no local model check or memory plan runs, and a clip comes back from
the server like a local one. (Against a real `h3bridge serve` and ComfyUI's saved prompt:
tests/test_remote_server.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from h3bridge import RemoteEngine
from h3bridge.comfy import adapter
from h3bridge.errors import ModelError, RequestError

KEY = "comfy-secret-key-789"
SETTINGS = adapter.GenerateSettings(prompt="a red fox", preset="preview", width=96, height=64,
                                    length_unit="frames", frames=22, ssd_streaming="auto")


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    from core_helpers import ffmpeg
    path = tmp_path_factory.mktemp("comfy-remote") / "clip.mp4"
    seconds = f"{22 / 24:.7f}"
    ffmpeg(path, "-f", "lavfi", "-i", f"testsrc=s=96x64:r=24:d={seconds}", "-f", "lavfi", "-i",
           f"sine=sample_rate=32000:d={seconds}", "-ac", "2", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac")
    return path.read_bytes()


def remote_handle(url: str = "http://studio-mac.test:8000/") -> adapter.EngineHandle:
    return adapter.check_engine_settings("", "", adapter.REMOTE, [], remote_url=url)


def test_the_handle_holds_the_url_and_never_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_API_KEY", KEY)
    handle = remote_handle()
    assert handle.mode == "remote" and handle.remote_url == "http://studio-mac.test:8000"
    assert handle.engine_path is None and handle.model_dir is None
    assert KEY not in repr(handle) and handle.describe() == "remote engine at http://studio-mac.test:8000"
    assert isinstance(adapter.open_engine(handle), RemoteEngine)


@pytest.mark.parametrize("engine_path, model_dir", [("/opt/h3/h3", ""), ("", "MiniMax-H3"), ("h3", "MiniMax-H3")])
def test_local_engine_inputs_are_not_read_in_remote_mode(engine_path: str, model_dir: str) -> None:
    """Issue 20 item 5: switching H3 Engine to remote must not mean clearing engine_path and model_dir
    first (they were refused); the server runs its own engine and model, so they are not read."""
    handle = adapter.check_engine_settings(engine_path, model_dir, adapter.REMOTE, [], remote_url="http://mac:8000")
    assert handle.engine_path is None and handle.model_dir is None and handle.remote_url == "http://mac:8000"


def test_the_queue_check_leaves_the_default_model_name_to_the_mode(tmp_path) -> None:
    """A new H3 Engine's model_dir (MiniMax-H3) with no such folder here is checked when the node
    runs, knowing the mode; any other name is still refused when the graph is queued."""
    assert adapter.check_model_setting(adapter.DEFAULT_MODEL_NAME, [tmp_path]) is None
    with pytest.raises(ModelError, match="'NoSuchModel' was not found"):
        adapter.check_model_setting("NoSuchModel", [tmp_path])
    with pytest.raises(ModelError, match="'MiniMax-H3' was not found"):       # one-shot still says it, at run time
        adapter.check_engine_settings("/bin/true", adapter.DEFAULT_MODEL_NAME, adapter.ONE_SHOT, [tmp_path])


@pytest.mark.parametrize("url, words", [("", "needs the server's URL in remote_url"),
                                        ("mac:8000", "not an http:// or https:// address")])
def test_a_missing_or_bad_url_is_refused(url: str, words: str) -> None:
    with pytest.raises(RequestError, match=words) as caught:
        remote_handle(url)
    assert caught.value.field == "remote_url"


def test_the_memory_plan_node_says_the_server_plans() -> None:
    with pytest.raises(RequestError, match="made by the server at http://studio-mac.test:8000"):
        adapter.describe_plan(remote_handle(), SETTINGS)


def test_a_job_runs_on_the_server_with_the_key_from_the_environment(
        tmp_path: Path, clip: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_API_KEY", KEY)
    seen: list[httpx.Request] = []
    polls = iter([{"id": "v1", "status": "in_progress", "progress": 50, "phase": "denoise"},
                  {"id": "v1", "status": "completed", "progress": 100}])

    def server(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            return httpx.Response(200, json={"id": "v1", "status": "queued", "progress": 0})
        if request.url.path.endswith("/content"):
            return httpx.Response(200, content=clip)
        return httpx.Response(200, json=next(polls))

    handle = remote_handle()
    first = np.zeros((1, 64, 96, 3), dtype=np.float32)
    first[..., 0] = 1.0
    outputs = adapter.run_generate(
        handle, SETTINGS, adapter.GenerateInputs(first_frame=first), scratch_parent=tmp_path / "scratch",
        output_dir=tmp_path / "out", want_image=True,
        engine_factory=lambda h: RemoteEngine(h.remote_url, transport=httpx.MockTransport(server), poll_interval=0.01))
    assert outputs.video_path.read_bytes() == clip and outputs.image.shape == (22, 64, 96, 3)
    assert {r.headers["authorization"] for r in seen} == {f"Bearer {KEY}"}
    post = seen[0]
    assert b'name="input_reference"; filename="first-frame.png"' in post.content
    assert b'name="ssd_streaming"' not in post.content       # "auto": the server plans for its memory
    assert outputs.summary.startswith("engine: remote engine at http://studio-mac.test:8000")
    assert "memory plan" not in outputs.summary
    everything_kept = json.dumps([repr(handle), outputs.summary, str(outputs.video_path)])
    assert KEY not in everything_kept
    assert list((tmp_path / "scratch").iterdir()) == []      # the uploaded first frame is gone too
