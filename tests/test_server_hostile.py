"""Hostile bodies at `POST /v1/videos` (issue 19 items 4, 5 and 7): each is an HTTP 400 naming the
field where there is one, never a 500, and none makes the server hold more than its limits. The
app runs in-process (FastAPI's TestClient) over a real JobStore; its worker is never started, so
an accepted job just waits in the queue."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3bridge.request import MAX_PROMPT_BYTES
from h3bridge.wire import videos as wire
from h3bridge.server.app import ServeSettings, create_app
from h3bridge.server.jobs import JobStore
from h3bridge.server.uploads import MiB, UploadLimits
from h3bridge.server.worker import Worker

LIMITS = UploadLimits(max_json_bytes=2 * MiB, max_file_bytes=1 * MiB)
DEEP = 100_000


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory):
    data_dir = tmp_path_factory.mktemp("hostile-serve")
    store = JobStore(data_dir)
    app = create_app(ServeSettings(data_dir=data_dir, limits=LIMITS), store, Worker(store, engine=None))  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    store.close()


def post_json(client: TestClient, text: str):
    return client.post("/v1/videos", content=text.encode("utf-8"), headers={"content-type": "application/json"})


def post_form(client: TestClient, fields: list[tuple[str, str]], files: list[tuple[str, bytes]] = ()):
    parts = [(name, (None, value)) for name, value in fields] + [(name, ("f.png", data)) for name, data in files]
    return client.post("/v1/videos", files=parts)


def refusal(response) -> dict:
    assert response.status_code == 400, (response.status_code, response.text[:500])
    return response.json()["error"]


NESTED = "[" * DEEP + "]" * DEEP


@pytest.mark.parametrize(("body", "param"), [
    ('{"prompt": "x", "slower_paths": {"a": 1}}', "slower_paths"),
    ('{"prompt": "x", "slower_paths": [["bf16-mlp"]]}', "slower_paths"),
    ('{"prompt": "x", "slower_paths": [{"a": []}]}', "slower_paths"),
    ('{"prompt": "x", "seed": {"a": 1}}', "seed"),
    ('{"prompt": ["a", ["b"]]}', "prompt"),
    ('{"prompt": "x", "seed": %s}' % NESTED, "seed"),
    ('{"prompt": "x", "extra_body": {"layers": %s}}' % NESTED, "extra_body"),
    ('{"prompt": "x", "seed": %s}' % ("9" * 5000), "seed"),
    ('{"prompt": "x", "token_reduction": %s}' % ("1" + "0" * 5000), "token_reduction"),
    ('{"prompt": "x", "num_frames": -%s}' % ("9" * 20000), "frames"),   # the request's name for it
    ('{"prompt": "x", "width": %s, "height": 480}' % ("32" + "0" * 400), "width"),
    ('{"prompt": "x", "width": 864, "height": %s}' % ("9" * 400), "height"),
    ('{"prompt": "x", "size": "%sx480"}' % ("9" * 6000), "width"),
    ('{"prompt": %s}' % ("7" * 5000), "prompt"),
    ('{"prompt": "x", "fps": %s}' % ("2" * 5000), "fps"),
], ids=["slower object", "slower nested list", "slower object in list", "seed object", "prompt nested list",
        "nested 100000 deep", "nested in extra_body", "5000-digit seed", "5001-digit switch", "negative 20000 digits",
        "400-digit width", "400-digit height", "6000-digit size", "5000-digit prompt", "5000-digit fps"])
def test_each_hostile_json_value_is_a_400_naming_its_field(app_client: TestClient, body: str, param: str) -> None:
    error = refusal(post_json(app_client, body))
    assert error["param"] == param, error
    assert error["code"] == "invalid_request" and error["message"]


@pytest.mark.parametrize(("fields", "param"), [
    ([("prompt", "x"), ("seed", "9" * 5000)], "seed"),
    ([("prompt", "x"), ("width", "32" + "0" * 400)], "width"),
    ([("prompt", "x"), ("height", "9" * 400)], "height"),
    ([("prompt", "x"), ("seconds", "9" * 5000)], "seconds"),
    ([("prompt", "x"), ("num_inference_steps", "-" + "1" * 9000)], "steps"),
    ([("prompt", "x"), ("size", "96x" + "9" * 5000)], "width"),     # the canvas rule, whose hint sets both
    ([("prompt", "x"), ("fps", "9" * 5000)], "fps"),
], ids=["seed", "width", "height", "seconds", "steps", "size", "fps"])
def test_numbers_of_thousands_of_digits_in_a_form_are_a_400_naming_the_field(app_client: TestClient, fields,
                                                                           param: str) -> None:
    error = refusal(post_form(app_client, fields))
    assert error["param"] == param and "digit number" in error["message"], error


def test_a_body_that_is_only_nesting_is_a_400(app_client: TestClient) -> None:
    error = refusal(post_json(app_client, "[" * DEEP))
    assert "nested too deeply" in error["message"] and error["param"] is None


def test_json_bodies_and_fields_are_capped_as_multipart_is(app_client: TestClient) -> None:
    # A whole JSON body: refused by its declared length, and by what arrives when none is declared.
    big = json.dumps({"prompt": "x", "input_reference": {"image_url": "data:image/png;base64," + "A" * (3 * MiB)}})
    error = refusal(post_json(app_client, big))
    assert "over this server's limit of 2 MiB" in error["message"] and "multipart" in error["hint"]

    def chunks():
        yield big.encode()
    streamed = app_client.post("/v1/videos", content=chunks(), headers={"content-type": "application/json"})
    assert "over this server's limit of 2 MiB" in refusal(streamed)["message"]
    # One field: past the field limit, the server's limit; up to it, the request's own prompt rule.
    error = refusal(post_json(app_client, json.dumps({"prompt": "a" * (LIMITS.max_field_bytes + 1)})))
    assert error["param"] == "prompt" and "over this server's limit" in error["message"]
    error = refusal(post_json(app_client, json.dumps({"prompt": "a" * (MAX_PROMPT_BYTES + 1)})))
    assert error["param"] == "prompt" and f"at most {MAX_PROMPT_BYTES:,} bytes" in error["message"]
    # A repeated field's items count as fields.
    error = refusal(post_json(app_client, json.dumps({"prompt": "x", "use_slower": ["bf16-mlp"] * 1000})))
    assert "more than 64 form fields" in error["message"]


def test_job_lists_do_not_repeat_whole_prompts(app_client: TestClient) -> None:
    prompt = "a fox " * (MAX_PROMPT_BYTES // 6)
    created = app_client.post("/v1/videos", json={"prompt": prompt, "size": "96x64", "num_frames": 22})
    assert created.status_code == 200, created.text
    listed = app_client.get("/v1/videos", params={"limit": 100}).json()["data"]
    mine = next(job for job in listed if job["id"] == created.json()["id"])
    assert len(mine["prompt"]) == wire.LISTED_PROMPT_CHARS and mine["prompt"].endswith("\u2026")
    assert prompt.startswith(mine["prompt"][:-1])
    assert app_client.get(f"/v1/videos/{created.json()['id']}").json()["prompt"] == prompt


# ----------------------------------------------------------------------------- fuzzing

NAMES = st.one_of(st.sampled_from(wire.field_names() + ["extra_body", "use_slower[]", "input_reference[image_url]"]),
                  st.text(max_size=8))
DIGITS = st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n)
JSON_SCALAR = st.one_of(
    st.none().map(json.dumps), st.booleans().map(json.dumps), st.integers().map(json.dumps),
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps), st.text(max_size=12).map(json.dumps),
    DIGITS, DIGITS.map(lambda digits: "-" + digits), st.sampled_from(['"bf16-mlp"', '"96x64"', '"max"', '"22"']),
    st.integers(min_value=1000, max_value=20_000).map(lambda depth: "[" * depth + "]" * depth),
)
JSON_TEXT = st.recursive(JSON_SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda items: "[" + ",".join(items) + "]"),
    st.lists(st.tuples(NAMES, inner), max_size=3).map(
        lambda members: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members) + "}")), max_leaves=6)


@st.composite
def json_bodies(draw: st.DrawFn) -> str:
    members = draw(st.lists(st.tuples(NAMES, JSON_TEXT), max_size=5))
    if draw(st.booleans()):
        members.insert(0, ("prompt", json.dumps("a fox")))
    return "{" + ",".join(f"{json.dumps(name)}:{value}" for name, value in members) + "}"


FORM_TEXT = st.one_of(st.text(max_size=12), DIGITS, DIGITS.map(lambda digits: "-" + digits),
                      st.sampled_from(["true", "false", "bf16-mlp", "96x64", "22", "2", "1e999", "nan", "max"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=json_bodies())
def test_fuzzed_json_bodies_are_answered_200_or_400_never_500(app_client: TestClient, body: str) -> None:
    response = post_json(app_client, body)
    assert response.status_code in (200, 400), (response.status_code, body[:300])
    if response.status_code == 400:
        assert response.json()["error"]["message"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.lists(st.tuples(NAMES, FORM_TEXT), max_size=6), prompt=st.booleans(),
       files=st.lists(st.tuples(st.sampled_from(wire.FILE_FIELDS), st.binary(max_size=16)), max_size=2))
def test_fuzzed_forms_are_answered_200_or_400_never_500(app_client: TestClient, fields, prompt: bool, files) -> None:
    response = post_form(app_client, [("prompt", "a fox")] * prompt + fields, files)
    assert response.status_code in (200, 400), (response.status_code, fields, files)
    if response.status_code == 400:
        assert response.json()["error"]["message"]


def test_an_unknown_field_with_a_huge_name_is_not_echoed_whole(app_client: TestClient) -> None:
    error = refusal(post_json(app_client, json.dumps({"prompt": "x", "k" * 100_000: 1})))
    assert error["message"].startswith("unknown field") and len(error["param"]) <= 64
    assert len(json.dumps(error)) < 2000
