"""RemoteEngine against httpx.MockTransport: every class of failure becomes its typed error with
the server's words and the fix, and nothing is left behind; the body is the wire module's; a
cancel deletes the server's job. (The same engine against a real `h3bridge serve` is in
tests/test_remote_server.py.)"""
from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from h3bridge import (
    CancelToken,
    Engine,
    GenerationCancelled,
    RemoteAuthError,
    RemoteEngine,
    RemoteError,
    RemoteUnreachableError,
    RequestError,
)
from h3bridge.wire.videos import request_to_wire

from core_helpers import fast_request, ffmpeg, make_image

URL = "http://render-mac.test:8000"


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """An MP4 of fast_request()'s shape (96x64, 22 frames, stereo AAC at 32 kHz)."""
    path = tmp_path_factory.mktemp("remote-clip") / "clip.mp4"
    seconds = f"{22 / 24:.7f}"
    ffmpeg(path, "-f", "lavfi", "-i", f"testsrc=s=96x64:r=24:d={seconds}", "-f", "lavfi", "-i",
           f"sine=sample_rate=32000:d={seconds}", "-ac", "2", "-c:v", "libx264", "-pix_fmt", "yuv420p",
           "-c:a", "aac")
    return path.read_bytes()


def job(status: str = "queued", progress: int = 0, **extra: object) -> dict:
    return {"id": "video_1", "object": "video", "status": status, "progress": progress, **extra}


class FakeServer:
    """A Videos API server in a function: `answers` maps (method, path) to a response factory;
    every request is recorded."""

    def __init__(self, answers: dict) -> None:
        self.answers = answers
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.get((request.method, request.url.path))
        if answer is None:
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no such route"}})
        return answer(request) if callable(answer) else answer

    def engine(self, **options: object) -> RemoteEngine:
        return RemoteEngine(URL, transport=httpx.MockTransport(self), **{"poll_interval": 0.01, **options})

    def sent(self, method: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method]


def completed_server(clip: bytes, content: object = None) -> FakeServer:
    """A job that is queued, in progress, then completed; `content` answers the download."""
    polls = iter([job("in_progress", 40, phase="denoise"), job("completed", 100, seed=42)])
    return FakeServer({
        ("POST", "/v1/videos"): httpx.Response(200, json=job()),
        ("GET", "/v1/videos/video_1"): lambda request: httpx.Response(200, json=next(polls)),
        ("GET", "/v1/videos/video_1/content"): content or httpx.Response(200, content=clip,
                                                                         headers={"content-type": "video/mp4"}),
        ("DELETE", "/v1/videos/video_1"): httpx.Response(200, json={"id": "video_1", "deleted": True}),
    })


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# ----------------------------------------------------------------------------- success

def test_a_completed_job_is_downloaded_atomically_and_decoded(tmp_path: Path, clip: bytes) -> None:
    server = completed_server(clip)
    events = []
    output = tmp_path / "out" / "fox.mp4"
    with server.engine() as engine:
        assert isinstance(engine, Engine) and engine.capabilities.remote
        result = engine.generate(fast_request(), output, on_progress=events.append)
    assert output.read_bytes() == clip
    assert leftovers(output.parent) == ["fox.mp4"]
    assert result.video_path == output and result.frames.shape == (22, 64, 96, 3)
    assert result.audio.shape[0] == 2 and result.audio.shape[1] == pytest.approx(22 / 24 * 32000, rel=0.05)
    # The body is exactly the wire module's, sent as JSON (the request has no files).
    post = server.sent("POST")[0]
    assert post.headers["content-type"] == "application/json"
    assert json.loads(post.content) == request_to_wire(fast_request(), model="MiniMax-H3").fields   # the fleet's default group
    phases = [e.phase for e in events]
    assert phases[0] == "queued on the server" and "denoise" in phases and phases[-1] == "download"
    assert [e.fraction for e in events if e.phase == "denoise"] == [0.4]


def test_no_local_engine_lock_is_taken(tmp_path: Path, clip: bytes) -> None:
    """The engine is the server's, which holds its own lock: a remote job runs while this
    machine's engine lock is held (by a local render, say) without waiting for it."""
    from h3bridge import engine_lock
    events = []
    with engine_lock():
        completed_server(clip).engine().generate(fast_request(), tmp_path / "a.mp4", want_frames=False,
                                                 on_progress=events.append)
    assert (tmp_path / "a.mp4").is_file()
    assert not any(event.phase == "waiting for the engine" for event in events)


def test_files_go_as_multipart_parts_named_by_the_wire_module(tmp_path: Path, clip: bytes) -> None:
    first = make_image(tmp_path / "first frame.png", size="96x64")
    last = make_image(tmp_path / "last.png", size="96x64", color="blue")
    server = completed_server(clip)
    request = fast_request(first_frame=first, last_frame=last)
    server.engine().generate(request, tmp_path / "a.mp4", want_frames=False, want_audio=False)
    post = server.sent("POST")[0]
    assert post.headers["content-type"].startswith("multipart/form-data")
    body = post.content
    assert b'name="input_reference"; filename="first frame.png"' in body
    assert b'name="last_frame"; filename="last.png"' in body
    assert first.read_bytes() in body and last.read_bytes() in body
    assert b'name="num_frames"\r\n\r\n22\r\n' in body
    assert str(tmp_path).encode() not in body       # a file's path never goes to the server


def test_the_key_comes_from_the_environment_and_goes_only_in_the_header(
        tmp_path: Path, clip: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_API_KEY", "sekrit-key-123")
    server = completed_server(clip)
    engine = server.engine()
    engine.generate(fast_request(), tmp_path / "a.mp4", want_frames=False, want_audio=False)
    assert {r.headers.get("authorization") for r in server.requests} == {"Bearer sekrit-key-123"}
    assert "sekrit" not in repr(engine)


# ----------------------------------------------------------------------------- refusals and failures

def test_a_400_is_a_request_error_with_the_servers_message_verbatim(tmp_path: Path) -> None:
    message = "frames=23 is not a legal H3 length; the next legal lengths are 22 and 39"
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(400, json={"error": {
        "code": "invalid_request", "message": message, "param": "num_frames", "hint": "use frames=22 or frames=39"}})})
    with pytest.raises(RequestError) as caught:
        server.engine().generate(fast_request(), tmp_path / "out" / "a.mp4")
    assert caught.value.message == message and caught.value.field == "num_frames"
    assert caught.value.hint == "use frames=22 or frames=39" and caught.value.before_start
    assert leftovers(tmp_path) == []          # nothing written, not even the output's folder


def test_fastapi_style_detail_bodies_are_read_too(tmp_path: Path) -> None:
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(400, json={"detail": "prompt is required"})})
    with pytest.raises(RequestError, match="^prompt is required$"):
        server.engine().generate(fast_request(), None)


@pytest.mark.parametrize("status", [401, 403])
def test_auth_refusals_say_to_set_the_environment_variable(tmp_path: Path, status: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_API_KEY", "wrong-key-456")
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(status, json={"error": {
        "code": "unauthorized", "message": "invalid API key"}})})
    with pytest.raises(RemoteAuthError) as caught:
        server.engine().generate(fast_request(), tmp_path / "a.mp4")
    error = caught.value
    assert error.status == status and error.before_start and error.engine_message == "invalid API key"
    assert URL in error.message and "H3BRIDGE_API_KEY" in error.hint
    assert "wrong-key-456" not in str(error)
    assert leftovers(tmp_path) == []


def test_a_missing_key_is_named_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("H3BRIDGE_API_KEY", raising=False)
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(401, json={"detail": "API key required"})})
    with pytest.raises(RemoteAuthError, match="without an API key"):
        server.engine().generate(fast_request(), None)
    assert "authorization" not in server.requests[0].headers


def test_a_404_on_submit_says_the_url_is_not_a_videos_api_server() -> None:
    server = FakeServer({})
    with pytest.raises(RemoteError) as caught:
        server.engine().generate(fast_request(), None)
    assert f"{URL}/v1/videos does not exist" in caught.value.message and caught.value.before_start
    assert "base URL" in caught.value.hint


def test_a_job_that_disappears_is_named(tmp_path: Path) -> None:
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(200, json=job()),
                         ("GET", "/v1/videos/video_1"): httpx.Response(404, json={"detail": "Video not found"})})
    with pytest.raises(RemoteError, match="no longer has job video_1") as caught:
        server.engine().generate(fast_request(), tmp_path / "a.mp4")
    assert not caught.value.before_start and leftovers(tmp_path) == []


def test_a_5xx_keeps_the_servers_message(tmp_path: Path) -> None:
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(500, text="Internal Server Error: disk full")})
    with pytest.raises(RemoteError) as caught:
        server.engine().generate(fast_request(), tmp_path / "a.mp4")
    assert caught.value.status == 500 and caught.value.engine_message == "Internal Server Error: disk full"
    assert "HTTP 500" in caught.value.message and leftovers(tmp_path) == []


def test_a_failed_job_carries_the_servers_message(tmp_path: Path) -> None:
    failed = job("failed", 30, error={"code": "engine_failed", "message": "h3 failed: cannot open FL2VA/dit.safetensors",
                                      "hint": "check the model"})
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(200, json=job()),
                         ("GET", "/v1/videos/video_1"): httpx.Response(200, json=failed)})
    with pytest.raises(RemoteError) as caught:
        server.engine().generate(fast_request(), tmp_path / "a.mp4")
    assert caught.value.engine_message == "h3 failed: cannot open FL2VA/dit.safetensors"
    assert caught.value.hint == "check the model" and not caught.value.before_start
    assert leftovers(tmp_path) == []


def test_a_form_only_server_gets_the_same_body_as_a_form(tmp_path: Path, clip: bytes) -> None:
    """vLLM-Omni reads /v1/videos as multipart/form-data: a JSON body is answered 422 before
    anything is queued, and the same fields go again as a form."""
    server = completed_server(clip)

    def form_only(request: httpx.Request) -> httpx.Response:
        if not request.headers["content-type"].startswith("multipart/form-data"):
            return httpx.Response(422, json={"detail": [{"loc": ["body", "prompt"], "msg": "Field required"}]})
        return httpx.Response(200, json=job())

    server.answers[("POST", "/v1/videos")] = form_only
    server.engine().generate(fast_request(), tmp_path / "a.mp4", want_frames=False, want_audio=False)
    json_post, form_post = server.sent("POST")
    assert json_post.headers["content-type"] == "application/json"
    assert b'name="prompt"\r\n\r\na red fox runs through snow\r\n' in form_post.content
    assert b'name="num_inference_steps"\r\n\r\n2\r\n' in form_post.content


def test_an_sglang_failed_job_without_an_error_code_is_read() -> None:
    failed = job("failed", 0, error={"message": "CUDA out of memory"})
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(200, json=job()),
                         ("GET", "/v1/videos/video_1"): httpx.Response(200, json=failed)})
    with pytest.raises(RemoteError) as caught:
        server.engine().generate(fast_request(), None)
    assert caught.value.engine_message == "CUDA out of memory"


def test_something_that_is_not_a_job_is_refused_by_name() -> None:
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(200, text="<html>router login</html>")})
    with pytest.raises(RemoteError, match="not a Videos API job"):
        server.engine().generate(fast_request(), None)


def test_connection_refused_names_the_url_and_the_fix(tmp_path: Path) -> None:
    with socket.socket() as probe:            # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RemoteUnreachableError) as caught:
        RemoteEngine(url).generate(fast_request(), tmp_path / "out" / "a.mp4")
    error = caught.value
    assert f"cannot reach the server at {url}" in error.message and "connection refused" in error.message
    assert "h3bridge serve" in error.hint and error.before_start
    assert leftovers(tmp_path) == []


class _DyingStream(httpx.SyncByteStream):
    """Half the clip, then the connection drops (a server killed mid-download)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __iter__(self):
        yield self.data[: len(self.data) // 2]
        raise httpx.ReadError("connection reset by peer")


def test_a_server_dying_mid_download_leaves_no_file(tmp_path: Path, clip: bytes) -> None:
    server = completed_server(clip, content=lambda request: httpx.Response(
        200, stream=_DyingStream(clip), headers={"content-length": str(len(clip))}))
    output = tmp_path / "new folder" / "a.mp4"
    with pytest.raises(RemoteUnreachableError, match="broke off"):
        server.engine().generate(fast_request(), output)
    assert leftovers(tmp_path) == []          # no partial file, no staging file, no folder we made


def test_a_download_cut_short_of_its_length_leaves_no_file(tmp_path: Path, clip: bytes) -> None:
    server = completed_server(clip, content=lambda request: httpx.Response(
        200, content=clip[:1000], headers={"content-length": str(len(clip))}))
    with pytest.raises(RemoteUnreachableError, match=f"ended after 1000 of {len(clip)} bytes"):
        server.engine().generate(fast_request(), tmp_path / "a.mp4")
    assert leftovers(tmp_path) == []


def test_an_existing_output_is_kept_when_the_job_fails(tmp_path: Path) -> None:
    output = tmp_path / "a.mp4"
    output.write_bytes(b"the user's clip")
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(500, text="boom")})
    with pytest.raises(RemoteError):
        server.engine().generate(fast_request(), output, overwrite=True)
    assert output.read_bytes() == b"the user's clip" and leftovers(tmp_path) == ["a.mp4"]


def test_an_existing_output_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    from h3bridge import OutputExistsError
    output = tmp_path / "a.mp4"
    output.write_bytes(b"the user's clip")
    server = FakeServer({})
    with pytest.raises(OutputExistsError):
        server.engine().generate(fast_request(), output)
    assert server.requests == [] and output.read_bytes() == b"the user's clip"


def test_a_bad_request_is_refused_here_before_anything_is_sent() -> None:
    server = FakeServer({})
    with pytest.raises(RequestError, match="frames=23 is not a legal H3 length"):
        server.engine().generate(fast_request(frames=23), None)
    assert server.requests == []


@pytest.mark.parametrize("url", ["render-mac:8000", "ftp://render-mac", "http://"])
def test_a_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(RequestError, match="http:// or https://|not a URL"):
        RemoteEngine(url)


# ----------------------------------------------------------------------------- cancel

def test_cancel_deletes_the_servers_job_and_keeps_nothing(tmp_path: Path) -> None:
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(200, json=job("in_progress", 10)),
                         ("DELETE", "/v1/videos/video_1"): httpx.Response(200, json={
                             "id": "video_1", "deleted": True, "object": "video.deleted"})})
    cancel = CancelToken()
    polled = threading.Event()

    def on_progress(event) -> None:
        if event.phase == "rendering on the server":
            polled.set()
            cancel.cancel()

    # The poll interval is long: the wait for the next poll is cut short by the cancel.
    with pytest.raises(GenerationCancelled):
        server.engine(poll_interval=30).generate(fast_request(), tmp_path / "a.mp4", on_progress=on_progress,
                                                 cancel=cancel)
    assert polled.is_set()
    assert [r.url.path for r in server.sent("DELETE")] == ["/v1/videos/video_1"]
    assert leftovers(tmp_path) == []


def test_cancel_during_the_download_deletes_the_job_and_the_partial_file(tmp_path: Path, clip: bytes) -> None:
    cancel = CancelToken()

    class Stream(httpx.SyncByteStream):
        def __iter__(self):
            yield clip[:100]
            cancel.cancel()
            yield clip[100:]

    server = completed_server(clip, content=lambda request: httpx.Response(200, stream=Stream()))
    with pytest.raises(GenerationCancelled):
        server.engine().generate(fast_request(), tmp_path / "a.mp4", cancel=cancel)
    assert len(server.sent("DELETE")) == 1 and leftovers(tmp_path) == []


def test_a_cancel_the_server_does_not_confirm_says_the_job_may_still_run(tmp_path: Path) -> None:
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(200, json=job("in_progress", 5)),
                         ("DELETE", "/v1/videos/video_1"): httpx.Response(503, text="overloaded")})
    cancel = CancelToken()
    with pytest.raises(GenerationCancelled, match="did not confirm deleting job video_1, which may still be running"):
        server.engine().generate(fast_request(), tmp_path / "a.mp4", on_progress=lambda event: cancel.cancel(),
                                 cancel=cancel)
    assert leftovers(tmp_path) == []


def test_frames_only_uses_a_temporary_mp4_that_is_removed(tmp_path: Path, clip: bytes,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    result = completed_server(clip).engine().generate(fast_request(), None, want_audio=False)
    assert result.video_path is None and result.frames.dtype == np.uint8 and result.frames.shape[0] == 22
    assert leftovers(tmp_path) == []


def test_remote_jobs_are_in_the_job_history_as_run_on_the_server(tmp_path: Path, clip: bytes) -> None:
    """The history records a remote job too (engine "remote"), with the server as its device,
    so its timings never pass for this machine's; a failed one keeps the server's words."""
    from h3bridge.history.store import HistoryStore
    completed_server(clip).engine().generate(fast_request(), tmp_path / "a.mp4", want_frames=False)
    failed = job("failed", 30, error={"code": "engine_failed", "message": "h3 failed: out of memory"})
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(200, json=job()),
                         ("GET", "/v1/videos/video_1"): httpx.Response(200, json=failed)})
    with pytest.raises(RemoteError):
        server.engine().generate(fast_request(), tmp_path / "b.mp4")
    rows = HistoryStore().recent_jobs()
    assert [(row.engine, row.outcome) for row in rows] == [("remote", "failed"), ("remote", "completed")]
    assert {row.device.name for row in rows} == {f"server {server.engine().base_url}"}
    assert rows[0].engine_message == "h3 failed: out of memory" and "denoise" in rows[1].phases


def test_a_job_names_the_model_a_fleet_proxy_routes_by(tmp_path: Path) -> None:
    """LiteLLM's proxy in front of an `h3bridge fleet` refuses a create without `model` ("Invalid model
    name passed in model=None", measured with 1.110.2 by bench/bench_fleet.py), and `story --remote`
    had no way to name one: with no model given, the job names the fleet's default group."""
    import json
    server = FakeServer({("POST", "/v1/videos"): httpx.Response(400, json={"error": {"code": "invalid_request",
                                                                                   "message": "stop here"}})})
    for engine, expected in ((server.engine(), "MiniMax-H3"), (server.engine(model="fleet-b"), "fleet-b")):
        with engine, pytest.raises((RemoteError, RequestError)):  # the 400, as the client reads it
            engine.generate(fast_request(), tmp_path / "x.mp4")
        assert json.loads(server.sent("POST")[-1].content)["model"] == expected
