"""GenerationRequest.validate: every upstream rule (h3.c h3_valid_params, main.c) with a
message that names the bad value and the nearest valid one."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core_helpers import fast_request, media  # noqa: F401  (media is a fixture)
from h3bridge import (
    PRESETS,
    GenerationRequest,
    Reference,
    ReferenceImageSize,
    ReferenceKind,
    RequestError,
    SlowerPath,
    align_frame_count,
)
from h3bridge.geometry import MAX_FRAMES, MIN_FRAMES, legal_frame_counts

IMG = Path("/nonexistent/ref.png")   # value checks never touch files


def reject(request: GenerationRequest, field: str, *fragments: str, check_files: bool = False) -> RequestError:
    with pytest.raises(RequestError) as caught:
        request.validate(check_files=check_files)
    error = caught.value
    assert error.field == field, str(error)
    for fragment in fragments:
        assert fragment in str(error), f"{fragment!r} not in {str(error)!r}"
    return error


def refs(*kinds: ReferenceKind) -> tuple[Reference, ...]:
    return tuple(Reference(kind, IMG, IMG if kind is ReferenceKind.VIDEO_AUDIO else None) for kind in kinds)


def test_defaults_and_fast_request_are_valid() -> None:
    assert GenerationRequest("a fox").validate(check_files=False).frame_count == 56
    assert fast_request().validate().frame_count == 22


def test_legal_frame_counts_are_5_plus_17n_from_22_to_362() -> None:
    legal = legal_frame_counts()
    assert legal[0] == 22 and legal[-1] == 362 and all(b - a == 17 for a, b in zip(legal, legal[1:]))
    assert all(align_frame_count(n) == n for n in legal)


def test_frames_between_legal_lengths_names_both_neighbours() -> None:
    error = reject(fast_request(frames=23), "frames",
                   "frames=23 is not a legal H3 length; the next legal lengths are 22 and 39")
    assert "frames=22" in error.hint and "frames=39" in error.hint


@pytest.mark.parametrize("frames, nearest", [(5, "22"), (21, "22"), (0, "22"), (363, "362"), (1000, "362")])
def test_frames_outside_the_released_range(frames: int, nearest: str) -> None:
    reject(fast_request(frames=frames), "frames", f"frames={frames}", f"is {nearest}")


@given(st.integers(MIN_FRAMES, MAX_FRAMES))
def test_frame_rule_matches_upstream_alignment(frames: int) -> None:
    """Legal exactly when h3 would not change it (h3_align_frame_count); otherwise the message
    brackets the value with its two legal neighbours."""
    request = fast_request(frames=frames)
    if align_frame_count(frames) == frames:
        request.validate()
        return
    with pytest.raises(RequestError) as caught:
        request.validate()
    below, above = align_frame_count(frames) - 17, align_frame_count(frames)
    assert f"next legal lengths are {below} and {above}" in caught.value.message


def test_every_legal_frame_count_passes() -> None:
    for frames in legal_frame_counts():
        fast_request(frames=frames).validate()


def test_seconds_use_llround_then_align_like_main_c() -> None:
    # main.c frames_from_seconds: llround(s * 24); h3 then aligns up to 5 + 17n.
    assert fast_request(frames=None, seconds=3.0).validate().frame_count == 73
    assert fast_request(frames=None, seconds=22 / 24).validate().frame_count == 22


def test_seconds_rounding_is_half_away_from_zero() -> None:
    # 22.5 frames: llround gives 23, which aligns to 39 (banker's rounding would give 22).
    assert fast_request(frames=None, seconds=22.5 / 24).validate().frame_count == 39


@pytest.mark.parametrize("seconds, fragment", [(0.0, "positive"), (-1.0, "positive"), (float("nan"), "positive"),
                                               (0.1, "0.917 s"), (15.2, "15.083 s"), (float("inf"), "inf is far"),
                                               (1e300, "15.083 s"), (10**400, "401-digit number")])
def test_bad_seconds(seconds: float, fragment: str) -> None:
    reject(fast_request(frames=None, seconds=seconds), "seconds", fragment)


def test_frames_and_seconds_are_mutually_exclusive() -> None:
    reject(fast_request(frames=22, seconds=1.0), "seconds", "mutually exclusive")


@pytest.mark.parametrize("field, value, nearest", [("width", 500, "480 and 512"), ("height", 70, "64 and 96"),
                                                   ("width", 16, "nearest valid width is 32"), ("height", 0, "32"), ("width", 2000, "nearest valid widths are 1984 and 2016")])
def test_canvas_must_be_multiples_of_32(field: str, value: int, nearest: str) -> None:
    reject(fast_request(**{field: value}), field, f"{field}={value}", "multiple of 32", nearest)


def test_the_suggested_canvas_is_the_closest_and_legal() -> None:
    reject(fast_request(width=95), "width", "64 and 96", "use width=96")
    error = reject(fast_request(width=100000, height=64), "width", "32256x32")    # the widest legal canvas
    assert "100000x" not in (error.hint or "")


@pytest.mark.parametrize(("width", "height", "suggested"), [
    (8192, 8192, "992x992"),          # was 8192x96: no canvas of that aspect at all
    (1344, 800, "1312x768"),          # 1.68:1 -> 1.71:1, not the 1.75:1 of 1344x768
    (1920, 1088, "1344x768"),         # 16:9 -> 1.75:1, the largest legal canvas, 1 % off
    (1088, 1920, "768x1344"),
    (2048, 1024, "1408x704"),         # exactly 2:1
    (32, 64000, "32x32256"),          # no canvas that thin: the closest aspect
])
def test_an_over_cap_canvas_suggests_the_largest_of_the_same_aspect(width: int, height: int, suggested: str) -> None:
    error = reject(fast_request(width=width, height=height), "width", f"{width}x{height}", "768*1344", suggested)
    w, h = (int(side) for side in suggested.split("x"))
    assert error.hint == f"use width={w} and height={h}"
    assert w % 32 == 0 and h % 32 == 0 and w * h <= 768 * 1344
    fast_request(width=w, height=h).validate()


def test_largest_released_canvas_passes() -> None:
    fast_request(width=1344, height=768).validate()
    fast_request(width=768, height=1344).validate()


def test_render_canvas_both_or_neither() -> None:
    reject(fast_request(render_width=64), "render_height", "together")
    reject(fast_request(render_height=32), "render_width", "together")


def test_render_canvas_rules() -> None:
    base = dict(width=864, height=480)
    fast_request(**base, render_width=576, render_height=320).validate()
    fast_request(**base, render_width=864, render_height=480).validate()      # equal to output is allowed
    reject(fast_request(**base, render_width=576, render_height=352), "render_width", "aspect", "576x320")
    reject(fast_request(**base, render_width=1152, render_height=640), "render_width", "larger", "864x480")
    reject(fast_request(**base, render_width=300, render_height=160), "render_width", "multiples of 32", "288x160")
    # h3's CLI reads 0x0 as "no render canvas"; the library says how to ask for that.
    reject(fast_request(**base, render_width=0, render_height=0), "render_width", "leave render_width")


@pytest.mark.parametrize("field, value, nearest", [
    ("steps", 1, 2), ("steps", 1001, 1000), ("reuse", 0, 1), ("reuse", 4, 3),
    ("layers", 34, 35), ("layers", 51, 50), ("core_reuse", 0, 1), ("core_reuse", 7, 6)])
def test_ranges_name_the_nearest_valid_value(field: str, value: int, nearest: int) -> None:
    error = reject(fast_request(**{field: value}), field, f"{field}={value}", f"nearest valid value is {nearest}")
    assert error.hint == f"use {field}={nearest}"


def test_whole_numbers_only() -> None:
    reject(fast_request(steps=2.5), "steps", "whole number")
    reject(fast_request(width=True), "width", "whole number")


def test_core_reuse_excludes_denoiser_reuse() -> None:
    fast_request(core_reuse=4, reuse=1).validate()
    reject(fast_request(core_reuse=4, reuse=2), "core_reuse", "cannot be combined")


def test_ssd_streaming_excludes_int8_row_fc2() -> None:
    reject(fast_request(ssd_streaming=True, int8_row_fc2=True), "int8_row_fc2", "SSD".lower())


def test_int8_row_fc2_excludes_slower_bf16_mlp() -> None:
    fast_request(int8_row_fc2=True, slower_paths=frozenset({SlowerPath.BF16_QKV})).validate()
    reject(fast_request(int8_row_fc2=True, slower_paths=frozenset({SlowerPath.BF16_MLP})),
           "int8_row_fc2", "BF16 MLP")


def test_seed_is_a_uint64() -> None:
    fast_request(seed=2**64 - 1).validate()
    reject(fast_request(seed=-1), "seed", "2**64-1")
    reject(fast_request(seed=2**64), "seed", "2**64-1")


def test_prompt_must_not_be_empty_or_hold_nul() -> None:
    reject(fast_request(prompt="   "), "prompt", "empty or only whitespace")
    reject(fast_request(prompt="a\0b"), "prompt", "NUL")


@pytest.mark.parametrize("prompt, position", [("caf\udce9 fox", "character 4"), ("x\ud800", "character 2")])
def test_prompt_that_is_not_utf8_is_refused_before_the_engine(prompt: str, position: str) -> None:
    """h3 refuses it only after loading the model (h3_tokenizer.m "prompt is not valid UTF-8");
    bytes that are not UTF-8 on a command line reach Python as lone surrogates."""
    reject(fast_request(prompt=prompt), "prompt", "not valid UTF-8", position)


def test_reference_count_limits() -> None:
    reject(fast_request(references=refs(*[ReferenceKind.IMAGE] * 13)), "references", "at most 12")
    reject(fast_request(references=refs(*[ReferenceKind.IMAGE] * 10)), "references", "10 reference images",
           "at most 9")
    reject(fast_request(references=refs(*[ReferenceKind.SILENT_VIDEO] * 4)), "references", "at most 3")
    reject(fast_request(references=refs(ReferenceKind.IMAGE, *[ReferenceKind.AUDIO] * 4)), "references",
           "4 reference audio inputs")
    # A video with its soundtrack is an audio input too (h3.c h3_valid_params).
    reject(fast_request(references=refs(ReferenceKind.VIDEO, ReferenceKind.VIDEO_AUDIO, *[ReferenceKind.AUDIO] * 2)),
           "references", "audio inputs", "soundtrack")
    fast_request(references=refs(*[ReferenceKind.IMAGE] * 9, *[ReferenceKind.SILENT_VIDEO] * 3)).validate(
        check_files=False)


def test_audio_references_need_a_visual_reference() -> None:
    reject(fast_request(references=refs(ReferenceKind.AUDIO)), "references", "image or video reference")


def test_references_exclude_anchors() -> None:
    reject(fast_request(first_frame=IMG, references=refs(ReferenceKind.IMAGE)), "references", "anchors")
    reject(fast_request(last_frame=IMG, references=refs(ReferenceKind.IMAGE)), "references", "anchors")


def test_video_audio_needs_its_soundtrack_path() -> None:
    reject(fast_request(references=(Reference(ReferenceKind.VIDEO_AUDIO, IMG),)), "references", "audio_path")
    reject(fast_request(references=(Reference(ReferenceKind.IMAGE, IMG, IMG),)), "references", "audio_path")


def test_presets() -> None:
    assert set(PRESETS) == {"preview", "balanced", "quality", "reference", "turbo"}
    # turbo (a folded step-distillation LoRA, h3.c PR #14): 6 steps, no reuse, no core reuse, every layer
    turbo = GenerationRequest.from_preset("turbo", "a fox")
    assert (turbo.steps, turbo.reuse, turbo.core_reuse, turbo.layers) == (6, 1, 1, 50)
    for name, preset in PRESETS.items():
        request = GenerationRequest.from_preset(name, "a fox", width=96, height=64, frames=22).validate()
        assert (request.steps, request.layers, request.reuse) == (preset.steps, preset.layers, preset.reuse)
    assert GenerationRequest.from_preset("quality", "a fox", steps=3).steps == 3
    with pytest.raises(RequestError) as caught:
        GenerationRequest.from_preset("ultra", "a fox")
    assert caught.value.field == "preset" and "balanced" in caught.value.hint


def test_reference_image_size_enum() -> None:
    fast_request(reference_image_size=ReferenceImageSize.MAX).validate()
    reject(fast_request(reference_image_size="huge"), "reference_image_size", "match or max")


# ----------------------------------------------------------------------------- file checks

def test_anchor_files_must_exist_and_be_images(media: dict[str, Path], tmp_path: Path) -> None:
    fast_request(first_frame=media["image"], last_frame=media["image2"]).validate()
    reject(fast_request(first_frame=tmp_path / "missing.png"), "first_frame", "does not exist", check_files=True)
    unreadable = reject(fast_request(last_frame=media["text"]), "last_frame", f"last frame: {media['text']} is damaged "
                        "or is not a picture, video or sound file", check_files=True)
    assert "Errno" not in str(unreadable) and "export it again" in (unreadable.hint or "")
    reject(fast_request(first_frame=media["audio3s"]), "first_frame", "no image or video stream", check_files=True)
    # Value checks alone never open files.
    fast_request(first_frame=tmp_path / "missing.png").validate(check_files=False)


def test_reference_files_kinds(media: dict[str, Path]) -> None:
    ok = (Reference(ReferenceKind.IMAGE, media["image"]), Reference(ReferenceKind.SILENT_VIDEO, media["silent3s"]),
          Reference(ReferenceKind.AUDIO, media["audio3s"]))
    fast_request(references=ok).validate()
    reject(fast_request(references=(Reference(ReferenceKind.IMAGE, media["image"]),
                                    Reference(ReferenceKind.AUDIO, media["image2"]))),
           "references", "no audio stream", check_files=True)
    error = reject(fast_request(frames=56, references=(Reference(ReferenceKind.VIDEO, media["silent3s"]),)),
                   "references", "no audio stream", check_files=True)
    assert "silent_video" in error.hint


def test_reference_audio_duration_limits(media: dict[str, Path]) -> None:
    image = Reference(ReferenceKind.IMAGE, media["image"])
    reject(fast_request(references=(image, Reference(ReferenceKind.AUDIO, media["audio1s"]))),
           "references", "1.00 s", "at least 2 s", check_files=True)
    reject(fast_request(references=(image, Reference(ReferenceKind.AUDIO, media["audio16s"]))),
           "references", "at most 15 s", check_files=True)
    six = Reference(ReferenceKind.AUDIO, media["audio6s"])
    fast_request(references=(image, six, six)).validate()
    reject(fast_request(references=(image, six, six, six)), "references", "together", "at most 15 s",
           check_files=True)


def test_video_soundtrack_needs_56_output_frames(media: dict[str, Path]) -> None:
    video = Reference(ReferenceKind.VIDEO, media["video3s"])
    fast_request(frames=56, references=(video,)).validate()
    reject(fast_request(frames=39, references=(video,)), "frames", "at least 56 output frames", check_files=True)
    # The silent variant has no such rule.
    fast_request(frames=22, references=(Reference(ReferenceKind.SILENT_VIDEO, media["video3s"]),)).validate()


def test_video_soundtrack_needs_56_frames_of_video(media: dict[str, Path]) -> None:
    short = Reference(ReferenceKind.VIDEO_AUDIO, media["video1s"], media["audio3s"])
    reject(fast_request(frames=56, references=(short,)), "references", "24 frames", "56", check_files=True)
    separate = Reference(ReferenceKind.VIDEO_AUDIO, media["video3s"], media["audio6s"])
    fast_request(frames=73, references=(separate,)).validate()


# ----------------------------------------------------------------------------- agreement with h3-sim's mirror

@given(width=st.sampled_from([32, 64, 96, 500, 768, 864, 1344, 1376]),
       height=st.sampled_from([32, 64, 480, 768, 770, 1344]),
       render=st.sampled_from([None, (32, 32), (64, 32), (432, 240), (96, 64), (576, 320), (2000, 2000)]),
       frames=st.sampled_from(legal_frame_counts() + [5, 21, 379]),
       steps=st.integers(0, 1002), reuse=st.integers(0, 4), layers=st.integers(33, 52),
       core_reuse=st.integers(0, 7), ssd=st.booleans(), int8=st.booleans(), bf16_mlp=st.booleans())
def test_value_rules_agree_with_h3_sim(width: int, height: int, render: tuple[int, int] | None, frames: int,
                                       steps: int, reuse: int, layers: int, core_reuse: int, ssd: bool,
                                       int8: bool, bf16_mlp: bool) -> None:
    """Two independent mirrors of h3.c h3_valid_params (+ the 22-frame check) must agree on what
    is legal, for frame counts that are already 5 + 17n."""
    from h3bridge.sim.params import SimParams, valid_params_error
    render_w, render_h = render or (0, 0)
    ours = fast_request(width=width, height=height, frames=frames, steps=steps, reuse=reuse, layers=layers,
                        core_reuse=core_reuse, ssd_streaming=ssd, int8_row_fc2=int8,
                        render_width=render_w if render else None, render_height=render_h if render else None,
                        slower_paths=frozenset({SlowerPath.BF16_MLP}) if bf16_mlp else frozenset())
    try:
        ours.validate(check_files=False)
        accepted = True
    except RequestError:
        accepted = False
    sim = SimParams(width=width, height=height, frames=frames, steps=steps, denoise_reuse=reuse, dit_layers=layers,
                    core_reuse=core_reuse, ssd_streaming=int(ssd), use_int8_row_fc2=int(int8),
                    use_slower_bf16_mlp=int(bf16_mlp), render_width=render_w, render_height=render_h)
    sim_accepts = valid_params_error(sim, metal4=True, has_frame_callback=True) is None and frames >= 22
    assert accepted == sim_accepts


@given(st.integers(1, 2000), st.integers(1, 2000))
def test_every_over_cap_suggestion_is_a_legal_canvas(width_units: int, height_units: int) -> None:
    from h3bridge.geometry import largest_canvas_like
    width, height = width_units * 32, height_units * 32
    w, h = largest_canvas_like(width, height)
    assert w >= 32 and h >= 32 and w % 32 == 0 and h % 32 == 0 and w * h <= 768 * 1344
    assert (w >= h) == (width >= height) or w == h


def _valid_canvases() -> list[tuple[int, int]]:
    """Every canvas h3 accepts (multiples of 32, at most 768*1344 pixels), by brute force."""
    limit = 768 * 1344
    return [(w, h) for h in range(32, limit // 32 + 1, 32) for w in range(32, limit // h + 1, 32)]


@pytest.mark.parametrize("width", [100, 500, 720, 864, 1000, 1080, 1280, 1344, 1920, 2000, 3840])
@pytest.mark.parametrize("height", [70, 480, 544, 720, 768, 1080, 1088, 2160])
def test_a_refused_canvas_suggests_a_valid_canvas_of_the_closest_aspect(width: int, height: int) -> None:
    """Issue 30: 1920x1080 was told "use --height 512" (a 1920x512 strip). Whatever rule refuses
    the canvas, the fix names both sides, passes validate(), and no valid canvas is both closer
    to the requested aspect and closer to the requested size (capped at the pixel limit); when a
    valid canvas within 3 % of the aspect exists at that size, the suggestion is within 3 % too."""
    import math
    import re
    request = fast_request(width=width, height=height)
    if width % 32 == 0 and height % 32 == 0 and width * height <= 768 * 1344:
        request.validate(check_files=False)
        return
    with pytest.raises(RequestError) as caught:
        request.validate(check_files=False)
    suggested = re.fullmatch(r"use width=(\d+) and height=(\d+)", caught.value.hint or "")
    assert suggested, caught.value.hint
    w, h = int(suggested[1]), int(suggested[2])
    fast_request(width=w, height=h).validate(check_files=False)
    target_aspect = math.log(width / height)
    target_size = math.log(min(width * height, 768 * 1344))

    def distance(canvas: tuple[int, int]) -> tuple[float, float]:
        return (abs(math.log(canvas[0] / canvas[1]) - target_aspect), abs(math.log(canvas[0] * canvas[1]) - target_size))

    aspect_off, size_off = distance((w, h))
    better = [c for c in _valid_canvases() if distance(c)[0] < aspect_off - 1e-12 and distance(c)[1] < size_off - 1e-12]
    assert not better, f"{width}x{height}: suggested {w}x{h}, but {better[:3]} are closer in aspect and size"
    same_size_close = [c for c in _valid_canvases() if distance(c)[1] <= size_off + 1e-12
                       and distance(c)[0] <= math.log1p(0.03)]
    if same_size_close:
        assert aspect_off <= math.log1p(0.03) + 1e-12, f"{width}x{height}: {w}x{h} is over 3 % off; {same_size_close[:3]}"
