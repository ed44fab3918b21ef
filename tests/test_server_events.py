"""`GET /v1/videos/{id}/events` on `h3bridge serve` and RemoteEngine following it: events in order
with step and fraction, previews from a library-engine server (the libh3 double), polling for a
server without the stream, a dropped stream resumed with Last-Event-ID, a cancel mid-stream, the
key and the bound on open streams.

Servers run in this process (uvicorn in a thread) or as children (server_helpers), each on a free
loopback port with folders under tmp_path; HOME is a temporary folder: safe under pytest-xdist."""
from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest
from httpx_sse import connect_sse

from h3bridge import CancelToken, GenerationCancelled, RemoteEngine
from h3bridge.engines.oneshot import OneShotEngine
from h3bridge.server.app import ServeSettings, create_app
from h3bridge.server.jobs import JobStore
from h3bridge.server.progress_feed import ProgressHub, StreamSlots
from h3bridge.wire.videos import request_to_wire
from h3bridge.server.worker import Worker

from core_helpers import fast_request, isolated_home, model_dir, sim_engine_path  # noqa: F401 (fixtures)
from server_helpers import KEY

WAIT = 120.0       # a safety net for a loaded machine, never an expected time
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(autouse=True)
def _home(isolated_home: Path) -> None:
    """Every test here with its own HOME and cache."""


@dataclass
class Serving:
    url: str
    worker: Worker

    def start_when_watched(self, count: int = 1) -> None:
        """Start the worker once `count` event streams follow jobs: a stream then sees every event
        of its job from the first (a job that ran before the stream opened shows only its end)."""
        deadline = time.monotonic() + WAIT
        while len(self.worker.events.watched()) < count:
            assert time.monotonic() < deadline, "no stream ever followed the job"
            time.sleep(0.01)
        self.worker.start()


@contextlib.contextmanager
def serving(data: Path, engine, *, previews: bool = False, slots: StreamSlots | None = None,
            start: bool = True) -> Iterator[Serving]:
    """`h3bridge serve`'s app and worker over `engine`, in this process on a free loopback port
    (`start=False`: the worker starts with Serving.start_when_watched)."""
    import uvicorn
    store = JobStore(data)
    worker = Worker(store, engine, previews=previews)
    settings = ServeSettings(data_dir=data, api_key=KEY, stream_slots=slots or StreamSlots())
    app = create_app(settings, store, worker)
    if start:
        worker.start()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="test-serve", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server never started"
            time.sleep(0.01)
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        yield Serving(f"http://{host}:{port}", worker)
    finally:
        server.should_exit = True
        thread.join(30)
        if worker._thread.is_alive() or start:
            worker.stop()
        else:
            worker.engine.close()
        store.close()


def in_thread(action) -> tuple[threading.Thread, list]:
    """Run `action()` in a thread; its result (or exception) lands in the returned list."""
    out: list = []

    def run() -> None:
        try:
            out.append(action())
        except BaseException as error:      # noqa: BLE001 - handed to the test
            out.append(error)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def joined(thread: threading.Thread, out: list):
    thread.join(WAIT)
    assert not thread.is_alive(), "the client never finished"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def submit(url: str, request) -> str:
    response = httpx.post(f"{url}/v1/videos", json=request_to_wire(request).fields, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def read_stream(url: str, job_id: str, *, headers: dict[str, str] | None = None,
                until=lambda event: False) -> list:
    """Every event of the job's stream until its end (or `until` says stop)."""
    seen = []
    with httpx.Client(timeout=WAIT) as client, \
            connect_sse(client, "GET", f"{url}/v1/videos/{job_id}/events", headers={**AUTH, **(headers or {})}) as source:
        assert source.response.status_code == 200, source.response.read()
        for event in source.iter_sse():
            seen.append(event)
            if event.event == "end" or until(event):
                break
    return seen


def seq(event) -> int:
    return int(event.id.rpartition("-")[2])


@pytest.fixture
def sim_engine(model_dir: Path) -> OneShotEngine:   # noqa: F811
    return OneShotEngine(sim_engine_path(), model_dir)


# ----------------------------------------------------------------------------- the stream itself

def test_events_arrive_in_order_with_step_and_fraction_then_one_end(tmp_path: Path, sim_engine) -> None:
    with serving(tmp_path / "data", sim_engine, start=False) as server:
        job_id = submit(server.url, fast_request(seed=5))
        reading = in_thread(lambda: read_stream(server.url, job_id))
        server.start_when_watched()
        events = joined(*reading)
    assert [event.event for event in events][-1] == "end"
    assert [seq(event) for event in events] == sorted(seq(event) for event in events)
    progress = [json.loads(event.data) for event in events if event.event == "progress"]
    running = [item for item in progress if item["status"] == "in_progress"]
    assert running, events
    assert any(item["phase"] == "denoise" and item["total"] == 2 and 1 <= item["done"] <= 2 for item in running)
    fractions = [item["fraction"] for item in running]
    assert fractions == sorted(fractions) and 0.0 < fractions[-1] <= 1.0
    end = json.loads(events[-1].data)
    assert end["status"] == "completed" and end["job"]["id"] == job_id and end["job"]["status"] == "completed"
    # a stream opened after the job ended (here: after a restart) says so at once, with the job
    with serving(tmp_path / "data", sim_engine) as server:
        again = read_stream(server.url, job_id)
    assert [event.event for event in again] == ["end"] and json.loads(again[0].data)["status"] == "completed"


def test_the_stream_needs_the_key_and_a_job(tmp_path: Path, sim_engine) -> None:
    with serving(tmp_path / "data", sim_engine) as server:
        url = server.url
        job_id = submit(url, fast_request())
        refused = httpx.get(f"{url}/v1/videos/{job_id}/events", timeout=30)
        assert refused.status_code == 401
        missing = httpx.get(f"{url}/v1/videos/video_0123456789abcdef0123456789abcdef/events", headers=AUTH,
                            timeout=30)
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "video_id"


def test_open_streams_are_bounded_per_client_and_freed_when_they_end(tmp_path: Path, sim_engine) -> None:
    slots = StreamSlots(total=4, per_client=1)
    with serving(tmp_path / "data", sim_engine, slots=slots) as server:
        url = server.url
        job_id = submit(url, fast_request())
        with httpx.Client(timeout=WAIT) as client, \
                connect_sse(client, "GET", f"{url}/v1/videos/{job_id}/events", headers=AUTH) as first:
            assert first.response.status_code == 200
            second = httpx.get(f"{url}/v1/videos/{job_id}/events", headers=AUTH, timeout=30)
            assert second.status_code == 429 and second.headers["retry-after"] == "5"
            assert "at most 1 per client" in second.json()["error"]["message"]
        deadline = time.monotonic() + WAIT       # the server notices the closed stream, and frees its slot
        while slots.held("127.0.0.1"):
            assert time.monotonic() < deadline, "the closed stream kept its slot"
            time.sleep(0.02)
        assert read_stream(url, job_id)[-1].event == "end"


def test_a_reconnect_with_last_event_id_gets_only_what_it_missed(tmp_path: Path, sim_engine) -> None:
    with serving(tmp_path / "data", sim_engine, start=False) as server:
        url = server.url
        job_id = submit(url, fast_request())
        # until the first step the engine reported (the row's state, sent first, has no step total)
        reading = in_thread(lambda: read_stream(url, job_id, until=lambda event: event.event == "progress"
                                                and json.loads(event.data)["total"] > 0))
        server.start_when_watched()
        head = joined(*reading)
        rest = read_stream(url, job_id, headers={"Last-Event-ID": head[-1].id})
        stale = read_stream(url, job_id, headers={"Last-Event-ID": "another-run-7"})
    assert rest[-1].event == "end" and all(seq(event) > seq(head[-1]) for event in rest), (head, rest)
    # an id from another run of the server: the state now (here: the end), not an error
    assert stale[-1].event == "end"


def test_hub_keeps_a_bounded_history_and_the_newest_preview(tmp_path: Path) -> None:
    from h3bridge.progress import PreviewFrame, ProgressEvent
    from h3bridge.server import progress_feed
    from h3bridge.wire.events import PREVIEW_MAX_SIDE
    hub = ProgressHub()
    for step in range(progress_feed.FEED_EVENTS + 10):
        hub.progress("job", ProgressEvent("denoise", step, 1000, step / 1000, 1.0), progress=0)
    for step in range(3):
        hub.preview("job", PreviewFrame(step, 3, 0, np.full((1200, 40, 3), step, np.uint8)))
    behind = hub.since("job", 1)           # fell behind the kept history: the newest state only
    assert [event.kind for event in behind] == ["progress", "preview"]
    assert json.loads(behind[0].data)["done"] == progress_feed.FEED_EVENTS + 9
    preview = json.loads(behind[1].data)
    assert preview["step"] == 2 and max(preview["width"], preview["height"]) <= PREVIEW_MAX_SIDE


# ----------------------------------------------------------------------------- RemoteEngine

def test_remote_engine_follows_the_stream_instead_of_polling(tmp_path: Path, sim_engine) -> None:
    events = []
    with serving(tmp_path / "data", sim_engine, start=False) as server, \
            RemoteEngine(server.url, api_key=KEY) as engine:
        engine._poll = None      # a poll would fail the test: TypeError, 'NoneType' is not callable
        rendering = in_thread(lambda: engine.generate(fast_request(seed=9), tmp_path / "clip.mp4",
                                                      on_progress=events.append))
        server.start_when_watched()
        result = joined(*rendering)
    assert result.video_path == tmp_path / "clip.mp4" and result.frames.shape[0] == 22 and result.seed == 9
    assert any(event.phase == "denoise" and event.total == 2 for event in events)


def test_remote_engine_polls_a_server_without_the_stream(tmp_path: Path) -> None:
    """A server of the Videos API that has no /events (an older h3bridge, vLLM-Omni, SGLang):
    the first job asks once, and from then on the engine polls without asking again."""
    from core_helpers import ffmpeg
    from test_remote import completed_server, job
    mp4 = ffmpeg(tmp_path / "clip.mp4", "-f", "lavfi", "-i", "testsrc=s=96x64:r=24:d=0.9166667", "-f", "lavfi",
                 "-i", "sine=sample_rate=32000:d=0.9166667", "-ac", "2", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                 "-c:a", "aac").read_bytes()
    server = completed_server(mp4)
    with server.engine() as engine:
        engine.generate(fast_request(), tmp_path / "one.mp4")
        polls = [r for r in server.sent("GET") if r.url.path == "/v1/videos/video_1"]
        asked = [r for r in server.sent("GET") if r.url.path.endswith("/events")]
        assert len(polls) == 2 and len(asked) == 1
        server.answers[("GET", "/v1/videos/video_1")] = httpx.Response(200, json=job("completed", 100))
        engine.generate(fast_request(), tmp_path / "two.mp4")
    assert len([r for r in server.sent("GET") if r.url.path.endswith("/events")]) == 1


def test_a_busy_stream_is_polled_for_that_job_and_asked_again_for_the_next(tmp_path: Path) -> None:
    """429 (too many open streams) says nothing about the server's streams in general: that job is
    polled, and the next job asks for its stream again."""
    from core_helpers import ffmpeg
    from test_remote import completed_server, job
    mp4 = ffmpeg(tmp_path / "clip.mp4", "-f", "lavfi", "-i", "testsrc=s=96x64:r=24:d=0.9166667", "-f", "lavfi",
                 "-i", "sine=sample_rate=32000:d=0.9166667", "-ac", "2", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                 "-c:a", "aac").read_bytes()
    server = completed_server(mp4)
    server.answers[("GET", "/v1/videos/video_1/events")] = httpx.Response(
        429, headers={"retry-after": "5"}, json={"error": {"code": "invalid_request", "message": "too many"}})
    with server.engine() as engine:
        engine.generate(fast_request(), tmp_path / "one.mp4")
        server.answers[("GET", "/v1/videos/video_1")] = httpx.Response(200, json=job("completed", 100))
        engine.generate(fast_request(), tmp_path / "two.mp4")
    assert len([r for r in server.sent("GET") if r.url.path.endswith("/events")]) == 2


class DropFirstStream(httpx.HTTPTransport):
    """A real transport that breaks the first event stream after its second event (as a proxy or
    a network would), and records each stream's Last-Event-ID."""

    def __init__(self) -> None:
        super().__init__()
        self.streams: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if not request.url.path.endswith("/events"):
            return response
        self.streams.append(request.headers.get("last-event-id"))
        if len(self.streams) > 1:
            return response
        inner = response.stream

        class Breaking(httpx.SyncByteStream):
            def __iter__(self):
                events = 0
                for chunk in inner:
                    yield chunk
                    events += chunk.count(b"event:")
                    if events >= 2:
                        raise httpx.ReadError("connection reset by the test")

            def close(self) -> None:
                inner.close()

        return httpx.Response(response.status_code, headers=response.headers, stream=Breaking(),
                              extensions=response.extensions, request=request)


def test_a_dropped_stream_resumes_with_last_event_id_and_keeps_the_result(tmp_path: Path, sim_engine) -> None:
    transport = DropFirstStream()
    events = []
    with serving(tmp_path / "data", sim_engine, start=False) as server, \
            RemoteEngine(server.url, api_key=KEY, transport=transport) as engine:
        engine._poll = None      # resumed through the stream, not by polling
        rendering = in_thread(lambda: engine.generate(fast_request(seed=3), tmp_path / "clip.mp4",
                                                      on_progress=events.append))
        server.start_when_watched()
        result = joined(*rendering)
    assert len(transport.streams) >= 2 and transport.streams[0] is None and transport.streams[1]
    assert result.frames.shape[0] == 22 and (tmp_path / "clip.mp4").stat().st_size > 0
    assert any(event.phase == "denoise" for event in events)


def test_cancel_mid_stream_deletes_the_job_and_ends_every_stream(tmp_path: Path, model_dir: Path,  # noqa: F811
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_HANG_PHASE", "denoise:2")      # the job stops progressing mid-denoise
    engine = OneShotEngine(sim_engine_path(), model_dir)
    cancel = CancelToken()
    watcher: list = []
    with serving(tmp_path / "data", engine) as server, RemoteEngine(server.url, api_key=KEY) as remote:
        url = server.url

        def on_progress(event) -> None:
            if event.phase == "denoise" and event.done >= 2 and not cancel.cancelled:
                job_id = httpx.get(f"{url}/v1/videos", headers=AUTH, timeout=30).json()["data"][0]["id"]
                started = threading.Event()

                def watch() -> None:
                    watcher.extend(read_stream(url, job_id, until=lambda e: started.set() or False))
                threading.Thread(target=watch, daemon=True).start()
                assert started.wait(WAIT)
                watcher.append(job_id)
                cancel.cancel()

        began = time.monotonic()
        with pytest.raises(GenerationCancelled):
            remote.generate(fast_request(), tmp_path / "clip.mp4", on_progress=on_progress, cancel=cancel)
        job_id = next(item for item in watcher if isinstance(item, str))
        assert httpx.get(f"{url}/v1/videos/{job_id}", headers=AUTH, timeout=30).status_code == 404
        deadline = time.monotonic() + WAIT
        while not any(getattr(item, "event", None) == "end" for item in watcher):
            assert time.monotonic() < deadline, watcher
            time.sleep(0.02)
    end = next(item for item in watcher if getattr(item, "event", None) == "end")
    assert json.loads(end.data)["status"] == "cancelled"
    assert not (tmp_path / "clip.mp4").exists()
    assert time.monotonic() - began < WAIT


# ----------------------------------------------------------------------------- previews

def test_a_library_engine_server_streams_its_previews(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    from double_helpers import assert_streamed_previews_match, double_library_path, local_previews
    from h3bridge import LibraryEngine
    request = fast_request(seed=21)
    with LibraryEngine(double_library_path(), model_dir, idle_timeout=120) as library:
        local = local_previews(request, model_dir, library)
        remote_previews: list = []
        with serving(tmp_path / "data", library, previews=True, start=False) as server, \
                RemoteEngine(server.url, api_key=KEY) as remote:
            rendering = in_thread(lambda: remote.generate(request, tmp_path / "clip.mp4",
                                                          on_preview=remote_previews.append))
            server.start_when_watched()
            joined(*rendering)
    assert_streamed_previews_match(local, remote_previews)


def test_comfy_remote_mode_shows_the_servers_previews_and_logs_nothing_per_event(
        tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch,   # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """H3 Generate in remote mode (adapter.run_generate, as the node calls it) on a library-engine
    server: the previews reach the node's preview callback, and nothing reaches ComfyUI's console
    (INFO and above) per event or poll."""
    import logging

    from double_helpers import double_library_path
    from h3bridge import LibraryEngine
    from h3bridge.comfy import adapter
    monkeypatch.setenv("H3BRIDGE_API_KEY", KEY)
    settings = adapter.GenerateSettings(prompt="a red fox", preset="preview", width=96, height=64,
                                        length_unit="frames", frames=22, ssd_streaming="auto")
    previews: list = []
    progress: list = []
    caplog.set_level(logging.INFO)
    with LibraryEngine(double_library_path(), model_dir, idle_timeout=120) as library, \
            serving(tmp_path / "data", library, previews=True, start=False) as server:
        handle = adapter.check_engine_settings("", "", adapter.REMOTE, [], remote_url=server.url)
        rendering = in_thread(lambda: adapter.run_generate(
            handle, settings, adapter.GenerateInputs(), scratch_parent=tmp_path / "scratch",
            output_dir=tmp_path / "out", want_image=False, on_progress=progress.append, on_preview=previews.append))
        server.start_when_watched()
        outputs = joined(*rendering)
    assert outputs.video_path.exists()
    assert previews and all(p.image.shape == (64, 96, 3) for p in previews)
    assert len(progress) > 3
    chatter = [record for record in caplog.records
               if record.levelno >= logging.INFO and record.name.split(".")[0] in ("httpx", "httpcore", "h3bridge",
                                                                                   "httpx_sse")]
    assert chatter == [], [record.getMessage() for record in chatter]
