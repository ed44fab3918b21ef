"""`h3bridge serve` in the peers' dialects: a vLLM-Omni or SGLang `POST /v1/videos` body turned
into h3bridge's own (the same fields and uploads request_from_wire reads), and the job objects
and errors answered in the words a client of that peer reads back.

Which dialect a request speaks is decided by its shape (docs/dialects.md):
* vLLM-Omni: it uses a field only vLLM-Omni has (`extra_params`, `input_references`,
  `image_reference`, `video_reference`, `audio_reference`, `aspect_ratio`, `short_edge`, `lora`,
  `timeline_guides`, `guide_files`, ...; VLLM_MARKERS below);
* SGLang: it uses a field only SGLang has (`task`, `conditions`, `target`, `audio_flow_shift`,
  `generator_device`, ...; SGLANG_MARKERS below);
* both at once: refused (400), naming one field of each;
* neither: h3bridge's own dialect, exactly as before (a body of the fields all three share is
  answered as it always was). Fields both peers have and h3 cannot honour (`negative_prompt`,
  `guidance_scale`, ...) are refused in any dialect.

Every peer field is mapped onto the GenerationRequest or refused with HTTP 400 naming it, why,
and what to send instead; nothing is dropped silently. Files arrive only in the request
(multipart parts, or base64 `data:` URLs): a URL to fetch, a `file_id` or a path is refused.
"""
from __future__ import annotations

import json
import math
import mimetypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..errors import RequestError, shown_value
from ..geometry import FPS, MAX_PIXELS
from ..media.decode import probe_media
from ..safeio.numbers import json_int, read_float, read_int
from ..wire.peers import (
    AUDIO_FLOW_SHIFT,
    AUTO_ASPECT_RATIOS,
    NAMED_ASPECT_RATIOS,
    PEER_SHORT_EDGE,
    PEER_TASKS,
    VIDEO_FLOW_SHIFT,
    Dialect,
    canvas_for_ratio,
    canvas_refusal,
    keyframe_canvas,
    parse_ratio,
)
from .uploads import MEDIA_SUFFIXES, UploadLimits, store_bytes
from ..runnable import h3bridge_command
from ..wire.videos import (
    JobStatus,
    UploadedFile,
    VideoError,
    VideoJob,
    decode_data_url,
    normalise_name,
)

# Names that only one peer uses: the request's dialect is read from them.
VLLM_MARKERS = frozenset({
    "extra_params", "input_references", "image_reference", "video_reference", "audio_reference", "timeline_guides",
    "guide_files", "control_reference", "control_type", "lora", "aspect_ratio", "short_edge", "start_time_seconds",
    "generate_sound", "sound_duration", "boundary_ratio", "user", "return_stage_metrics", "video_params"})
SGLANG_MARKERS = frozenset({
    "task", "conditions", "target", "audio_flow_shift", "audio_guidance_scale", "output_mode",
    "imgvid_cond_noise_aug_for_inference", "audio_cond_noise_aug_for_inference", "generator_device", "reference_url",
    "video_path", "video_url", "n", "max_sequence_length", "enable_teacache", "enable_upscaling",
    "upscaling_model_path", "upscaling_scale", "output_quality", "output_compression", "output_path",
    "diffusers_kwargs", "perf_dump_path"})

# Fields h3 cannot honour, in any dialect: name -> (why, what to do instead).
_CFG = "MiniMax-H3 is CFG-distilled: it renders one positive branch and h3 has no guidance to set"
_CANNOT: dict[str, tuple[str, str]] = {
    "negative_prompt": (_CFG + " (so there is no negative prompt)", "drop negative_prompt; say what you want in the prompt"),
    "guidance_scale": (_CFG, "drop guidance_scale"),
    "guidance_scale_2": (_CFG, "drop guidance_scale_2"),
    "true_cfg_scale": (_CFG, "drop true_cfg_scale"),
    "audio_guidance_scale": (_CFG, "drop audio_guidance_scale"),
    "boundary_ratio": ("it splits a two-expert model (Wan2.2); MiniMax-H3 has one transformer", "drop boundary_ratio"),
    "lora": ("h3 loads one model per server and takes no LoRA per request",
             f"fold the LoRA into a model (`{h3bridge_command('lora', 'fold')}` on the server) and serve that model, "
             "or drop lora"),
    "timeline_guides": ("h3 anchors only the first and the last frame; it has no guides at other frames",
                        "use input_references with extra_params {\"task\": \"fl2va\", \"frame_indices\": [0, -1]}"),
    "guide_files": ("h3 anchors only the first and the last frame; it has no guides at other frames",
                    "use input_references with extra_params {\"task\": \"fl2va\", \"frame_indices\": [0, -1]}"),
    "control_reference": ("h3 has no control inputs (depth, pose, ...)", "drop control_reference"),
    "control_type": ("h3 has no control inputs (depth, pose, ...)", "drop control_type"),
    "sound_duration": ("h3's soundtrack is always as long as the clip", "drop sound_duration; set the clip's length"),
    "frame_interpolation_exp": ("h3 renders 24 fps and interpolates no frames", "drop frame_interpolation_exp"),
    "frame_interpolation_scale": ("h3 renders 24 fps and interpolates no frames", "drop frame_interpolation_scale"),
    "frame_interpolation_model_path": ("h3 renders 24 fps and interpolates no frames, and this server opens no "
                                       "client-named path", "drop frame_interpolation_model_path"),
    "video_params": ("this server reads the clip's shape from top-level fields",
                     "send width, height, num_frames and fps as top-level fields"),
    "generator_device": ("h3 draws its noise on its own device from the seed", "drop generator_device; set seed"),
    "max_sequence_length": ("h3's text encoder takes the whole prompt", "drop max_sequence_length"),
    "enable_teacache": ("h3 has no TeaCache; its nearest speed-up is its own step reuse",
                        "drop enable_teacache, or send reuse=2"),
    "enable_upscaling": ("h3 renders the canvas asked for and upscales nothing", "drop enable_upscaling; set width and height"),
    "upscaling_model_path": ("h3 upscales nothing, and this server opens no client-named path", "drop upscaling_model_path"),
    "upscaling_scale": ("h3 upscales nothing", "drop upscaling_scale; set width and height"),
    "output_quality": ("h3 encodes the MP4 itself at one quality", "drop output_quality"),
    "output_compression": ("h3 encodes the MP4 itself at one quality", "drop output_compression"),
    "output_path": ("this server writes its outputs only in its own data directory", "drop output_path"),
    "diffusers_kwargs": ("h3 is not a diffusers pipeline", "drop diffusers_kwargs"),
    "perf_dump_path": ("this server writes no file at a client-named path", "drop perf_dump_path"),
    "imgvid_cond_noise_aug_for_inference": ("h3 adds no noise to its conditions", "drop it"),
    "audio_cond_noise_aug_for_inference": ("h3 adds no noise to its conditions", "drop it"),
    "reference_url": ("this server fetches no URL and opens no path", "upload the file (multipart input_reference)"),
    "video_path": ("this server opens no client-named path", "upload the file, or send it as a data: URL"),
    "video_url": ("this server fetches no URL", "upload the file, or send it as a data: URL"),
}
# Fields whose only value h3 can honour is the one that changes nothing: name -> (allowed, why).
_ONLY: dict[str, tuple[tuple[object, ...], str]] = {
    "enable_frame_interpolation": ((False,), "h3 renders 24 fps and interpolates no frames"),
    "generate_sound": ((True,), "MiniMax-H3 always renders its soundtrack with the picture"),
    "return_stage_metrics": ((False,), "this server reports no per-stage metrics"),
    "num_outputs_per_prompt": ((1,), "one job renders one clip"),
    "n": ((1,), "one job renders one clip"),
    "output_mode": (("decoded_files",), "this server answers with the MP4 file"),
}
_MANY_HINT = "submit one job per clip (seed, seed+1, ... for variations)"


def _refuse(name: str, message: str, hint: str) -> RequestError:
    return RequestError(message, field=name, hint=hint)


def _as_json(name: str, value: object) -> object:
    """A JSON field's value: as sent in a JSON body, or parsed from a form's text."""
    if isinstance(value, str):
        try:
            return json.loads(value, parse_int=json_int)
        except (ValueError, RecursionError):
            raise _refuse(name, f"{name} must be JSON; {shown_value(value, limit=60)} is not", f"send {name} as a "
                          "JSON value, e.g. " + ('{"task": "t2va"}' if name == "extra_params" else "[...]")) from None
    return value


def _as_number(name: str, value: object) -> float:
    """A peer's number field, read by safeio.numbers: finite, of a bounded number of digits."""
    return read_float(value, field=name, hint=f"send {name} as a number")


def _as_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise _refuse(name, f"{name} must be true or false, not {shown_value(value)}", f"send {name}=true or false")


def check_shift(name: str, value: object) -> None:
    """flow_shift / audio_flow_shift: h3 renders with the checkpoint's own shifts only."""
    wanted = AUDIO_FLOW_SHIFT if name.endswith("audio_flow_shift") else VIDEO_FLOW_SHIFT
    number = _as_number(name, value)
    if number != wanted:
        raise _refuse(name, f"{name}={shown_value(value)}: h3 renders with MiniMax-H3's own sigma shift "
                      f"({wanted:g} for {'audio' if wanted == AUDIO_FLOW_SHIFT else 'video'}, compiled into h3) and "
                      f"cannot use another", f"drop {name}, or send {name}={wanted:g}")


def _check_only(name: str, value: object) -> None:
    allowed, why = _ONLY[name]
    if isinstance(allowed[0], bool):
        given: object = _as_bool(name, value)
    elif isinstance(allowed[0], int):
        given = _as_number(name, value)
    else:
        given = value
    if given not in allowed:
        shown = str(allowed[0]).lower() if isinstance(allowed[0], bool) else allowed[0]
        raise _refuse(name, f"{name}={shown_value(value)}: {why}",
                      _MANY_HINT if name in ("n", "num_outputs_per_prompt") else f"drop {name}, or send {name}={shown}")


# ----------------------------------------------------------------------------- which dialect

def detect(names: Iterable[str]) -> Dialect:
    """The dialect a body's field names (text fields and file parts) speak; RequestError for a body
    that mixes vLLM-Omni's fields with SGLang's."""
    seen = {normalise_name(name)[0] for name in names}
    vllm = sorted(seen & VLLM_MARKERS)
    sglang = sorted(seen & SGLANG_MARKERS)
    if vllm and sglang:
        raise RequestError(f"the body mixes vLLM-Omni's {vllm[0]!r} with SGLang's {sglang[0]!r}; this server reads "
                           "one dialect per request", field=sglang[0],
                           hint=f"send vLLM-Omni's fields only (drop {', '.join(sglang)}), or SGLang's only "
                                f"(drop {', '.join(vllm)})")
    if vllm:
        return Dialect.VLLM_OMNI
    if sglang:
        return Dialect.SGLANG
    return Dialect.H3BRIDGE


# ----------------------------------------------------------------------------- a peer's body, translated

@dataclass
class TranslatedBody:
    """A body in h3bridge's words: the pairs and uploads request_from_wire reads, and the dialect
    to answer in."""

    dialect: Dialect
    pairs: list[tuple[str, object]]
    uploads: list[UploadedFile]


@dataclass
class _Media:
    """One file of a peer's request, with what kind of input it is."""

    upload: UploadedFile
    kind: str            # image | video | audio


_IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif", ".heic", ".heif"})
_AUDIO_SUFFIXES = frozenset({".wav", ".mp3", ".m4a", ".aac", ".flac", ".ogg", ".opus"})


def media_kind(upload: UploadedFile) -> str:
    """image, video or audio: by the client's file suffix as vLLM-Omni sorts them
    (helpers.py `_uploaded_media_kind`), else by what the file holds."""
    for name in (upload.filename or "", upload.path.name):
        suffix = Path(name).suffix.lower()
        if suffix in _IMAGE_SUFFIXES:
            return "image"
        if suffix in _AUDIO_SUFFIXES:
            return "audio"
        if suffix in MEDIA_SUFFIXES:
            return "video"
    try:
        info = probe_media(upload.path)
    except Exception:          # unreadable: request validation names the upload and the problem
        return "image"
    if not info.has_video:
        return "audio"
    return "image" if (info.frames_at_24fps or 0) <= 1 and not info.has_audio else "video"


class _Translation:
    """One peer body's translation: collects h3bridge pairs and canonical uploads."""

    def __init__(self, dialect: Dialect, uploads: Sequence[UploadedFile], inputs: Path, limits: UploadLimits) -> None:
        self.dialect = dialect
        self.inputs = inputs
        self.limits = limits
        self.stored: list[UploadedFile] = list(uploads)      # every file on disk, in order (numbering)
        self.pairs: list[tuple[str, object]] = []
        self.task: str | None = None
        self.task_field = "task"
        self.frame_indices: list[int] | None = None
        self.aspect: tuple[str, object] | None = None      # (field, value)
        self.short_edge: tuple[str, object] | None = None
        self.duration: tuple[str, object] | None = None
        self.start_times: list[tuple[str, object]] = []
        self.keyframes: list[tuple[int, _Media, str]] = []   # SGLang's (frame_index, media, field)
        self.media: list[tuple[_Media, str]] = []           # files in order, with the field they came in

    # ---------------------------------------------------------------- files

    def add_data_url(self, field: str, url: object, kind: str, shown_field: str) -> _Media:
        if not isinstance(url, str):
            raise _refuse(shown_field, f"{shown_field} must be a data: URL, not {shown_value(url, limit=40)}",
                          f"send {shown_field} as \"data:<type>;base64,<data>\", or upload the file")
        if not url.strip().startswith("data:"):
            raise _refuse(shown_field, f"{shown_field}={shown_value(url, limit=60)}: this server fetches no URL and opens "
                          "no path; it reads files only from the request", f"upload the file as a multipart part, or "
                          f"send {shown_field} as a base64 data: URL")
        data = decode_data_url(shown_field, url)
        suffix = {"image": ".png", "video": ".mp4", "audio": ".wav"}[kind]
        mime = url.strip()[5:].split(";", 1)[0].split(",", 1)[0].lower()
        suffix = (mimetypes.guess_extension(mime) or suffix) if mime else suffix
        upload = store_bytes(self.inputs, self.limits, self.stored, field, data, f"{field}{suffix}")
        self.stored.append(upload)
        return _Media(UploadedFile(upload.field, upload.path, upload.filename, sent_as=shown_field), kind)

    # ---------------------------------------------------------------- the canonical result

    def canonical_uploads(self) -> list[UploadedFile]:
        """The files as h3bridge's parts: anchors (first_frame/last_frame) and references
        (ref_image/ref_video/ref_silent_video/ref_audio) in order."""
        task = self.resolved_task()
        media = self.media
        result: list[UploadedFile] = []

        def as_part(item: _Media, part: str, shown: str) -> UploadedFile:
            return UploadedFile(part, item.upload.path, item.upload.filename, sent_as=item.upload.sent_as or shown)

        if task == "t2va":
            if media or self.keyframes:
                item, shown = (media[0] if media else (self.keyframes[0][1], self.keyframes[0][2]))
                raise _refuse(shown, f"task t2va renders from the prompt alone, but {shown} was given",
                              "drop the file, or use task fl2va (first/last frame) or ref2va (references)")
            return result
        if task == "fl2va":
            anchors = list(self.keyframes)
            if media:
                if any(item.kind != "image" for item, _ in media):
                    item, shown = next((m, s) for m, s in media if m.kind != "image")
                    raise _refuse(shown, f"task fl2va anchors frames with images; {item.upload.label} is a "
                                  f"{item.kind}", "upload images for fl2va, or use task ref2va for video and audio "
                                  "references")
                if self.frame_indices is None and len(media) > 2:
                    raise _refuse(media[2][1], f"task fl2va anchors the first and the last frame: at most 2 images, "
                                  f"not {len(media)}", "send one or two images, or use task ref2va for references")
                indices = self.frame_indices if self.frame_indices is not None else [0, -1][:len(media)]
                if len(indices) != len(media):
                    raise _refuse("extra_params.frame_indices", f"extra_params.frame_indices {indices} names "
                                  f"{len(indices)} frames for {len(media)} images", "give one frame index per image")
                anchors += [(index, item, shown) for index, (item, shown) in zip(indices, media)]
            indices = [index for index, _, _ in anchors]
            if indices not in ([0], [-1], [0, -1]):
                where = "extra_params.frame_indices" if self.dialect is Dialect.VLLM_OMNI else "conditions"
                raise _refuse(where, f"frame indices {indices}: h3 anchors only the first frame (0) and the last (-1), "
                              "as [0], [-1] or [0, -1]", "use frame_indices [0], [-1] or [0, -1]")
            for index, item, shown in anchors:
                result.append(as_part(item, "first_frame" if index == 0 else "last_frame", shown))
            return result
        # ref2va
        if self.keyframes:
            raise _refuse(self.keyframes[0][2], "h3 takes Ref2VA references or first/last-frame keyframes, not both in "
                          "one request", "drop the keyframe conditions, or use task fl2va without references")
        if self.frame_indices is not None:
            raise _refuse("extra_params.frame_indices", "frame_indices anchors fl2va frames; task ref2va has none",
                          "drop frame_indices, or use task fl2va")
        if not media:
            raise _refuse(self.task_field, "task ref2va needs at least one reference (an image, a video or audio)",
                          "upload references as input_references, or use task t2va")
        for item, shown in media:
            part = {"image": "ref_image", "video": "ref_video", "audio": "ref_audio",
                    "silent_video": "ref_silent_video"}[item.kind]
            result.append(as_part(item, part, shown))
        return result

    def resolved_task(self) -> str:
        if self.task is not None:
            return self.task
        if not self.media and not self.keyframes:
            return "t2va"
        if self.keyframes or (len(self.media) == 1 and self.media[0][0].kind == "image"
                              and self.media[0][1] == "input_reference"):
            return "fl2va"       # the OpenAI meaning of one input_reference image: the clip's first frame
        return "ref2va"

    def finish(self, own: Sequence[UploadedFile] | None = None) -> TranslatedBody:
        """The translated body. `own`: h3bridge's own file parts, which already say what each file is
        (first_frame, ref_image, ...), instead of the files given in the peer's words; every other
        check (duration, canvas, start times) is the same for both."""
        if own is None:
            uploads = self.canonical_uploads()
        else:
            if self.frame_indices is not None:
                raise _refuse("extra_params.frame_indices", "extra_params.frame_indices says which frames a peer's "
                              "images anchor; h3bridge's own file parts (first_frame, last_frame) already say it",
                              "drop extra_params.frame_indices, or send the images as input_references")
            uploads = list(own)
        self._apply_duration()
        self._apply_canvas(uploads)
        for name, value in self.start_times:
            if _as_number(name, value) != 0:
                raise _refuse(name, f"{name}={shown_value(value)}: h3 reads a reference video from its start",
                              "trim the video to the part you want first (e.g. ffmpeg -ss), and drop the start time")
        return TranslatedBody(self.dialect, self.pairs, uploads)

    def _given(self, *names: str) -> str | None:
        return next((name for name, _ in self.pairs if name in names), None)

    def _apply_duration(self) -> None:
        if self.duration is None:
            return
        name, value = self.duration
        other = self._given("seconds", "num_frames", "frames")
        # refused under the peer's own name (a negative duration was refused as `seconds`)
        seconds = read_float(value, field=name, greater_than=0.0, hint=f"send {name} as a positive number of seconds")
        if other is not None:
            given = dict(self.pairs)[other]
            if other == "seconds" and _as_number("seconds", given) == seconds:
                return
            raise _refuse(name, f"{name}={shown_value(value)} and {other}={shown_value(given)} both set the clip's "
                          "length", f"give {name} or {other}, not both")
        self.pairs.append(("seconds", seconds))

    def _apply_canvas(self, uploads: list[UploadedFile]) -> None:
        if self.short_edge is not None:
            name, value = self.short_edge
            if _as_number(name, value) != PEER_SHORT_EDGE:
                raise _refuse(name, f"{name}={shown_value(value)}: MiniMax-H3's canvas rule takes a {PEER_SHORT_EDGE}-"
                              "pixel short edge only", f"drop {name}, or give width and height for another canvas")
        explicit = self._given("width", "height", "size")
        task = self.resolved_task()
        if self.aspect is None:
            if explicit is not None or task == "t2va":
                return           # the canvas asked for, or h3's default for text alone
            ratio_text: str = "auto"
            field = "aspect_ratio"
        else:
            field, value = self.aspect
            ratio_text = str(value).strip()
            if ratio_text not in NAMED_ASPECT_RATIOS and ratio_text not in AUTO_ASPECT_RATIOS:
                raise _refuse(field, f"{field}={shown_value(value)} is not one of MiniMax-H3's aspect ratios",
                              f"use one of {', '.join(NAMED_ASPECT_RATIOS)} or auto, or give width and height")
        if ratio_text in AUTO_ASPECT_RATIOS:
            if task == "t2va":
                if explicit is not None:
                    return
                raise _refuse(field, f"{field}={ratio_text}: a text-only clip has no image to take its shape from",
                              f"use one of {', '.join(NAMED_ASPECT_RATIOS)}, or give width and height")
            if explicit is not None:
                return
            first = next((u for u in uploads if u.field in ("first_frame", "last_frame")), None)
            canvas = keyframe_canvas(first.path) if task == "fl2va" and first is not None else None
            # Ref2VA's default is 16:9 (the recipe); an unreadable image is named by validation later.
            width, height = canvas if canvas is not None else canvas_for_ratio(16 / 9)
        else:
            ratio = parse_ratio(ratio_text) or 1.0
            if explicit is not None:
                self._check_explicit_ratio(field, ratio_text, ratio)
                return
            width, height = canvas_for_ratio(ratio)
            if width * height > MAX_PIXELS:
                raise canvas_refusal(field, ratio_text)
        self.pairs += [("width", width), ("height", height)]

    def _check_explicit_ratio(self, field: str, ratio_text: str, ratio: float) -> None:
        values = dict(self.pairs)
        if "size" in values:
            w_given, _, h_given = str(values["size"]).lower().partition("x") if isinstance(values["size"], str) \
                else ("", "", "")
        else:
            w_given, h_given = values.get("width"), values.get("height")
        try:
            width, height = read_int(w_given, field="width"), read_int(h_given, field="height")
        except RequestError:
            return          # request_from_wire names the malformed size or width/height
        if height <= 0 or width <= 0:
            return
        if abs(math.log((width / height) / ratio)) > math.log1p(0.03):
            raise _refuse(field, f"{field}={ratio_text} disagrees with the canvas {width}x{height} asked for",
                          f"drop {field}, or give a canvas of that aspect")


def _common_field(name: str, value: object, shown: str | None = None) -> bool:
    """The fields both peers handle alike; True when `name` was one."""
    shown = shown or name
    if name in _CANNOT:
        why, hint = _CANNOT[name]
        raise _refuse(shown, f"{shown}: {why}", hint)
    if name in _ONLY:
        _check_only(name, value)
        return True
    if name in ("flow_shift", "audio_flow_shift"):
        check_shift(shown, value)
        return True
    if name == "quality":
        if value not in ("lossless",):
            raise _refuse(shown, f"quality={shown_value(value)}: h3 renders every step in full, the peers' "
                          "\"lossless\" quality, and has no faster lossy cache policy",
                          "drop quality, or send quality=lossless (for speed, h3bridge's own reuse=2)")
        return True
    return False


def _translate_vllm(t: _Translation, pairs: Sequence[tuple[str, object]], uploads: Sequence[UploadedFile]) -> None:
    for raw, value in pairs:
        name, _ = normalise_name(raw)
        if name == "user":
            continue             # a tracking id for the peer's logs; nothing to render
        if name == "extra_params":
            _vllm_extra(t, _as_json(name, value))
        elif name in ("image_reference", "video_reference", "audio_reference"):
            kind = name.split("_", 1)[0]
            items = _as_json(name, value)
            for item in (items if isinstance(items, list) else [items]):
                key = f"{kind}_url"
                if not isinstance(item, Mapping) or set(item) != {key}:
                    if isinstance(item, Mapping) and "file_id" in item:
                        raise _refuse(name, f"{name}: file_id references are not stored on this server",
                                      f"send {{\"{key}\": \"data:...;base64,...\"}}, or upload the file")
                    raise _refuse(name, f"{name} must be {{\"{key}\": \"data:...\"}} (or a list of them), not "
                                  f"{shown_value(item, limit=60)}", f"send {{\"{key}\": \"data:...;base64,...\"}}")
                t.media.append((t.add_data_url(name, item[key], kind, name), name))
        elif name == "aspect_ratio":
            t.aspect = (name, value)
        elif name == "short_edge":
            t.short_edge = (name, value)
        elif name == "start_time_seconds":
            t.start_times.append((name, value))
        elif name == "fps" and isinstance(value, str) and "." in value:
            # vLLM-Omni's form reads fps as a float ("24.0"); h3bridge's takes whole numbers.
            number = _as_number(name, value)
            t.pairs.append((raw, int(number) if number.is_integer() else value))
        elif not _common_field(name, value):
            t.pairs.append((raw, value))
    for upload in uploads:
        if upload.field in ("input_reference", "input_references"):
            item = _Media(UploadedFile(upload.field, upload.path, upload.filename, sent_as=upload.field),
                          media_kind(upload))
            t.media.append((item, upload.field))
        else:           # guide_files, control_reference
            why, hint = _CANNOT[upload.field]
            raise _refuse(upload.field, f"{upload.field}: {why}", hint)
    # input_reference may not be combined with input_references (vLLM-Omni's rule).
    fields = {shown for _, shown in t.media}
    if "input_references" in fields and "input_reference" in fields:
        raise _refuse("input_reference", "input_reference and input_references were both sent",
                      "send input_references alone (one part per file)")


_VLLM_EXTRA_KEYS = ("task", "duration", "frame_indices", "aspect_ratio", "short_edge", "flow_shift",
                    "audio_flow_shift", "start_time_seconds", "quality")


def _vllm_extra(t: _Translation, extra: object) -> None:
    if not isinstance(extra, Mapping):
        raise _refuse("extra_params", f"extra_params must be a JSON object, not {shown_value(extra, limit=60)}",
                      'send extra_params={"task": "t2va"}')
    for key, value in extra.items():
        shown = f"extra_params.{key}"
        if key == "task":
            t.task_field = shown
            _set_task(t, shown, value)
        elif key == "duration":
            t.duration = (shown, value)
        elif key == "frame_indices":
            if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
                raise _refuse(shown, f"{shown} must be a list of frame numbers, not {shown_value(value)}",
                              "send [0], [-1] or [0, -1]")
            t.frame_indices = list(value)
        elif key == "aspect_ratio":
            if t.aspect is not None and t.aspect[1] != value:
                raise _refuse(shown, f"{shown} and aspect_ratio disagree", "give aspect_ratio once")
            t.aspect = (shown, value)
        elif key == "short_edge":
            t.short_edge = (shown, value)
        elif key in ("flow_shift", "audio_flow_shift"):
            check_shift(shown, value)
        elif key == "start_time_seconds":
            for item in (value if isinstance(value, list) else [value]):
                t.start_times.append((shown, item))
        elif key == "quality":
            _common_field("quality", value, shown)
        else:
            raise _refuse(shown, f"{shown}: MiniMax-H3 on this server takes no such parameter",
                          f"extra_params takes: {', '.join(_VLLM_EXTRA_KEYS)}")


def _set_task(t: _Translation, shown: str, value: object) -> None:
    task = str(value).strip().lower() if isinstance(value, str) else None
    if task not in PEER_TASKS:
        raise _refuse(shown, f"{shown}={shown_value(value)} is not a MiniMax-H3 task",
                      f"use one of: {', '.join(PEER_TASKS)}")
    t.task = task


_SGLANG_TYPES = {"image": "image", "video": "silent_video", "video_audio": "video", "audio": "audio"}


def _translate_sglang(t: _Translation, pairs: Sequence[tuple[str, object]], uploads: Sequence[UploadedFile]) -> None:
    condition_index = 0
    for raw, value in pairs:
        name, _ = normalise_name(raw)
        if name == "task":
            _set_task(t, "task", value)
        elif name == "conditions":
            items = _as_json(name, value)
            for item in (items if isinstance(items, list) else [items]):
                _sglang_condition(t, condition_index, item)
                condition_index += 1
        elif name == "target":
            _sglang_target(t, _as_json(name, value))
        elif name == "seed" and isinstance(value, list):
            raise _refuse("seed", "a list of seeds asks for several clips; one job renders one clip", _MANY_HINT)
        elif not _common_field(name, value):
            t.pairs.append((raw, value))
    for upload in uploads:
        # SGLang's multipart form carries one input_reference: the image to start from.
        t.media.append((_Media(UploadedFile(upload.field, upload.path, upload.filename, sent_as=upload.field),
                               media_kind(upload)), upload.field))


def _sglang_condition(t: _Translation, index: int, item: object) -> None:
    path = f"conditions[{index}]"
    if not isinstance(item, Mapping):
        raise _refuse(path, f"{path} must be an object", f"send {path} as {{\"type\", \"uri\", \"role\"}}")
    unknown = sorted(set(item) - {"type", "uri", "role", "frame_index", "start_time_seconds"})
    if unknown:
        raise _refuse(f"{path}.{unknown[0]}", f"{path} has unknown fields {unknown}",
                      "a condition takes type, uri, role, frame_index and start_time_seconds")
    kind = item.get("type")
    if not isinstance(kind, str) or kind not in _SGLANG_TYPES:
        raise _refuse(f"{path}.type", f"{path}.type={shown_value(kind)} is not a condition type",
                      f"use one of: {', '.join(_SGLANG_TYPES)}")
    role = item.get("role")
    if role not in ("keyframe", "reference"):
        raise _refuse(f"{path}.role", f"{path}.role={shown_value(role)} must be keyframe or reference",
                      "use role keyframe (an image at frame 0 or -1) or reference")
    base_kind = "image" if kind == "image" else "audio" if kind == "audio" else "video"
    media = t.add_data_url(path, item.get("uri"), base_kind, f"{path}.uri")
    if item.get("start_time_seconds") is not None:
        t.start_times.append((f"{path}.start_time_seconds", item["start_time_seconds"]))
    if role == "keyframe":
        if kind != "image":
            raise _refuse(f"{path}.type", f"{path}: a keyframe is an image, not a {kind}",
                          "use type image for keyframes")
        frame = item.get("frame_index")
        if not isinstance(frame, int) or isinstance(frame, bool):
            raise _refuse(f"{path}.frame_index", f"{path}.frame_index must be 0 or -1", "send frame_index 0 or -1")
        t.keyframes.append((frame, media, f"{path}.uri"))
        return
    if item.get("frame_index") is not None:
        raise _refuse(f"{path}.frame_index", f"{path}.frame_index is only for keyframes", "drop frame_index")
    media.kind = _SGLANG_TYPES[kind]
    t.media.append((media, f"{path}.uri"))


def _sglang_target(t: _Translation, target: object) -> None:
    if not isinstance(target, Mapping):
        raise _refuse("target", f"target must be an object, not {shown_value(target, limit=60)}",
                      'send target {"short_edge": 768, "aspect_ratio": "16:9", "duration_seconds": 5}')
    for key, value in target.items():
        if key == "short_edge":
            t.short_edge = ("target.short_edge", value)
        elif key == "aspect_ratio":
            t.aspect = ("target.aspect_ratio", value)
        elif key == "duration_seconds":
            t.duration = ("target.duration_seconds", value)
        else:
            raise _refuse(f"target.{key}", f"target.{key}: MiniMax-H3's target takes no such key",
                          "target takes short_edge, aspect_ratio and duration_seconds")


def translate(pairs: Sequence[tuple[str, object]], uploads: Sequence[UploadedFile], inputs: Path,
              limits: UploadLimits) -> TranslatedBody:
    """A received body in h3bridge's words (unchanged for h3bridge's own dialect). RequestError
    naming the field for what h3 cannot honour. Data URLs in a peer's fields are stored in `inputs`."""
    dialect = detect([name for name, _ in pairs] + [u.field for u in uploads])
    if dialect is Dialect.H3BRIDGE:
        # Fields both peers have (negative_prompt, flow_shift, ...): refused, or dropped when their
        # value is the one that changes nothing; every other field is h3bridge's own, as before.
        kept: list[tuple[str, object]] = []
        for name, value in pairs:
            base = normalise_name(name)[0]
            if base in _CANNOT or base in _ONLY or base in ("flow_shift", "quality"):
                _common_field(base, value)
            else:
                kept.append((name, value))
        return TranslatedBody(dialect, kept, list(uploads))
    t = _Translation(dialect, uploads, inputs, limits)
    own = [u for u in uploads if u.field not in ("input_reference", "input_references", "guide_files",
                                                  "control_reference")]
    peer_files = [u for u in uploads if u not in own]
    if dialect is Dialect.VLLM_OMNI:
        _translate_vllm(t, pairs, peer_files)
    else:
        _translate_sglang(t, pairs, peer_files)
    if own:
        if t.media or t.keyframes:
            raise _refuse(own[0].field, f"{own[0].field} is h3bridge's own file part; this request gives its files "
                          "in its peer's words too", f"send the files one way: {own[0].field} parts, or the peer's")
        if t.task is not None:
            raise _refuse(t.task_field, "a task with h3bridge's own file parts: the parts already say what they are",
                          f"drop {t.task_field}")
        return t.finish(own)
    return t.finish()


# ----------------------------------------------------------------------------- answers, in the dialect

DIALECT_KEY = "dialect"      # where a job's dialect is kept: its stored shape (ignored by VideoJob)


def job_dialect(shape: Mapping[str, object]) -> Dialect:
    """The dialect a stored job was submitted in (h3bridge's for jobs from before dialects)."""
    return Dialect(shape.get(DIALECT_KEY, Dialect.H3BRIDGE.value))


def _whole_seconds(job: VideoJob) -> str:
    frames = job.num_frames or 0
    return str(max(1, round(frames / FPS)))


def _sglang_seconds(job: VideoJob) -> str:
    seconds = (job.num_frames or 0) / FPS
    rounded = round(seconds)
    return str(rounded) if abs(seconds - rounded) < 1e-9 else f"{seconds:.6f}".rstrip("0").rstrip(".")


def job_body(job: VideoJob, dialect: Dialect) -> dict[str, Any]:
    """The job object as `dialect`'s clients read it (h3bridge's own fields kept beside)."""
    body = job.model_dump(mode="json")
    if dialect is not Dialect.H3BRIDGE and job.status is JobStatus.PAUSED:
        body["status"] = JobStatus.IN_PROGRESS.value     # the peers' clients know only the OpenAI four
    if dialect is Dialect.VLLM_OMNI:
        # vllm_omni protocol/videos.py VideoResponse: seconds is whole seconds ("^[1-9]\d*$").
        body.update(seconds=_whole_seconds(job), quality="lossless", media_type="video/mp4",
                    duration_s=(job.num_frames or 0) / FPS,
                    file_name=f"{job.id}.mp4" if job.status is JobStatus.COMPLETED else None,
                    stage_durations={}, peak_memory_mb=0.0, inference_time_s=None)
        if body.get("prompt") is None:
            body["prompt"] = ""
    elif dialect is Dialect.SGLANG:
        body.update(seconds=_sglang_seconds(job), quality="standard", url=None, file_path=None)
    return body


def error_body(status: int, error: VideoError, dialect: Dialect) -> dict[str, Any]:
    """An HTTP error body as `dialect`'s clients read it: vLLM's {"error": {message, type, param,
    code: <status>}}, FastAPI's {"detail": message} for SGLang (with the error object beside it,
    for its field and fix); h3bridge's own otherwise."""
    inner = error.model_dump(mode="json")
    if dialect is Dialect.VLLM_OMNI:
        inner.update(code=status, type="BadRequestError" if status == 400 else inner.get("type"))
        return {"error": inner}
    if dialect is Dialect.SGLANG:
        return {"detail": error.message, "error": inner}
    return {"error": inner}


__all__ = ["DIALECT_KEY", "SGLANG_MARKERS", "TranslatedBody", "VLLM_MARKERS", "check_shift", "detect", "error_body",
           "job_body", "job_dialect", "media_kind", "translate"]
