"""Numbers in the peers' dialects (issue 29 item 1): every numeric field of a vLLM-Omni or SGLang
body, and of h3bridge's own, is read by safeio.numbers, so a 400-digit integer, a 5,000-digit one,
NaN or infinity is an HTTP 400 naming the field in the client's words, never a 500 (OverflowError
from float() of a 400-digit int, ValueError from int() of 4,301+ digits). The app runs in-process
over a real JobStore with no worker: nothing renders."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from h3bridge.server.app import ServeSettings, create_app
from h3bridge.server.jobs import JobStore
from h3bridge.server.uploads import MiB, UploadLimits
from h3bridge.server.worker import Worker

BIG = 10**400              # float(BIG) raises OverflowError
HUGE = "9" * 5000          # int(HUGE) raises ValueError (Python's 4,300-digit limit)
PNG = "data:image/png;base64,iVBORw0KGgo="


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory):
    data_dir = tmp_path_factory.mktemp("dialect-numbers")
    store = JobStore(data_dir)
    app = create_app(ServeSettings(data_dir=data_dir, limits=UploadLimits(max_json_bytes=2 * MiB), max_queued=None),
                     store, Worker(store, engine=None))  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    store.close()


def _condition(**extra) -> dict:
    return {"type": "image", "uri": PNG, "role": "reference", **extra}


# (body, the field the 400 must name); each number is put in as BIG, as HUGE (a literal of 5,000
# digits), as NaN and as an infinity.
FIELDS = [
    (lambda n: {"prompt": "x", "flow_shift": n}, "flow_shift"),
    (lambda n: {"prompt": "x", "extra_params": {"flow_shift": n}}, "extra_params.flow_shift"),
    (lambda n: {"prompt": "x", "extra_params": {"audio_flow_shift": n}}, "extra_params.audio_flow_shift"),
    (lambda n: {"prompt": "x", "extra_params": {"duration": n}}, "extra_params.duration"),
    (lambda n: {"prompt": "x", "extra_params": {"short_edge": n}}, "extra_params.short_edge"),
    (lambda n: {"prompt": "x", "extra_params": {"task": "ref2va", "start_time_seconds": n},
                "image_reference": {"image_url": PNG}}, "extra_params.start_time_seconds"),
    (lambda n: {"prompt": "x", "user": "u", "n": n}, "n"),
    (lambda n: {"prompt": "x", "user": "u", "num_outputs_per_prompt": n}, "num_outputs_per_prompt"),
    (lambda n: {"prompt": "x", "audio_flow_shift": n}, "audio_flow_shift"),
    (lambda n: {"prompt": "x", "task": "t2va", "flow_shift": n}, "flow_shift"),
    (lambda n: {"prompt": "x", "target": {"duration_seconds": n}}, "target.duration_seconds"),
    (lambda n: {"prompt": "x", "target": {"short_edge": n}}, "target.short_edge"),
    (lambda n: {"prompt": "x", "conditions": [_condition(start_time_seconds=n)]},
     "conditions[0].start_time_seconds"),
]
IDS = ["flow_shift", "vllm extra flow_shift", "vllm extra audio_flow_shift", "vllm extra duration",
       "vllm extra short_edge", "vllm extra start_time", "vllm n", "vllm num_outputs", "sglang audio_flow_shift",
       "sglang flow_shift", "sglang target.duration_seconds", "sglang target.short_edge", "sglang start_time"]


def _post(client: TestClient, body: dict, literal: str):
    text = json.dumps(body).replace('"@NUMBER@"', literal)
    return client.post("/v1/videos", content=text.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize(("make", "param"), FIELDS, ids=IDS)
@pytest.mark.parametrize("literal", [str(BIG), "-" + str(BIG), HUGE, "NaN", "-Infinity", "1e999"],
                         ids=["400 digits", "-400 digits", "5000 digits", "NaN", "-inf", "1e999"])
def test_a_hostile_number_in_a_peer_field_is_a_400_naming_it(app_client: TestClient, make, param: str,
                                                              literal: str) -> None:
    response = _post(app_client, make("@NUMBER@"), literal)
    assert response.status_code == 400, (response.status_code, response.text[:300])
    body = response.json()
    error = body["error"]
    assert error["param"] == param, error
    assert len(json.dumps(body)) < 2000, "the number is not echoed whole"


@pytest.mark.parametrize(("fields", "param"), [
    ([("prompt", "x"), ("extra_params", '{"flow_shift": %s}' % HUGE)], "extra_params.flow_shift"),
    ([("prompt", "x"), ("extra_params", '{"duration": %s}' % BIG)], "extra_params.duration"),
    ([("prompt", "x"), ("aspect_ratio", "16:9"), ("fps", HUGE + ".0")], "fps"),
    ([("prompt", "x"), ("audio_flow_shift", str(BIG))], "audio_flow_shift"),
    ([("prompt", "x"), ("target", '{"duration_seconds": %s}' % HUGE)], "target.duration_seconds"),
    ([("prompt", "x"), ("flow_shift", str(BIG))], "flow_shift"),
], ids=["vllm extra_params 5000 digits", "vllm duration", "vllm fps", "sglang audio_flow_shift",
        "sglang target", "flow_shift"])
def test_a_hostile_number_in_a_form_is_a_400_naming_it(app_client: TestClient, fields, param: str) -> None:
    response = app_client.post("/v1/videos", files=[(name, (None, value)) for name, value in fields])
    assert response.status_code == 400, (response.status_code, response.text[:300])
    assert response.json()["error"]["param"] == param, response.json()


def test_a_canvas_of_400_digits_beside_an_aspect_ratio_is_a_400(app_client: TestClient) -> None:
    response = _post(app_client, {"prompt": "x", "aspect_ratio": "16:9", "width": "@NUMBER@", "height": 768}, str(BIG))
    assert response.status_code == 400, (response.status_code, response.text[:300])
    assert response.json()["error"]["param"] == "width"


def test_a_frame_index_of_400_digits_is_a_400(app_client: TestClient) -> None:
    body = {"prompt": "x", "extra_params": {"task": "fl2va", "frame_indices": ["@NUMBER@"]},
            "image_reference": {"image_url": PNG}}
    response = _post(app_client, body, str(BIG))
    assert response.status_code == 400, (response.status_code, response.text[:300])
    assert response.json()["error"]["param"] == "extra_params.frame_indices"


@pytest.mark.parametrize("limit", ["-" + "9" * 400, "9" * 5000, "0", "101", "nan", "true", "1e3"])
def test_a_hostile_list_limit_is_a_400_naming_it_with_a_fix(app_client: TestClient, limit: str) -> None:
    response = app_client.get("/v1/videos", params={"limit": limit})
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["param"] == "limit" and error["message"].startswith("limit=") and error["hint"], error
    assert len(error["message"]) < 300, error


@pytest.mark.parametrize("text", ["²:1", "16:١", "9" * 5000 + ":1", "16:0", "-16:9", "16:9:1", "a:b"])
def test_an_aspect_ratio_that_is_not_two_whole_numbers_is_none(text: str) -> None:
    from h3bridge.wire.peers import parse_ratio
    assert parse_ratio(text) is None          # "²".isdigit() is True, and int("²") raised ValueError
