"""What the two peer servers of MiniMax-H3 take and answer on `/v1/videos`, as read from their
source, and the h3bridge request written in their words (for RemoteEngine's `dialect`).

The peers (docs/dialects.md has the full story and the commits read):

* vLLM-Omni: `POST /v1/videos` and `POST /v1/videos/sync` take multipart/form-data only
  (vllm_omni/entrypoints/openai/video/generation/helpers.py `_parse_video_form`, commit
  47fa65e6547a2b28511329205d76f2a39d161312); MiniMax-H3's own settings travel in the JSON form
  field `extra_params` (`task` t2va/fl2va/ref2va, `duration`, `frame_indices`, `flow_shift`,
  `audio_flow_shift`; recipes/MiniMaxAI/MiniMax-H3.md, commit
  3199db2d986979bfbe1a7058a2d6095a193406e4); files are `input_reference` (one) or
  `input_references` (repeated, classified by type). Jobs answer vllm_omni's `VideoResponse`
  (protocol/videos.py): `seconds` is a whole number of seconds as text, `error` is
  {code: int|str, message}.
* SGLang Diffusion: `POST /v1/videos` takes JSON (or a form), extra fields allowed
  (python/sglang/multimodal_gen/runtime/entrypoints/openai/protocol.py `VideoGenerationsRequest`);
  MiniMax-H3 reads the top-level `task`, `conditions` [{type, uri, role, frame_index,
  start_time_seconds}], `target` {short_edge, aspect_ratio, duration_seconds}, `flow_shift`,
  `audio_flow_shift` (configs/sample/minimax_h3.py, commit
  9405414fc50932ddc6bbae0fca82d6e4ecbd7ea1; pipelines_core/stages/model_specific_stages/
  minimax_h3/video_adapter.py, commit 024f9a6860cec4a07ad3422274de325432b0f556, and
  request_validation.py, commit 08081180ab5829d64d60c6003cf189ecff92566b), and refuses `num_frames`,
  `fps`, `negative_prompt` and the guidance scales. A condition's `uri` may be a base64 `data:` URL
  (material_io.py, commit 41d0c1ecdd3ec6a354bf9fbca5ae1f2b9c1a842d). Errors are FastAPI's
  {"detail": message}.

Both peers render MiniMax-H3 with the checkpoint's sigma shifts, 12 for video and 3 for audio
(the recipe's `flow_shift` 12 / `audio_flow_shift` 3), the same constants h3.c compiles in
(h3_host.h H3_VIDEO_SIGMA_SHIFT, H3_AUDIO_SIGMA_SHIFT): a request naming those values asks for
what h3 does; any other value cannot be honoured.
"""
from __future__ import annotations

import base64
import enum
import json
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import RequestError, shown_value
from ..fixes import Fix, changes, given
from ..geometry import CANVAS_MULTIPLE, FPS, MAX_PIXELS, largest_canvas_like, legal_frame_counts
from ..request import MAX_LAYERS, GenerationRequest, ReferenceImageSize, ReferenceKind
from ..safeio.numbers import read_int
from .videos import JobStatus, VideoJob


class Dialect(str, enum.Enum):
    """Whose request and response shapes a conversation on /v1/videos uses."""

    H3BRIDGE = "h3bridge"
    VLLM_OMNI = "vllm-omni"
    SGLANG = "sglang"


DIALECTS = tuple(d.value for d in Dialect)


def dialect_of(value: "str | Dialect") -> Dialect:
    """The Dialect a name spells; RequestError naming `dialect` for any other."""
    for dialect in Dialect:
        if value == dialect or value == dialect.value:
            return dialect
    raise RequestError(f"dialect={shown_value(value)} is not one this client speaks", field="dialect",
                       hint=f"use one of: {', '.join(DIALECTS)}")


# h3_host.h: the sigma shifts h3 renders with (the checkpoint's own; the peers' recipe values).
VIDEO_FLOW_SHIFT = 12.0
AUDIO_FLOW_SHIFT = 3.0
# The peers' canvas rule for MiniMax-H3 (recipe "Official input matrix and limits"): the short edge
# is 768 and the long edge follows a named aspect ratio, in multiples of 32.
PEER_SHORT_EDGE = 768
NAMED_ASPECT_RATIOS = ("21:9", "16:9", "4:3", "1:1", "3:4", "9:16")
AUTO_ASPECT_RATIOS = ("auto", "adaptive")       # Ref2VA's default (16:9); FL2VA follows its first image
PEER_TASKS = ("t2va", "fl2va", "ref2va")
# The peers' MiniMax-H3 output contract (recipe): 4 to 15 seconds at 24 fps.
PEER_MIN_SECONDS, PEER_MAX_SECONDS = 4.0, 15.0
# vLLM-Omni's VideoGenerationRequest: num_inference_steps le=200; seed is a signed int64 in both.
VLLM_MAX_STEPS = 200
PEER_MAX_SEED = 2**63 - 1
# What vLLM-Omni takes as MiniMax-H3 references (helpers.py MINIMAX_H3_REFERENCE_*_SUFFIXES and
# MINIMAX_H3_REFERENCE_IMAGE_FORMATS).
VLLM_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".heic", ".heif")
VLLM_VIDEO_SUFFIXES = (".mp4", ".mov")
VLLM_AUDIO_SUFFIXES = (".wav", ".mp3")


def parse_ratio(text: str) -> float | None:
    """`W:H` as W/H, or None when it is not two positive whole numbers."""
    left, sep, right = str(text).partition(":")
    if not sep:
        return None
    try:          # safeio.numbers: ASCII digits only ("²".isdigit() is True), of a bounded length
        width, height = read_int(left, field="aspect_ratio", minimum=1), read_int(right, field="aspect_ratio", minimum=1)
    except RequestError:
        return None
    return width / height


def canvas_for_ratio(ratio: float, short_edge: int = PEER_SHORT_EDGE) -> tuple[int, int]:
    """The canvas the peers render for an aspect ratio: the short edge, and the long edge the
    ratio gives rounded down to a multiple of 32 (16:9 -> 1344x768, the recipe's size)."""
    if ratio >= 1:
        return max(CANVAS_MULTIPLE, int(short_edge * ratio) // CANVAS_MULTIPLE * CANVAS_MULTIPLE), short_edge
    return short_edge, max(CANVAS_MULTIPLE, int(short_edge / ratio) // CANVAS_MULTIPLE * CANVAS_MULTIPLE)


def named_ratio_of(width: int, height: int) -> str | None:
    """The named aspect ratio whose peer canvas is exactly width x height, if any."""
    for name in NAMED_ASPECT_RATIOS:
        if canvas_for_ratio(parse_ratio(name) or 1.0) == (width, height):
            return name
    return None


def peer_canvases() -> list[str]:
    """The canvases a peer can be asked for by name, that h3 can render (WxH)."""
    sizes = []
    for name in NAMED_ASPECT_RATIOS:
        width, height = canvas_for_ratio(parse_ratio(name) or 1.0)
        if width * height <= MAX_PIXELS:
            sizes.append(f"{width}x{height} ({name})")
    return sizes


def canvas_refusal(field_name: str, ratio_text: str) -> RequestError:
    """A named ratio whose 768-pixel canvas is more pixels than h3 renders."""
    ratio = parse_ratio(ratio_text) or 1.0
    width, height = canvas_for_ratio(ratio)
    legal_w, legal_h = largest_canvas_like(width, height)
    return RequestError(f"{field_name}={shown_value(ratio_text)} asks for a {width}x{height} canvas (768-pixel short "
                        f"edge), more than h3's {MAX_PIXELS:,} pixels", field=field_name,
                        hint=f"give width={legal_w} and height={legal_h} (the largest canvas h3 renders at that "
                             f"aspect), or another aspect ratio")


# ----------------------------------------------------------------------------- requests, written for a peer

@dataclass(frozen=True)
class PeerBody:
    """A request as one peer takes it: `form` text fields (multipart, in order) or a `json`
    object, and files as (part name, local path, media type)."""

    dialect: Dialect
    json: dict[str, Any] | None = None
    form: tuple[tuple[str, str], ...] = ()
    files: tuple[tuple[str, Path, str], ...] = ()


def _refuse_h3_only(request: GenerationRequest, dialect: Dialect) -> None:
    """The h3 settings neither peer has a field for, named as GenerationRequest names them."""
    peer = "vLLM-Omni" if dialect is Dialect.VLLM_OMNI else "SGLang"
    defaults = {"reuse": 1, "layers": MAX_LAYERS, "core_reuse": 1, "token_reduction": False, "ssd_streaming": False,
                "int8_row_fc2": False, "reference_rope": False, "render_width": None, "render_height": None,
                "reference_image_size": ReferenceImageSize.MATCH, "slower_paths": frozenset()}
    for name, default in defaults.items():
        if getattr(request, name) != default:
            setting = given(name, shown_value(getattr(request, name)))
            raise RequestError(Fix(f"{{}} is an h3 setting {peer}'s /v1/videos has no field for; the request would "
                                   "render without it", (setting,)), field=name,
                               hint=Fix("drop {}, or render on an h3bridge server (h3bridge's own dialect)", (setting,)))
    seconds = request.frame_count / FPS
    if not PEER_MIN_SECONDS <= seconds <= PEER_MAX_SECONDS:
        shortest = next(n for n in legal_frame_counts() if n / FPS >= PEER_MIN_SECONDS)
        longest = max(n for n in legal_frame_counts() if n / FPS <= PEER_MAX_SECONDS)
        raise RequestError(Fix(f"{{}} ({seconds:.3f} s): {peer}'s MiniMax-H3 renders "
                               f"{PEER_MIN_SECONDS:g} to {PEER_MAX_SECONDS:g} seconds", (given("frames", request.frame_count),)),
                           field="frames", hint=Fix("use {} up to {}", (changes(frames=shortest), changes(frames=longest))))
    if request.seed > PEER_MAX_SEED:
        raise RequestError(Fix(f"{{}} is over {peer}'s largest seed ({PEER_MAX_SEED}, a signed 64-bit number)",
                               (given("seed", request.seed),)), field="seed", hint=f"use a seed of at most {PEER_MAX_SEED}")


def _media_type(path: Path) -> str:
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def _reference_kind_word(kind: ReferenceKind, dialect: Dialect) -> str:
    """The peer's type for a Ref2VA reference; RequestError for the h3 kinds it has no word for."""
    if dialect is Dialect.SGLANG:
        # SGLang's condition types: `video` is pictures only, `video_audio` keeps the soundtrack
        # (material_io requires an audio stream for it).
        words = {ReferenceKind.IMAGE: "image", ReferenceKind.SILENT_VIDEO: "video", ReferenceKind.VIDEO: "video_audio",
                 ReferenceKind.AUDIO: "audio"}
    else:
        # vLLM-Omni sorts uploads by type and keeps a video's own soundtrack.
        words = {ReferenceKind.IMAGE: "image", ReferenceKind.VIDEO: "video", ReferenceKind.AUDIO: "audio"}
    if kind not in words:
        other = {ReferenceKind.SILENT_VIDEO: "a video whose soundtrack h3 ignores",
                 ReferenceKind.VIDEO_AUDIO: "a video paired with its own separate soundtrack"}[kind]
        peer = "vLLM-Omni" if dialect is Dialect.VLLM_OMNI else "SGLang"
        raise RequestError(f"a {kind.value} reference ({other}) has no spelling in {peer}'s request", field="references",
                           hint="use a video reference that carries its soundtrack, or render on an h3bridge server")
    return words[kind]


def _check_vllm_suffix(path: Path, kind_word: str) -> None:
    allowed = {"image": VLLM_IMAGE_SUFFIXES, "video": VLLM_VIDEO_SUFFIXES, "audio": VLLM_AUDIO_SUFFIXES}[kind_word]
    if path.suffix.lower() not in allowed:
        raise RequestError(f"{path.name}: vLLM-Omni takes MiniMax-H3 {kind_word} references only as "
                           f"{', '.join(allowed)} files (it sorts uploads by their type)", field="references",
                           hint=f"convert it to {allowed[0]} first")


def request_to_peer(request: GenerationRequest, dialect: Dialect, *, model: str | None = None,
                    encode_files: bool = True) -> PeerBody:
    """The body that asks `dialect`'s server for `request`; RequestError naming the field for
    what that server cannot be asked (before anything is sent). Without `encode_files`, SGLang's
    condition uris name the files instead of carrying them (a check that reads no file)."""
    _refuse_h3_only(request, dialect)
    if dialect is Dialect.VLLM_OMNI:
        return _to_vllm(request, model)
    if dialect is Dialect.SGLANG:
        return _to_sglang(request, model, data_url if encode_files else (lambda path: Path(path).name))
    raise ValueError(f"request_to_peer is for the peers' dialects, not {dialect.value}")


def _task_of(request: GenerationRequest) -> str:
    if request.references:
        return "ref2va"
    return "fl2va" if request.first_frame is not None or request.last_frame is not None else "t2va"


def _anchor_list(request: GenerationRequest) -> list[tuple[int, Path]]:
    anchors: list[tuple[int, Path]] = []
    if request.first_frame is not None:
        anchors.append((0, Path(request.first_frame)))
    if request.last_frame is not None:
        anchors.append((-1, Path(request.last_frame)))
    return anchors


def _to_vllm(request: GenerationRequest, model: str | None) -> PeerBody:
    if request.steps > VLLM_MAX_STEPS:
        raise RequestError(Fix(f"{{}} is over vLLM-Omni's num_inference_steps limit of {VLLM_MAX_STEPS}",
                               (given("steps", request.steps),)),
                           field="steps", hint=Fix("use {} or fewer", (changes(steps=VLLM_MAX_STEPS),)))
    task = _task_of(request)
    anchors = _anchor_list(request)
    if request.references and anchors:
        raise RequestError("vLLM-Omni takes either first/last-frame anchors (fl2va) or Ref2VA references, not both in "
                           "one request (its input_references must come alone)", field="first_frame",
                           hint="drop the anchors, or render on an h3bridge or SGLang server")
    extra: dict[str, Any] = {"task": task}
    files: list[tuple[str, Path, str]] = []
    if task == "fl2va":
        for _, path in anchors:
            _check_vllm_suffix(path, "image")
        if [index for index, _ in anchors] == [0]:
            files.append(("input_reference", anchors[0][1], _media_type(anchors[0][1])))
        else:
            extra["frame_indices"] = [index for index, _ in anchors]
            files += [("input_references", path, _media_type(path)) for _, path in anchors]
    for reference in request.references:
        word = _reference_kind_word(reference.kind, Dialect.VLLM_OMNI)
        _check_vllm_suffix(Path(reference.path), word)
        files.append(("input_references", Path(reference.path), _media_type(Path(reference.path))))
    form: list[tuple[str, str]] = [("prompt", request.prompt)]
    if model is not None:
        form.append(("model", model))
    form += [("width", str(request.width)), ("height", str(request.height)),
             ("num_frames", str(request.frame_count)), ("fps", str(FPS)),
             ("num_inference_steps", str(request.steps)), ("seed", str(request.seed)),
             ("extra_params", json.dumps(extra, separators=(",", ":")))]
    return PeerBody(Dialect.VLLM_OMNI, form=tuple(form), files=tuple(files))


def keyframe_canvas(image: Path) -> tuple[int, int] | None:
    """The canvas the peers render an FL2VA clip at: the first image's aspect at a 768-pixel short
    edge (the largest short edge that fits h3 when that is too many pixels); None if unreadable."""
    from ..media.decode import probe_media
    try:
        info = probe_media(Path(image))
    except Exception:
        return None
    if not info.width or not info.height:
        return None
    ratio = info.width / info.height
    edge = PEER_SHORT_EDGE
    while edge > CANVAS_MULTIPLE and canvas_for_ratio(ratio, edge)[0] * canvas_for_ratio(ratio, edge)[1] > MAX_PIXELS:
        edge -= CANVAS_MULTIPLE
    return canvas_for_ratio(ratio, edge)


def _require_keyframe_canvas(request: GenerationRequest) -> None:
    anchor = request.first_frame if request.first_frame is not None else request.last_frame
    canvas = keyframe_canvas(Path(anchor)) if anchor is not None else None
    if canvas is not None and canvas != (request.width, request.height):
        raise RequestError(Fix("{} {}: SGLang's MiniMax-H3 renders a first/last-frame clip at its first image's aspect "
                               f"with a 768-pixel short edge, {canvas[0]}x{canvas[1]} for this image",
                               (given("width", request.width), given("height", request.height))),
                           field="width", hint=Fix("use {} and {}", (changes(width=canvas[0]), changes(height=canvas[1]))))


def data_url(path: Path) -> str:
    """The file as a base64 `data:` URL (SGLang's condition `uri` takes one)."""
    return f"data:{_media_type(path)};base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _to_sglang(request: GenerationRequest, model: str | None, encode) -> PeerBody:
    task = _task_of(request)
    ratio = named_ratio_of(request.width, request.height)
    if task == "fl2va":
        _require_keyframe_canvas(request)
    elif ratio is None:
        raise RequestError(Fix("{} {}: SGLang's MiniMax-H3 picks the canvas from a 768-pixel short edge and a named "
                               f"aspect ratio, so it can render only {', '.join(peer_canvases())}",
                               (given("width", request.width), given("height", request.height))), field="width",
                           hint="use one of those canvases, or render on an h3bridge or vLLM-Omni server")
    conditions: list[dict[str, Any]] = []
    for index, path in _anchor_list(request):
        conditions.append({"type": "image", "uri": encode(path), "role": "keyframe", "frame_index": index})
    for reference in request.references:
        word = _reference_kind_word(reference.kind, Dialect.SGLANG)
        conditions.append({"type": word, "uri": encode(Path(reference.path)), "role": "reference"})
    body: dict[str, Any] = {"prompt": request.prompt}
    if model is not None:
        body["model"] = model
    body.update({
        "task": task,
        "conditions": conditions,
        # FL2VA's canvas follows its first image (SGLang forces aspect_ratio "auto" for it).
        "target": {"short_edge": PEER_SHORT_EDGE, "aspect_ratio": "auto" if task == "fl2va" else ratio,
                   "duration_seconds": request.frame_count / FPS},
        "width": request.width, "height": request.height,
        "num_inference_steps": request.steps, "seed": request.seed,
    })
    return PeerBody(Dialect.SGLANG, json=body)


# ----------------------------------------------------------------------------- their answers, read

def job_from_peer(body: object) -> VideoJob:
    """A peer's job object as a VideoJob (ValueError when it is none): vLLM-Omni's `size` may be
    null and its `error.code` a number; SGLang's failed job may carry {"message"} alone."""
    if not isinstance(body, Mapping):
        raise ValueError("not a job object")
    data = dict(body)
    error = data.get("error")
    if isinstance(error, Mapping):
        data["error"] = {"code": str(error.get("code", "error")), "message": str(error.get("message", "")),
                         **{k: v for k, v in error.items() if k in ("param", "type", "hint") and v is not None}}
    elif error is not None:
        data["error"] = {"code": "error", "message": str(error)}
    for name in ("size", "seconds", "model"):
        if data.get(name) is None:
            data.pop(name, None)
    if data.get("status") not in {s.value for s in JobStatus}:
        raise ValueError(f"unknown status {data.get('status')!r}")
    return VideoJob.model_validate({k: v for k, v in data.items() if k in VideoJob.model_fields})


__all__ = [
    "AUDIO_FLOW_SHIFT", "AUTO_ASPECT_RATIOS", "DIALECTS", "Dialect", "NAMED_ASPECT_RATIOS", "PEER_MAX_SEED",
    "PEER_SHORT_EDGE", "PEER_TASKS", "PeerBody", "VIDEO_FLOW_SHIFT", "canvas_for_ratio", "canvas_refusal", "data_url",
    "dialect_of", "job_from_peer", "named_ratio_of", "parse_ratio", "peer_canvases", "request_to_peer",
]
