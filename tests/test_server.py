"""`h3bridge serve` end to end over h3-sim, driven by the official `openai` client (and httpx where
the client cannot say it): submit, poll, list, download, delete; uploads; refusals; the API key."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from h3bridge import GenerationRequest, Reference, ReferenceKind, RequestError
from h3bridge.server.app import check_bind

from core_helpers import assert_group_gone, make_image, sim_engine_path
from server_helpers import (  # noqa: F401  (model: a fixture)
    KEY,
    ServerProcess,
    isolated_env,
    model,
    first_frame_rgb,
    h3bridge_program,
    mp4_frame_count,
    openai_client,
    wait_finished,
)

# openai marks its videos API deprecated (Sora's shutdown); the API shape is what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")

TINY = dict(size="96x64", extra_body={"frames": 22, "steps": 2})   # the cheapest legal clip
UPLOAD_LIMIT_BYTES = 20_000                                            # --max-upload-mb below


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Path):
    root = tmp_path_factory.mktemp("serve")
    with ServerProcess(root / "data", model, root / "logs", env=isolated_env(root),
                       extra_args=["--max-upload-mb", str(UPLOAD_LIMIT_BYTES / 1024 / 1024)]) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    return openai_client(server, KEY)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image(tmp_path_factory.mktemp("serve-media") / "red.png", size="96x64")


def test_the_openai_client_creates_polls_lists_downloads_and_deletes(server: ServerProcess, client) -> None:
    created = client.videos.create(prompt="a red fox runs through snow", **TINY)
    assert created.status in ("queued", "in_progress") and created.size == "96x64" and created.object == "video"
    finished = wait_finished(client, created.id)
    assert finished.status == "completed" and finished.progress == 100 and finished.error is None
    assert created.id in [video.id for video in client.videos.list(limit=100).data]
    content = client.videos.download_content(created.id).read()
    assert mp4_frame_count(content) == 22
    assert client.videos.delete(created.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(created.id)
    assert not (server.data_dir / "jobs" / created.id).exists()


def test_a_first_frame_uploads_as_multipart_and_reaches_the_engine(server: ServerProcess, client, image: Path) -> None:
    with open(image, "rb") as handle:
        created = client.videos.create(prompt="the red frame comes alive", input_reference=handle, **TINY)
    assert wait_finished(client, created.id).status == "completed"
    stored = server.data_dir / "jobs" / created.id / "inputs" / "00.upload.png"
    assert stored.read_bytes() == image.read_bytes()
    # h3-sim's first frame IS the anchor: the clip starts red.
    first = first_frame_rgb(client.videos.download_content(created.id).read())
    red, green, blue = (float(first[..., channel].mean()) for channel in range(3))
    assert red > 180 and green < 70 and blue < 70, (red, green, blue)


def test_a_json_body_carries_files_as_data_urls(server: ServerProcess, client, image: Path) -> None:
    import base64
    data_url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    body = {"prompt": "the red frame, from JSON", "size": "96x64", "num_frames": 22, "num_inference_steps": 2,
            "input_reference": {"image_url": data_url}}
    response = httpx.post(f"{server.api}/videos", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert response.status_code == 200, response.text
    video_id = response.json()["id"]
    assert wait_finished(client, video_id).status == "completed"
    assert (server.data_dir / "jobs" / video_id / "inputs" / "00.upload").read_bytes() == image.read_bytes()
    for bad in ("https://example.com/frame.png", "/etc/passwd"):
        response = httpx.post(f"{server.api}/videos", json=body | {"input_reference": {"image_url": bad}},
                              headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == "input_reference"


def refusal(call) -> dict:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    assert caught.value.status_code == 400
    return caught.value.body     # openai's error: the body's "error" object


def library_message(**fields) -> str:
    with pytest.raises(RequestError) as caught:
        GenerationRequest("x", **fields).validate()
    return caught.value.message


def test_every_class_of_bad_request_is_refused_with_generates_message(server: ServerProcess, client,
                                                                      image: Path, tmp_path: Path) -> None:
    before = set(os.listdir(server.data_dir / "jobs"))
    frames = refusal(lambda: client.videos.create(prompt="x", size="96x64", extra_body={"frames": 23}))
    assert frames["message"] == library_message(width=96, height=64, frames=23) and frames["param"] == "frames"
    canvas = refusal(lambda: client.videos.create(prompt="x", size="100x64", extra_body={"frames": 22}))
    assert canvas["message"] == library_message(width=100, height=64) and "96 and 128" in canvas["message"]
    # A client path is never opened: naming a file (as SGLang's JSON does) instead of uploading it
    # is refused as missing.
    missing = refusal(lambda: client.videos.create(prompt="x", size="96x64",
                                                   extra_body={"frames": 22, "input_reference": "frame.png"}))
    assert missing["param"] == "input_reference" and "'frame.png' is not an uploaded file" in missing["message"]
    # An upload h3 could not read gets generate's own words for the file, named as the client sent it.
    text = tmp_path / "notes.png"
    text.write_text("not an image\n")
    with open(text, "rb") as handle:
        unreadable = refusal(lambda: client.videos.create(prompt="x", input_reference=handle, **TINY))
    expected = library_message(first_frame=text).replace(str(text), "input_reference upload notes.png")
    assert unreadable["message"] == expected and str(server.data_dir) not in unreadable["message"]
    # 13 references: the request's own limit, before anything is queued.
    references = tuple(Reference(ReferenceKind.IMAGE, image) for _ in range(13))
    files = [("ref_image", (f"r{i}.png", image.read_bytes(), "image/png")) for i in range(13)]
    response = httpx.post(f"{server.api}/videos", data={"prompt": "x", "size": "96x64", "frames": "22"},
                          files=files, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == library_message(width=96, height=64, references=references)
    # An upload over the server's limit.
    big = tmp_path / "big.png"
    big.write_bytes(image.read_bytes() + b"\0" * (UPLOAD_LIMIT_BYTES + 1))
    with open(big, "rb") as handle:
        oversized = refusal(lambda: client.videos.create(prompt="x", input_reference=handle, **TINY))
    assert oversized["param"] == "input_reference" and "over this server's limit" in oversized["message"]
    # Nothing was queued or kept for any of them.
    assert set(os.listdir(server.data_dir / "jobs")) == before


def test_upload_names_are_never_paths(server: ServerProcess, image: Path, tmp_path: Path) -> None:
    target = tmp_path / "escaped.png"
    names = [f"../../../../../../..{target}", str(target), "..\\..\\evil.png", "a/../../b.png\0.png"]
    for name in names:
        response = httpx.post(f"{server.api}/videos", data={"prompt": "x", "size": "96x64", "frames": "22",
                                                            "steps": "2"},
                              files={"input_reference": (name, image.read_bytes(), "image/png")},
                              headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
        assert response.status_code == 200, response.text
        inputs = server.data_dir / "jobs" / response.json()["id"] / "inputs"
        assert [p.name for p in inputs.iterdir()] == ["00.upload.png"]
    assert not target.exists()
    assert {p.name for p in server.data_dir.iterdir()} <= {"jobs", "jobs.sqlite3", "jobs.sqlite3-wal",
                                                           "jobs.sqlite3-shm", "serve.lock"}


def test_a_key_is_required_and_compared(server: ServerProcess, image: Path) -> None:
    for key in (None, "wrong", KEY + "x", KEY[:-1]):
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        for method, path in (("GET", "/videos"), ("POST", "/videos"), ("GET", "/videos/video_" + "0" * 32)):
            response = httpx.request(method, server.api + path, headers=headers, json={"prompt": "x"}, timeout=30)
            assert response.status_code == 401, (key, method, path)
            assert response.json()["error"]["code"] == "unauthorized"
    with pytest.raises(openai.AuthenticationError):
        openai_client(server, "wrong").videos.list()
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200     # readiness needs no key
    assert httpx.get(f"{server.api}/videos", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).status_code == 200


def test_any_bind_but_loopback_needs_a_key(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::", "192.168.1.20", "example.local"):
        with pytest.raises(RequestError) as caught:
            check_bind(host, None)
        assert caught.value.field == "api_key"
        check_bind(host, KEY)
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_bind(host, None)
    env = {k: v for k, v in os.environ.items() if k != "H3BRIDGE_API_KEY"}
    run = subprocess.run([h3bridge_program(), "serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path / "d")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 2 and "without an API key" in run.stderr and "H3BRIDGE_API_KEY" in run.stderr
    assert not (tmp_path / "d").exists()


def test_unknown_ids_and_unfinished_content(server: ServerProcess, client) -> None:
    for video_id in ("video_" + "0" * 32, "../jobs.sqlite3", "video_..%2F..%2Fjobs.sqlite3"):
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(video_id)
        with pytest.raises(openai.NotFoundError):
            client.videos.delete(video_id)


@pytest.fixture
def hanging_server(tmp_path: Path, model: Path):
    env = isolated_env(tmp_path) | {"H3_SIM_HANG_PHASE": "refine text", "H3_SIM_HANG_NOTICE": str(tmp_path / "hung")}
    with ServerProcess(tmp_path / "data", model, tmp_path / "logs", env=env) as process:
        yield process


def test_delete_stops_a_running_job_and_drops_a_queued_one(hanging_server: ServerProcess, tmp_path: Path) -> None:
    from core_helpers import wait_until
    client = openai_client(hanging_server, KEY)
    running = client.videos.create(prompt="this one hangs", **TINY)
    queued = client.videos.create(prompt="this one waits", **TINY)
    notice = tmp_path / "hung"
    assert wait_until(notice.exists, timeout=60), "the engine never reached its hang"
    engine_pid = int(notice.read_text())
    assert client.videos.retrieve(running.id).status == "in_progress"
    assert client.videos.retrieve(queued.id).status == "queued"
    assert client.videos.delete(queued.id).deleted
    assert client.videos.delete(running.id).deleted      # returns once the engine is stopped
    assert_group_gone(engine_pid)
    for video_id in (running.id, queued.id):
        assert not (hanging_server.data_dir / "jobs" / video_id).exists()
        with pytest.raises(openai.NotFoundError):
            client.videos.retrieve(video_id)
    assert client.videos.list().data == []


def test_an_engine_failure_fails_the_job_with_h3s_words(tmp_path: Path, model: Path) -> None:
    env = isolated_env(tmp_path) | {"H3_SIM_FAIL_PHASE": "refine text", "H3_SIM_FAIL_MESSAGE": "simulated Metal fault"}
    with ServerProcess(tmp_path / "data", model, tmp_path / "logs", env=env) as process:
        client = openai_client(process, KEY)
        failed = wait_finished(client, client.videos.create(prompt="this one fails", **TINY).id)
        assert failed.status == "failed" and failed.error.code == "engine_failed"
        assert "simulated Metal fault" in failed.error.message
        response = httpx.get(f"{process.api}/videos/{failed.id}/content", headers={"Authorization": f"Bearer {KEY}"},
                             timeout=30)
        assert response.status_code == 409 and response.json()["error"]["code"] == "not_ready"


def test_health_reports_the_models_state(server: ServerProcess, model: Path) -> None:
    from h3bridge.model.inventory import inspect_model
    body = httpx.get(f"{server.url}/health", timeout=30).json()
    assert body["model"] == {"ready": True, "references": inspect_model(model).has_ref2va, "problems": 0}


def test_a_folder_without_a_model_is_refused_at_start(tmp_path: Path) -> None:
    """`serve -d EMPTY_FOLDER` started, reported healthy and then blamed every client with a 400."""
    empty = tmp_path / "empty"
    empty.mkdir()
    run = subprocess.run([h3bridge_program(), "serve", "--port", "0", "--data-dir", str(tmp_path / "d"),
                          "--engine-path", str(sim_engine_path()), "--model-dir", str(empty)],
                         capture_output=True, text=True, env=isolated_env(tmp_path), timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith(f"h3bridge: {empty} is not a MiniMax-H3 model directory")
    assert "fix: " in run.stderr and "listening" not in run.stderr
    assert not (tmp_path / "d").exists()


def test_force_starts_with_a_broken_model_and_health_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with ServerProcess(tmp_path / "data", empty, tmp_path / "logs", env=isolated_env(tmp_path),
                       extra_args=["--force"]) as process:
        body = httpx.get(f"{process.url}/health", timeout=30).json()
        assert body["model"] == {"ready": False, "references": False, "problems": 1}
        assert "--force: starting with a model that cannot run jobs" in process.log()
