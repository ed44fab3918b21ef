"""The OpenAI Videos API body <-> GenerationRequest mapping (h3bridge/wire/videos.py)."""
from __future__ import annotations

import base64
from pathlib import Path

import pytest

from h3bridge import GenerationRequest, Reference, ReferenceImageSize, ReferenceKind, RequestError, SlowerPath
from h3bridge.wire import videos as wire
from h3bridge.wire.videos import JobStatus, UploadedFile, VideoJob


def as_uploads(body: wire.WireBody) -> list[UploadedFile]:
    return [UploadedFile(name, path, path.name) for name, path in body.files]


def round_trip(request: GenerationRequest, *, form: bool) -> GenerationRequest:
    body = wire.request_to_wire(request)
    pairs = body.form_fields() if form else wire.pairs_from_json(body.fields)
    back, model = wire.request_from_wire(pairs, as_uploads(body))
    assert model is None
    return back


@pytest.mark.parametrize("form", [False, True], ids=["json", "multipart"])
def test_every_setting_survives_the_round_trip(form: bool, tmp_path: Path) -> None:
    request = GenerationRequest(
        prompt="a fox, at dawn", width=512, height=288, frames=39, steps=7, seed=2**64 - 1, reuse=1,
        layers=40, core_reuse=4, token_reduction=True, ssd_streaming=True, reference_rope=True,
        render_width=256, render_height=144, reference_image_size=ReferenceImageSize.MAX,
        slower_paths=frozenset({SlowerPath.BF16_MLP, SlowerPath.DYNAMIC_FC1_K}),
        references=(Reference(ReferenceKind.AUDIO, tmp_path / "a.wav"),
                    Reference(ReferenceKind.IMAGE, tmp_path / "i.png"),
                    Reference(ReferenceKind.VIDEO_AUDIO, tmp_path / "v.mp4", tmp_path / "s.wav"),
                    Reference(ReferenceKind.SILENT_VIDEO, tmp_path / "q.mp4")))
    assert round_trip(request, form=form) == request
    anchored = GenerationRequest(prompt="x", seconds=2.5, first_frame=tmp_path / "f.png",
                                 last_frame=tmp_path / "l.png", int8_row_fc2=True)
    assert round_trip(anchored, form=form) == anchored


def test_a_plain_request_is_a_standard_body_with_an_explicit_length() -> None:
    body = wire.request_to_wire(GenerationRequest(prompt="x"), model="MiniMax-H3")
    assert body.fields == {"prompt": "x", "model": "MiniMax-H3", "size": "864x480", "num_frames": 56, "fps": 24,
                           "seed": 42, "num_inference_steps": 20}
    assert body.h3_only_fields == [] and body.files == ()
    with_extras = wire.request_to_wire(GenerationRequest(prompt="x", layers=45, ssd_streaming=True,
                                                         references=(Reference(ReferenceKind.IMAGE, Path("r.png")),)))
    assert with_extras.h3_only_fields == ["layers", "ssd_streaming", "ref_image"]


def test_the_openai_clients_multipart_encoding_is_understood() -> None:
    # openai's videos.create sends every field as multipart text: booleans "true", lists "name[]".
    pairs = [("prompt", "x"), ("size", "96x64"), ("seconds", "4"), ("frames", "22"), ("steps", "2"),
             ("ssd_streaming", "true"), ("token_reduction", "0"), ("slower_paths[]", "bf16-mlp"),
             ("slower_paths[]", "grouped-quantizer"), ("model", "sora-2")]
    request, model = wire.request_from_wire(pairs)
    assert model == "sora-2"
    assert (request.width, request.height, request.frames, request.seconds, request.steps) == (96, 64, 22, 4, 2)
    assert request.ssd_streaming is True and request.token_reduction is False
    assert request.slower_paths == {SlowerPath.BF16_MLP, SlowerPath.GROUPED_QUANTIZER}


def test_sglang_extra_body_is_merged_and_preset_applies_first() -> None:
    pairs = wire.pairs_from_json({"prompt": "x", "preset": "preview", "extra_body": {"layers": 40}})
    request, _ = wire.request_from_wire(pairs)
    assert (request.steps, request.layers, request.reuse) == (4, 40, 1)


def refusal(pairs, uploads=()) -> RequestError:
    with pytest.raises(RequestError) as caught:
        request, _ = wire.request_from_wire(pairs, uploads)
        request.validate(check_files=False)
    return caught.value


def test_values_the_request_can_hold_are_refused_by_the_requests_own_rules() -> None:
    # (body field, text) -> the GenerationRequest the library user would have written
    cases = {("num_frames", "23"): dict(frames=23), ("width", "100"): dict(width=100),
             ("steps", "many"): dict(steps="many"), ("ssd_streaming", "yes"): dict(ssd_streaming="yes"),
             ("slower_paths", "warp"): dict(slower_paths=frozenset({"warp"})),
             ("ref_image_size", "huge"): dict(reference_image_size="huge")}
    for (name, text), direct in cases.items():
        with pytest.raises(RequestError) as expected:
            GenerationRequest("x", **direct).validate(check_files=False)
        error = refusal([("prompt", "x"), (name, text)])
        assert (error.message, error.field) == (expected.value.message, expected.value.field), name


def test_what_only_a_body_can_get_wrong_names_the_field() -> None:
    cases = {
        "unknown": [("prompt", "x"), ("guidance_scale", "5")],
        "twice": [("prompt", "x"), ("seed", "1"), ("seed", "2")],
        "alias": [("prompt", "x"), ("frames", "22"), ("num_frames", "39")],
        "size": [("prompt", "x"), ("size", "big")],
        "disagree": [("prompt", "x"), ("size", "96x64"), ("width", "128")],
        "fps": [("prompt", "x"), ("fps", "30")],
        "no prompt": [("seed", "1")],
        "path": [("prompt", "x"), ("input_reference", "/etc/passwd")],
    }
    fields = {name: refusal(pairs).field for name, pairs in cases.items()}
    assert fields == {"unknown": "guidance_scale", "twice": "seed", "alias": "num_frames", "size": "size",
                      "disagree": "width", "fps": "fps", "no prompt": "prompt", "path": "input_reference"}
    assert "never a path" in refusal(cases["path"]).message


def test_uploads_become_anchors_and_ordered_references(tmp_path: Path) -> None:
    uploads = [UploadedFile("ref_audio", tmp_path / "1"), UploadedFile("ref_video_audio", tmp_path / "2"),
               UploadedFile("ref_video_audio", tmp_path / "3"), UploadedFile("ref_image", tmp_path / "4")]
    request, _ = wire.request_from_wire([("prompt", "x")], uploads)
    assert request.references == (Reference(ReferenceKind.AUDIO, tmp_path / "1"),
                                  Reference(ReferenceKind.VIDEO_AUDIO, tmp_path / "2", tmp_path / "3"),
                                  Reference(ReferenceKind.IMAGE, tmp_path / "4"))
    assert refusal([("prompt", "x")], uploads[:2]).field == "ref_video_audio"
    request, _ = wire.request_from_wire([("prompt", "x")], [UploadedFile("input_reference", tmp_path / "f")])
    assert request.first_frame == tmp_path / "f"
    two = [UploadedFile("input_reference", tmp_path / "f"), UploadedFile("first_frame", tmp_path / "g")]
    assert refusal([("prompt", "x")], two).field == "first_frame"


def test_messages_name_uploads_as_the_client_sent_them(tmp_path: Path) -> None:
    upload = UploadedFile("input_reference", tmp_path / "stored-0", "../../etc/passwd")
    request, _ = wire.request_from_wire([("prompt", "x")], [upload])
    with pytest.raises(RequestError) as caught:
        request.validate()
    body = wire.refusal_body(caught.value, [upload])
    assert str(tmp_path) not in body.error.message
    assert "input_reference upload ../../etc/passwd" in body.error.message
    assert body.error.code == "invalid_request" and body.error.param == "first_frame"


def test_inline_files_are_data_urls_only() -> None:
    data = base64.b64encode(b"\x89PNG...").decode()
    assert wire.inline_file_text("input_reference", {"image_url": f"data:image/png;base64,{data}"}) is not None
    assert wire.inline_file_text("input_reference[image_url]", "data:,x") == "data:,x"
    assert wire.inline_file_text("prompt", "x") is None
    assert wire.decode_data_url("input_reference", f"data:image/png;base64,{data}") == b"\x89PNG..."
    for bad in ("https://example.com/a.png", "/etc/passwd", "data:image/png;base64,@@@"):
        with pytest.raises(RequestError) as caught:
            wire.decode_data_url("input_reference", bad)
        assert caught.value.field == "input_reference"


def test_job_object_parses_as_the_openai_clients_video() -> None:
    # As the client parses responses (not strict: its Literal sizes are Sora's, ours are H3's).
    from openai._models import construct_type
    from openai.types import Video

    def as_video(data: dict) -> Video:
        return construct_type(type_=Video, value=data)
    job = VideoJob(id="video_1", status=JobStatus.IN_PROGRESS, progress=wire.progress_percent(0.5),
                   **wire.clip_shape(GenerationRequest("x", width=96, height=64, frames=22)))
    video = as_video(job.model_dump(mode="json"))
    assert (video.id, video.status, video.progress, video.size, video.seconds) == \
        ("video_1", "in_progress", 50, "96x64", "0.917")
    assert wire.progress_percent(1.0) == 99 and wire.progress_percent(1.0, finished=True) == 100
    failed = VideoJob(id="v", status=JobStatus.FAILED,
                      error=wire.VideoError(code="engine_failed", message="h3: boom"))
    assert as_video(failed.model_dump(mode="json")).error.message == "h3: boom"
    assert wire.error_from_body({"error": {"code": "x", "message": "m"}}).message == "m"
