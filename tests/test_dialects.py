"""The peers' dialect, both ways (issue 23 item 1): vLLM-Omni's and SGLang's MiniMax-H3 requests at
`h3bridge serve`, and RemoteEngine speaking theirs.

(a) every request recorded from the peers' recipes, examples and docs (tests/fixtures/peers/*_requests.json,
    source and commit named per example) is accepted, as the clip it describes, or refused with HTTP 400
    naming the field, in the error shape that peer's clients read; the app runs in-process over a real
    JobStore with no worker, so nothing renders;
(b) what RemoteEngine sends in each dialect keeps the peers' request models, encoded from their source
    in tests/fixtures/peers/request_models.json (their code is not vendored), and what it cannot
    express is refused before anything is sent;
(c) RemoteEngine in each dialect drives a real `h3bridge serve` child (free loopback port, its own
    folders) through create, poll and download, the server answering in that dialect; and the
    synchronous variant answers the MP4 itself.
"""
from __future__ import annotations

import base64
import email.parser
import json
import re
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3bridge import GenerationRequest, RemoteEngine, RequestError
from h3bridge.request import Reference, ReferenceKind
from h3bridge.server.app import ServeSettings, create_app
from h3bridge.server.jobs import JobStore
from h3bridge.wire.peers import AUDIO_FLOW_SHIFT, VIDEO_FLOW_SHIFT, job_from_peer
from h3bridge.server.uploads import MiB, UploadLimits
from h3bridge.server.worker import Worker
from h3bridge.sim.fixture import write_fixture_model

from core_helpers import fast_request, make_audio, make_image, make_video
from remote_helpers import KEY, key, ServerProcess, start_server  # noqa: F401 (key: a fixture)
from server_helpers import mp4_frame_count

PEERS = Path(__file__).parent / "fixtures" / "peers"
VLLM = json.loads((PEERS / "vllm_omni_requests.json").read_text())["examples"]
SGLANG = json.loads((PEERS / "sglang_requests.json").read_text())["examples"]
MODELS = json.loads((PEERS / "request_models.json").read_text())
# The shortest clip the peers render (4 s, recipe): 107 frames is the first legal h3 length past it.
PEER_FRAMES = 107


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("peer-media")
    return {"image": make_image(root / "ref.png"), "image_wide": make_image(root / "wide.png", size="96x64"),
            "video": make_video(root / "clip.mp4", 3.0), "video_mov": make_video(root / "clip.mov", 3.0),
            "audio": make_audio(root / "voice.wav", 3.0)}


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory):
    data_dir = tmp_path_factory.mktemp("dialect-serve")
    store = JobStore(data_dir)
    # No worker runs here, so every accepted body stays queued: no queue bound (serve --max-queued,
    # tested in test_server_queue_bound.py), or the module's hundreds of bodies would meet it.
    app = create_app(ServeSettings(data_dir=data_dir, limits=UploadLimits(max_file_bytes=8 * MiB), max_queued=None),
                     store, Worker(store, engine=None))  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    store.close()


def data_url(path: Path) -> str:
    kind = {".png": "image/png", ".wav": "audio/wav", ".mp4": "video/mp4"}[path.suffix]
    return f"data:{kind};base64," + base64.b64encode(path.read_bytes()).decode()


def _file_for(kind: str, filename: str, files: dict[str, Path]) -> Path:
    if kind == "video":
        return files["video_mov"] if filename.endswith(".mov") else files["video"]
    return files[kind]


def post_vllm(client: TestClient, example: dict, files: dict[str, Path]):
    fields = [(name, re.sub(r"@data-url:(\w+)", lambda m: data_url(files[m[1]]), value))
              for name, value in example["fields"]]
    parts = [(name, (None, value)) for name, value in fields]
    parts += [(part, (filename, _file_for(kind, filename, files).read_bytes(), mime))
              for part, kind, filename, mime in example["files"]]
    return client.post("/v1/videos", files=parts)


def _with_data_urls(value, files: dict[str, Path]):
    if isinstance(value, dict):
        return {k: _with_data_urls(v, files) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_data_urls(v, files) for v in value]
    if isinstance(value, str) and value.startswith("@data-url:"):
        return data_url(files[value.split(":", 1)[1]])
    return value


# ----------------------------------------------------------------------------- (a) their requests at our server

SECOND_STR = re.compile(r"^[1-9]\d*$")      # vllm_omni protocol/videos.py SecondStr


def check_vllm_job(job: dict) -> None:
    """vLLM-Omni's VideoResponse (protocol/videos.py): what its clients validate."""
    assert job["object"] == "video" and job["status"] in ("queued", "in_progress", "completed", "failed")
    assert SECOND_STR.match(job["seconds"]), job["seconds"]
    assert re.fullmatch(r"\d+x\d+", job["size"]) and isinstance(job["progress"], int)
    assert job["media_type"] == "video/mp4" and isinstance(job["prompt"], str) and isinstance(job["model"], str)
    assert job["error"] is None or (isinstance(job["error"]["message"], str)
                                    and isinstance(job["error"]["code"], (int, str)))


@pytest.mark.parametrize("example", VLLM, ids=[e["name"] for e in VLLM])
def test_each_vllm_omni_example_is_accepted_or_refused_naming_its_field(app_client, files, example) -> None:
    response = post_vllm(app_client, example, files)
    expect = example["expect"]
    if "refused" in expect:
        assert response.status_code == 400, response.text[:600]
        error = response.json()["error"]
        assert error["param"] == expect["refused"], error
        assert error["message"] and error["hint"]
        # vLLM's ErrorResponse carries the HTTP status as its code; a body with no field only vLLM-Omni
        # has (the generic Wan2.2 examples) is h3bridge's own dialect, answered as always.
        assert error["code"] == (400 if example.get("answers_as", "vllm-omni") == "vllm-omni" else "invalid_request")
        return
    assert response.status_code == 200, response.text[:800]
    job = response.json()
    check_vllm_job(job)
    for name, value in expect["accepted"].items():
        assert job[name] == value, (name, job)
    # Polled, it answers in the same dialect.
    again = app_client.get(f"/v1/videos/{job['id']}").json()
    check_vllm_job(again)
    assert again["seconds"] == job["seconds"] == str(round(job["num_frames"] / 24))


@pytest.mark.parametrize("example", SGLANG, ids=[e["name"] for e in SGLANG])
def test_each_sglang_example_is_accepted_or_refused_naming_its_field(app_client, files, example) -> None:
    response = app_client.post("/v1/videos", json=_with_data_urls(example["json"], files))
    expect = example["expect"]
    if "refused" in expect:
        assert response.status_code == 400, response.text[:600]
        body = response.json()
        assert body["error"]["param"] == expect["refused"], body
        if "task" in example["json"]:          # SGLang's own shape: FastAPI's {"detail": message}
            assert body["detail"] == body["error"]["message"]
        return
    assert response.status_code == 200, response.text[:800]
    job = response.json()
    # SGLang's VideoResponse (protocol.py): seconds as its video adapter writes them.
    assert job["quality"] == "standard" and job["status"] == "queued"
    assert float(job["seconds"]) == pytest.approx(job["num_frames"] / 24, abs=1e-6)
    for name, value in expect["accepted"].items():
        assert job[name] == value, (name, job)


def _litellm_form(params: dict, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, tuple]:
    """The multipart form LiteLLM's hosted_vllm video provider (the proxy's vLLM-Omni dialect) makes
    of a videos.create call: its own transform_video_create_request, run here."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")     # no network at import
    transformation = pytest.importorskip("litellm.llms.hosted_vllm.videos.transformation")
    from litellm.types.router import GenericLiteLLMParams
    data, request_files, _ = transformation.HostedVLLMVideoConfig().transform_video_create_request(
        model="MiniMax-H3", prompt="A red fox runs through snow", api_base="http://127.0.0.1:1/v1/videos",
        video_create_optional_request_params=params, litellm_params=GenericLiteLLMParams(), headers={})
    return data, request_files


@pytest.mark.parametrize(("params", "expect"), [
    ({"size": "1344x768", "seconds": "8", "seed": 1101, "num_inference_steps": 50, "flow_shift": 12.0,
      "extra_params": {"task": "t2va", "audio_flow_shift": 3.0}}, {"size": "1344x768", "num_frames": 192}),
    ({"input_reference": "image", "width": 768, "height": 768, "extra_params": {"task": "fl2va", "duration": 5.0}},
     {"size": "768x768", "num_frames": 124}),
    ({"image_reference": {"image_url": "@image"}, "audio_reference": [{"audio_url": "@audio"}],
      "aspect_ratio": "16:9", "extra_params": {"task": "ref2va", "duration": 5.0}}, {"size": "1344x768"}),
    ({"negative_prompt": "blurry", "extra_params": {"task": "t2va"}}, "negative_prompt"),
    ({"guidance_scale": 4.5, "extra_params": {"task": "t2va"}}, "guidance_scale"),
])
def test_litellm_hosted_vllm_forms_are_read(app_client, files, params, expect, monkeypatch) -> None:
    """Skips without litellm (the fleet's proxy installs it)."""
    def resolved(value):
        if isinstance(value, dict):
            return {k: resolved(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolved(v) for v in value]
        return data_url(files[value[1:]]) if isinstance(value, str) and value.startswith("@") else value
    params = resolved(params)
    if params.get("input_reference") == "image":
        params["input_reference"] = files["image"].read_bytes()
    data, request_files = _litellm_form(params, monkeypatch)
    parts = [(name, (None, value)) for name, value in data.items()] + list(request_files)
    response = app_client.post("/v1/videos", files=parts)
    if isinstance(expect, str):
        assert response.status_code == 400 and response.json()["error"]["param"] == expect, response.text[:400]
        return
    assert response.status_code == 200, response.text[:600]
    job = response.json()
    check_vllm_job(job)
    for name, value in expect.items():
        assert job[name] == value, (name, job)


PEER_NAMES = st.sampled_from(sorted(MODELS["vllm-omni"]["text_fields"]) + sorted(MODELS["sglang"]["fields"])
                             + ["frame_indices", "duration", "short_edge", "aspect_ratio", "type", "uri", "role"])
PEER_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70), st.floats(),
              st.text(max_size=10), st.sampled_from(["t2va", "fl2va", "ref2va", "auto", "16:9", "keyframe",
                                                     "reference", "image", "data:image/png;base64,AAAA", "/etc/passwd"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(PEER_NAMES, inner, max_size=3)),
    max_leaves=8)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(members=st.dictionaries(PEER_NAMES, PEER_VALUE, max_size=6), as_form=st.booleans())
def test_fuzzed_peer_bodies_are_answered_200_or_400_never_500(app_client, members, as_form) -> None:
    body = {"prompt": "a fox", **members}
    if as_form:
        text = [(k, v if isinstance(v, str) else json.dumps(v)) for k, v in body.items()]
        response = app_client.post("/v1/videos", files=[(k, (None, v)) for k, v in text])
    else:
        response = app_client.post("/v1/videos", content=json.dumps(body).encode(),
                                   headers={"content-type": "application/json"})
    assert response.status_code in (200, 400), (response.status_code, body, response.text[:300])
    if response.status_code == 400:
        assert response.json()["error"]["message"]


def test_h3bridge_bodies_are_answered_as_before(app_client) -> None:
    """A body of the fields all three share is h3bridge's own dialect: its job object unchanged."""
    job = app_client.post("/v1/videos", json={"prompt": "a fox", "size": "96x64", "num_frames": 56}).json()
    assert job["seconds"] == "2.333" and "media_type" not in job and "quality" not in job


def test_a_condition_of_no_known_type_is_refused_naming_it(app_client) -> None:
    response = app_client.post("/v1/videos", json={"prompt": "x", "task": "ref2va", "conditions": [
        {"type": ["image"], "uri": "data:image/png;base64,AAAA", "role": "reference"}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "conditions[0].type"


def test_a_body_mixing_both_peers_is_refused_naming_a_field_of_each(app_client) -> None:
    response = app_client.post("/v1/videos", json={"prompt": "x", "task": "t2va", "extra_params": {"task": "t2va"}})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "task" and "extra_params" in error["message"]


@pytest.mark.parametrize(("extra", "field"), [
    ({"task": "t2va", "flow_shift": 5.0}, "extra_params.flow_shift"),
    ({"task": "t2va", "audio_flow_shift": 1.0}, "extra_params.audio_flow_shift"),
    ({"task": "t2va", "cfg": 1}, "extra_params.cfg"),
    ({"task": "i2v"}, "extra_params.task"),
    ({"task": "fl2va", "frame_indices": [0, 40]}, "extra_params.frame_indices"),
    ({"task": "t2va", "start_time_seconds": [1.5]}, "extra_params.start_time_seconds"),
    ({"task": ["t2va"]}, "extra_params.task"),
])
def test_extra_params_h3_cannot_honour_are_refused_by_name(app_client, files, extra, field) -> None:
    parts = [("prompt", (None, "x")), ("extra_params", (None, json.dumps(extra)))]
    if extra["task"] == "fl2va":
        parts += [("input_references", ("a.png", files["image"].read_bytes(), "image/png"))] * 2
    response = app_client.post("/v1/videos", files=parts)
    assert response.status_code == 400, response.text[:400]
    assert response.json()["error"]["param"] == field


def test_the_flow_shifts_accepted_are_the_ones_h3_renders_with() -> None:
    """Checked against upstream h3.c's own constants, where its source is here."""
    from test_geometry import upstream_file
    header = upstream_file("h3_host.h")
    if header is None:
        pytest.skip("upstream h3.c source is not on this machine")
    video = re.search(r"#define H3_VIDEO_SIGMA_SHIFT ([0-9.]+)", header)
    audio = re.search(r"#define H3_AUDIO_SIGMA_SHIFT ([0-9.]+)", header)
    assert video and audio
    assert (float(video[1]), float(audio[1])) == (VIDEO_FLOW_SHIFT, AUDIO_FLOW_SHIFT)


# ----------------------------------------------------------------------------- (b) what RemoteEngine sends

class Recorder:
    """A mock peer: records each POST and answers with a completed job in that peer's shape."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        body = {"id": "video_gen_1", "object": "video", "model": "MiniMax-H3", "prompt": "x", "status": "completed",
                "progress": 100, "seconds": "4", "size": None, "created_at": 1, "error": None,
                "media_type": "video/mp4"}
        return httpx.Response(200, json=body)


def sent(dialect: str, request: GenerationRequest) -> httpx.Request:
    recorder = Recorder()
    with RemoteEngine("http://peer.test", dialect=dialect, transport=httpx.MockTransport(recorder)) as engine:
        engine.generate(request, want_frames=False, want_audio=False)
    assert len(recorder.requests) == 1
    return recorder.requests[0]


def form_parts(request: httpx.Request) -> list[tuple[str, str | None, bytes, str | None]]:
    """(name, filename, content, content type) of each part of a multipart request."""
    header = f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode()
    message = email.parser.BytesParser().parsebytes(header + request.content)
    assert message.is_multipart()
    return [(part.get_param("name", header="content-disposition"), part.get_filename(),
             part.get_payload(decode=True), part.get_content_type() if part.get_filename() else None)
            for part in message.get_payload()]


def check_vllm_form(request: httpx.Request) -> dict:
    """The rules of vLLM-Omni's `_parse_video_form` and VideoGenerationRequest (request_models.json)."""
    model = MODELS["vllm-omni"]
    assert request.headers["content-type"].startswith(model["content_type"])
    parts = form_parts(request)
    text = {name: content.decode() for name, filename, content, _ in parts if filename is None}
    uploads = [(name, filename, kind) for name, filename, _, kind in parts if filename is not None]
    for name in model["required"]:
        assert name in text
    for name, value in text.items():
        rule = model["text_fields"].get(name)
        assert rule is not None, f"vLLM-Omni's form has no field {name!r}"
        if rule.startswith("int"):
            number = int(value)
            if rule == "int1..200":
                assert 1 <= number <= 200
            elif rule == "int64":
                assert -(2**63) <= number <= 2**63 - 1
            else:
                assert number >= 1
        elif rule.startswith("float"):
            assert float(value) >= 1 if rule == "float>=1" else True
        elif rule == "json-object":
            assert isinstance(json.loads(value), dict)
    names = [name for name, _, _ in uploads]
    for name in names:
        assert name in model["file_fields"], name
        if model["file_fields"][name] == "one":
            assert names.count(name) == 1
    if "input_references" in names:
        assert "input_reference" not in names and "image_reference" not in text and "video_reference" not in text
    extra = json.loads(text["extra_params"])
    assert set(extra) <= set(model["extra_params_keys"]) and extra["task"] in model["tasks"]
    if "frame_indices" in extra:
        assert extra["frame_indices"] in model["frame_indices"]
    for _, filename, kind in uploads:
        family = kind.split("/", 1)[0]
        assert Path(filename).suffix.lower() in model["reference_suffixes"][family], (filename, kind)
    return {"text": text, "uploads": uploads, "extra": extra}


def test_vllm_omni_requests_keep_their_form_model(files) -> None:
    t2va = check_vllm_form(sent("vllm-omni", fast_request(frames=PEER_FRAMES)))
    assert t2va["extra"] == {"task": "t2va"} and t2va["uploads"] == []
    assert (t2va["text"]["num_frames"], t2va["text"]["fps"], t2va["text"]["width"]) == ("107", "24", "96")
    first = check_vllm_form(sent("vllm-omni", fast_request(frames=PEER_FRAMES, first_frame=files["image_wide"])))
    assert first["extra"] == {"task": "fl2va"} and [u[0] for u in first["uploads"]] == ["input_reference"]
    both = check_vllm_form(sent("vllm-omni", fast_request(frames=PEER_FRAMES, first_frame=files["image_wide"],
                                                           last_frame=files["image"])))
    assert both["extra"] == {"task": "fl2va", "frame_indices": [0, -1]}
    assert [u[0] for u in both["uploads"]] == ["input_references", "input_references"]
    refs = (Reference(ReferenceKind.IMAGE, files["image"]), Reference(ReferenceKind.VIDEO, files["video"]),
            Reference(ReferenceKind.AUDIO, files["audio"]))
    ref2va = check_vllm_form(sent("vllm-omni", fast_request(frames=PEER_FRAMES, references=refs)))
    assert ref2va["extra"] == {"task": "ref2va"}
    assert [u[2] for u in ref2va["uploads"]] == ["image/png", "video/mp4", "audio/x-wav"]


def check_sglang_json(request: httpx.Request) -> dict:
    """The rules of SGLang's VideoGenerationsRequest and its MiniMax-H3 adapter (request_models.json)."""
    model = MODELS["sglang"]
    assert request.headers["content-type"].startswith(model["content_type"])
    body = json.loads(request.content)
    assert set(model["required"]) <= set(body) and set(body) <= set(model["fields"])
    assert not set(body) & set(model["refused_for_h3"])
    assert body["task"] in model["tasks"]
    keyframes = []
    for condition in body["conditions"]:
        assert set(condition) <= set(model["condition_keys"])
        assert condition["type"] in model["condition_types"] and condition["role"] in model["condition_roles"]
        assert condition["uri"].startswith(tuple(model["uri_schemes"]))
        if condition["role"] == "keyframe":
            keyframes.append(condition["frame_index"])
    if keyframes:
        assert keyframes in model["keyframe_frame_indices"]
    target = body["target"]
    assert set(target) == set(model["target_keys"]) and target["aspect_ratio"] in model["aspect_ratios"]
    low, high = model["duration_seconds"]
    assert low <= target["duration_seconds"] <= high
    return body


def test_sglang_requests_keep_their_model(files) -> None:
    t2va = check_sglang_json(sent("sglang", fast_request(width=768, height=768, frames=PEER_FRAMES)))
    assert t2va["target"] == {"short_edge": 768, "aspect_ratio": "1:1", "duration_seconds": PEER_FRAMES / 24}
    assert t2va["conditions"] == []
    fl2va = check_sglang_json(sent("sglang", fast_request(width=768, height=768, frames=PEER_FRAMES,
                                                           first_frame=files["image"], last_frame=files["image"])))
    assert fl2va["task"] == "fl2va" and fl2va["target"]["aspect_ratio"] == "auto"
    refs = (Reference(ReferenceKind.IMAGE, files["image"]), Reference(ReferenceKind.SILENT_VIDEO, files["video"]),
            Reference(ReferenceKind.VIDEO, files["video"]), Reference(ReferenceKind.AUDIO, files["audio"]))
    ref2va = check_sglang_json(sent("sglang", fast_request(width=1344, height=768, frames=PEER_FRAMES,
                                                            references=refs)))
    assert [c["type"] for c in ref2va["conditions"]] == ["image", "video", "video_audio", "audio"]
    assert base64.b64decode(ref2va["conditions"][0]["uri"].split(",", 1)[1]) == files["image"].read_bytes()


@pytest.mark.parametrize(("dialect", "changes", "field"), [
    ("vllm-omni", {"reuse": 2}, "reuse"),
    ("vllm-omni", {"token_reduction": True}, "token_reduction"),
    ("sglang", {"width": 768, "height": 768, "layers": 40}, "layers"),
    ("vllm-omni", {"steps": 250}, "steps"),
    ("vllm-omni", {"frames": 22}, "frames"),
    ("sglang", {"width": 96, "height": 64}, "width"),
    ("vllm-omni", {"seed": 2**63}, "seed"),
])
def test_what_a_peer_cannot_express_is_refused_before_sending(dialect, changes, field) -> None:
    recorder = Recorder()
    request = fast_request(**{"frames": PEER_FRAMES, **changes})
    with RemoteEngine("http://peer.test", dialect=dialect, transport=httpx.MockTransport(recorder)) as engine:
        with pytest.raises(RequestError) as caught:
            engine.check_supported(request)
        assert caught.value.field == field
        with pytest.raises(RequestError):
            engine.generate(request, want_frames=False, want_audio=False)
    assert recorder.requests == []


def test_a_silent_or_paired_video_has_no_vllm_spelling(files) -> None:
    for kind, extra in ((ReferenceKind.SILENT_VIDEO, None), (ReferenceKind.VIDEO_AUDIO, files["audio"])):
        request = fast_request(frames=PEER_FRAMES, references=(Reference(kind, files["video"], extra),))
        with pytest.raises(RequestError) as caught:
            RemoteEngine("http://peer.test", dialect="vllm-omni").check_supported(request)
        assert caught.value.field == "references"


def test_an_unknown_dialect_is_refused_naming_it() -> None:
    with pytest.raises(RequestError) as caught:
        RemoteEngine("http://peer.test", dialect="comfy")
    assert caught.value.field == "dialect"


def test_a_peer_job_with_a_numeric_error_code_is_read() -> None:
    job = job_from_peer({"id": "v", "object": "video", "status": "failed", "model": "m", "prompt": "p",
                         "size": None, "seconds": "4", "error": {"code": 500, "message": "CUDA out of memory"}})
    assert job.error is not None and job.error.code == "500" and job.error.message == "CUDA out of memory"


def test_the_cli_sends_the_dialect_or_refuses_before_sending(capsys) -> None:
    from h3bridge.cli.main import main
    base = ["generate", "-p", "a fox", "--width", "96", "--height", "64", "--frames", "107", "--steps", "2",
            "-o", "never.mp4"]
    # Port 9 (discard) has no server: a refusal that names the flag was made before anything was sent.
    assert main([*base, "--reuse", "2", "--remote", "http://127.0.0.1:9", "--remote-dialect", "vllm-omni"]) == 2
    assert "--reuse 2 is an h3 setting vLLM-Omni" in capsys.readouterr().err
    assert main([*base, "--remote-dialect", "sglang"]) == 2
    assert "add --remote URL, or drop --remote-dialect" in capsys.readouterr().err


# ----------------------------------------------------------------------------- (c) end to end, against our server

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    root = tmp_path_factory.mktemp("dialect-e2e")
    running = start_server(root, write_fixture_model(root / "MiniMax-H3"))
    yield running
    running.stop()




def test_remote_engine_speaks_vllm_omni_to_our_server(server, key, files, tmp_path) -> None:
    request = fast_request(frames=PEER_FRAMES, first_frame=files["image_wide"])
    with RemoteEngine(server.url, dialect="vllm-omni") as engine:
        result = engine.generate(request, tmp_path / "clip.mp4")
    assert result.frames is not None and result.frames.shape[:3] == (PEER_FRAMES, 64, 96)
    assert mp4_frame_count((tmp_path / "clip.mp4").read_bytes()) == PEER_FRAMES
    listed = httpx.get(f"{server.url}/v1/videos", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    check_vllm_job(listed["data"][0])       # the job keeps answering in vLLM-Omni's shape


def test_remote_engine_speaks_sglang_to_our_server(server, key, files, tmp_path) -> None:
    request = fast_request(width=768, height=768, frames=PEER_FRAMES,
                           references=(Reference(ReferenceKind.IMAGE, files["image"]),))
    with RemoteEngine(server.url, dialect="sglang") as engine:
        result = engine.generate(request, tmp_path / "clip.mp4", want_frames=False)
    assert result.video_path == tmp_path / "clip.mp4"
    assert mp4_frame_count(result.video_path.read_bytes()) == PEER_FRAMES


def test_the_synchronous_variant_answers_the_mp4(server, key, files) -> None:
    parts = [("prompt", (None, "a fox")), ("width", (None, "96")), ("height", (None, "64")),
             ("num_frames", (None, "22")), ("num_inference_steps", (None, "2")),
             ("extra_params", (None, json.dumps({"task": "t2va"})))]
    response = httpx.post(f"{server.url}/v1/videos/sync", files=parts, headers={"Authorization": f"Bearer {key}"},
                          timeout=120)
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"] == "video/mp4" and response.headers["x-request-id"].startswith("video_")
    assert mp4_frame_count(response.content) == 22
    refused = httpx.post(f"{server.url}/v1/videos/sync", files=[*parts, ("negative_prompt", (None, "blur"))],
                         headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "negative_prompt"


@pytest.mark.parametrize("extra, field", [
    ({"frame_indices": [-1]}, "extra_params.frame_indices"),      # would have anchored the image last: dropped
    ({"start_time_seconds": 2.0}, "extra_params.start_time_seconds"),   # h3 reads a video from its start
])
def test_peer_parameters_beside_h3bridge_own_file_parts_are_checked_not_dropped(app_client, files, extra,
                                                                                field) -> None:
    """A vLLM-Omni body whose files come as h3bridge's own parts (first_frame, ref_video): its
    extra_params are checked as they are with the peer's file fields, never silently dropped."""
    part = "first_frame" if "frame_indices" in extra else "ref_video"
    path = files["image"] if part == "first_frame" else files["video"]
    parts = [("prompt", (None, "a fox")), ("extra_params", (None, json.dumps(extra))),
             (part, (path.name, path.read_bytes()))]
    response = app_client.post("/v1/videos", files=parts)
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["param"] == field


@pytest.mark.parametrize("body, shape", [
    ({"prompt": "a fox", "extra_params": {"task": "t2va"}}, "vllm"),      # vLLM-Omni: {"error": {..., code: 409}}
    ({"prompt": "a fox", "task": "t2va"}, "sglang"),                      # SGLang: {"detail": ...}
    ({"prompt": "a fox"}, "h3bridge"),
])
def test_every_answer_about_a_job_is_in_its_dialect(app_client, body, shape) -> None:
    """Not only 400 and 500: the 409 for content not ready yet (the app has no worker, so the job
    stays queued) and the 400 for a variant are shaped as the job's clients read them."""
    job = app_client.post("/v1/videos", json=body).json()
    for path, status in ((f"/v1/videos/{job['id']}/content", 409),
                         (f"/v1/videos/{job['id']}/content?variant=thumbnail", 400)):
        answer = app_client.get(path)
        assert answer.status_code == status, answer.text[:300]
        error = answer.json()
        if shape == "vllm":
            assert error["error"]["code"] == status and "detail" not in error
        elif shape == "sglang":
            assert error["detail"] == error["error"]["message"]
        else:
            assert isinstance(error["error"]["code"], str) and "detail" not in error
