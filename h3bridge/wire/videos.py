"""The OpenAI Videos API as h3bridge speaks it: a GenerationRequest <-> a `POST /v1/videos` body,
both ways, and the objects the API answers with (the job, its list, a deletion, an error).

One table (FIELDS) says how each body field maps onto the request, so the server's parser
(`request_from_wire`) and the client's writer (`request_to_wire`, for RemoteEngine) cannot drift.

Field names follow SGLang Diffusion (python/sglang/multimodal_gen/runtime/entrypoints/openai/
protocol.py, `VideoGenerationsRequest`) and vLLM-Omni (vllm_omni/entrypoints/openai/protocol/
videos.py, `VideoGenerationRequest`) where they have one: `prompt`, `model`, `size` ("WxH"),
`width`/`height`, `seconds`, `num_frames`, `fps`, `seed`, `num_inference_steps`, and
`input_reference` (the image to start from: SGLang's image-to-video image; h3's first frame).
H3 settings without a standard field are extra body fields named as `h3bridge generate`'s flags
(argparse's spelling: dashes as underscores): `preset`, `reuse`, `layers`, `core_reuse`,
`token_reduction`, `ssd_streaming`, `int8_row_fc2`, `reference_rope`, `render_width`,
`render_height`, `ref_image_size`, `slower_paths` (repeated); `frames` and `steps` are accepted as
the CLI's names of `num_frames` and `num_inference_steps`. The old spellings `use_int8_row_fc2`,
`use_reference_rope` and `use_slower` are still accepted, with a DeprecationWarning (vocabulary.py).

Files travel as multipart parts (never as paths: a server opens no client-named file):
`input_reference` (or `first_frame`) and `last_frame` are the FL2VA anchors; the ordered Ref2VA
references are parts named as the CLI's flags, in the order they appear in the form:
`ref_image`, `ref_video`, `ref_silent_video`, `ref_audio`, and `ref_video_audio` parts in pairs
(the video, then its soundtrack). In a JSON body (and in a form, as `field[image_url]`) a file may
instead be an OpenAI image reference object `{"image_url": "data:<type>;base64,<data>"}`.

Values arrive typed (JSON) or as text (multipart: the official `openai` client always sends
`videos.create` as multipart, booleans as "true"/"false", lists as `name[]`); either way they are
turned into the request's types here and every rule is then checked by
`GenerationRequest.validate`, the same code `h3bridge generate` runs: this module checks only
what the request cannot express (unknown fields, a field given twice, `size`, `fps`).
"""
from __future__ import annotations

import base64
import binascii
import enum
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

from pydantic import BaseModel, Field

from ..errors import RequestError, shown_value
from ..fixes import Change, Given, python_word
from ..safeio.numbers import LongNumber, json_int, read_float, read_int, whole_number
from ..geometry import FPS
from ..request import (
    DEFAULT_FRAMES,
    MAX_LAYERS,
    PRESETS,
    GenerationRequest,
    Reference,
    ReferenceImageSize,
    ReferenceKind,
    SlowerPath,
)
from ..vocabulary import RENAMED_KEYS, warn_renamed

# The header a submission carries so that sending it again (after a client was killed between the
# server's answer and the moment it wrote the job's id down) gives back the same job instead of a
# second one: the IETF draft's "Idempotency-Key", which `h3bridge serve` honours (jobs.py).
IDEMPOTENCY_HEADER = "Idempotency-Key"

VIDEOS_PATH = "/v1/videos"
HEALTH_PATH = "/health"            # readiness probe: 200 once the server accepts jobs
API_KEY_ENV = "H3BRIDGE_API_KEY"   # the bearer key, for the server and for clients
DEFAULT_MODEL = "MiniMax-H3"       # what a job reports as its model when the client named none


def pause_path(job_id: str, paused: bool) -> str:
    """POST here pauses (`paused`) or resumes a running job (server/routes/control.py)."""
    return f"{VIDEOS_PATH}/{job_id}/{'pause' if paused else 'resume'}"


class JobStatus(str, enum.Enum):
    """The OpenAI `Video.status` values."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    # h3bridge's own: a running job its client paused (POST /v1/videos/{id}/pause); the engine is
    # stopped with its memory resident and the jobs queued behind it wait. Peers' dialects, whose
    # clients know only the four OpenAI values, read it as in_progress (server/dialects.py).
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED)


class ErrorCode(str, enum.Enum):
    """`error.code` of a failed job or of an HTTP error body."""

    INVALID_REQUEST = "invalid_request"   # refused before queueing (HTTP 400): the generate message
    ENGINE_FAILED = "engine_failed"       # the engine ran and failed: h3's words in the message
    REFUSED = "refused"                   # refused when its turn came (model, memory plan, disk)
    INTERRUPTED = "interrupted"           # the server stopped while it ran and it was not re-run
    UNAUTHORIZED = "unauthorized"         # no or wrong API key (HTTP 401)
    NOT_FOUND = "not_found"               # no such job (HTTP 404)
    NOT_READY = "not_ready"               # content asked for before the job completed (HTTP 409)
    TOO_LARGE = "too_large"               # an upload over the server's limits (HTTP 413)
    QUEUE_FULL = "queue_full"             # --max-queued jobs wait already (HTTP 429, Retry-After)
    NOT_RUNNING = "not_running"           # pause/resume of a job that is queued or finished (HTTP 409)


# ----------------------------------------------------------------------------- the field table

@dataclass(frozen=True)
class BodyField:
    """One scalar body field: its wire name, the GenerationRequest field it sets (or a name
    handled here: model, size, fps, preset), its type, and the CLI's name when it differs."""

    name: str
    target: str
    kind: type
    alias: str | None = None       # the CLI's name, accepted too (`frames`, `steps`)
    repeated: bool = False         # may be given several times (`slower_paths`)


FIELDS: tuple[BodyField, ...] = (
    # standard (SGLang Diffusion / vLLM-Omni / OpenAI)
    BodyField("prompt", "prompt", str),
    BodyField("model", "model", str),
    BodyField("size", "size", str),
    BodyField("width", "width", int),
    BodyField("height", "height", int),
    BodyField("seconds", "seconds", float),
    BodyField("num_frames", "frames", int, alias="frames"),
    BodyField("fps", "fps", int),
    BodyField("seed", "seed", int),
    BodyField("num_inference_steps", "steps", int, alias="steps"),
    # H3 settings, named as generate's flags
    BodyField("preset", "preset", str),
    BodyField("reuse", "reuse", int),
    BodyField("layers", "layers", int),
    BodyField("core_reuse", "core_reuse", int),
    BodyField("token_reduction", "token_reduction", bool),
    BodyField("ssd_streaming", "ssd_streaming", bool),
    BodyField("int8_row_fc2", "int8_row_fc2", bool),
    BodyField("reference_rope", "reference_rope", bool),
    BodyField("render_width", "render_width", int),
    BodyField("render_height", "render_height", int),
    BodyField("ref_image_size", "reference_image_size", str),
    BodyField("slower_paths", "slower_paths", str, repeated=True),
)
_FIELD_BY_NAME: dict[str, BodyField] = {f.name: f for f in FIELDS} | {f.alias: f for f in FIELDS if f.alias}

# File parts: name -> what it is. Anchors are single; references repeat, in form order.
FIRST_FRAME_FIELDS = ("input_reference", "first_frame")
LAST_FRAME_FIELD = "last_frame"
REFERENCE_FIELDS: dict[str, ReferenceKind] = {f"ref_{kind.value}": kind for kind in ReferenceKind}
FILE_FIELDS: tuple[str, ...] = (*FIRST_FRAME_FIELDS, LAST_FRAME_FIELD, *REFERENCE_FIELDS)
# The peers' file parts (vLLM-Omni's repeated `input_references`, and the guides and controls it
# takes that h3 has no use for): stored like ours, then read by dialects.py, never by request_from_wire.
PEER_FILE_FIELDS: tuple[str, ...] = ("input_references", "guide_files", "control_reference")
# vLLM-Omni's JSON-text form fields that carry a file as a data URL (`{"image_url": "data:..."}`):
# held to the JSON body's size cap rather than a text field's.
PEER_INLINE_FILE_FIELDS: tuple[str, ...] = ("image_reference", "video_reference", "audio_reference")
_INLINE_FILE_KEY = "image_url"      # OpenAI's ImageInputReferenceParam: {"image_url": data URL}


def field_names() -> list[str]:
    """Every name a body may use, for the unknown-field message."""
    return [*(f.name for f in FIELDS), *(f.alias for f in FIELDS if f.alias), *FILE_FIELDS]


# ----------------------------------------------------------------------------- incoming bodies

@dataclass(frozen=True)
class UploadedFile:
    """A file part the server has stored in its own data directory. `filename` is the client's
    name for it, used only in messages (never as a path)."""

    field: str
    path: Path
    filename: str | None = None
    sent_as: str | None = None     # the client's part name, when a peer dialect's was translated (dialects.py)

    @property
    def label(self) -> str:
        """How messages name this upload: the client's words, never the server's path."""
        shown = self.filename if self.filename and self.filename.isprintable() else "(unnamed)"
        return f"{self.sent_as or self.field} upload {shown}"


def normalise_name(name: str) -> tuple[str, str | None]:
    """A form field name as (field, sub-key): `slower_paths[]` -> ("slower_paths", None),
    `input_reference[image_url]` -> ("input_reference", "image_url") (the openai client's
    encoding of lists and objects in multipart bodies)."""
    match = re.fullmatch(r"([A-Za-z0-9_]+)\[([A-Za-z0-9_]*)\]", name)
    if match is None:
        return name, None
    return match[1], (match[2] or None)


def is_file_field(name: str) -> bool:
    return normalise_name(name)[0] in FILE_FIELDS or normalise_name(name)[0] in PEER_FILE_FIELDS


def pairs_from_json(body: object) -> list[tuple[str, object]]:
    """A JSON body as ordered (name, value) pairs, lists spread into repeated pairs (as a
    multipart form gives them). SGLang's `extra_body` object is merged in, as SGLang does."""
    if not isinstance(body, Mapping):
        raise RequestError(f"the body must be a JSON object, not {type(body).__name__}", field=None,
                           hint='send {"prompt": "...", ...}')
    items = [(k, v) for k, v in body.items() if k != "extra_body"]
    extra = body.get("extra_body")
    if isinstance(extra, Mapping):
        items += list(extra.items())
    elif extra is not None:
        raise RequestError("extra_body must be a JSON object", field="extra_body",
                           hint="put the extra fields in an object, or at the top level")
    pairs: list[tuple[str, object]] = []
    for name, value in items:
        if not isinstance(name, str):
            raise RequestError(f"field name {name!r} is not text", field=None, hint="name fields with text")
        for item in (value if isinstance(value, list) else [value]):
            pairs.append((name, item))
    return pairs


def inline_file_text(name: str, value: object) -> str | None:
    """The data URL of a file given inline (`{"image_url": ...}` in JSON, or a form field
    `name[image_url]`), else None (a plain value)."""
    field, key = normalise_name(name)
    if isinstance(value, Mapping) and field in FILE_FIELDS:
        extra = set(value) - {_INLINE_FILE_KEY}
        if extra or not isinstance(value.get(_INLINE_FILE_KEY), str):
            raise RequestError(f"{field} must be an uploaded file or {{\"{_INLINE_FILE_KEY}\": \"data:...\"}}; "
                               f"got an object with {shown_value(sorted(map(str, value)))}", field=field,
                               hint=f"send the file as a multipart part named {field}")
        return value[_INLINE_FILE_KEY]
    if key == _INLINE_FILE_KEY and field in FILE_FIELDS and isinstance(value, str):
        return value
    return None


_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[^;,]*)*);base64,(?P<data>.*)",
                       re.DOTALL)


def decode_data_url(field: str, text: str) -> bytes:
    """The bytes of a base64 `data:` URL; a URL to fetch or a path is refused (the server
    fetches nothing and opens no client path)."""
    match = _DATA_URL.fullmatch(text.strip())
    if match is None:
        raise RequestError(f"{field}: {shown_value(text, limit=60)} is not a base64 data URL; this server reads files only "
                           f"from the request (it fetches no URL and opens no path)", field=field,
                           hint=f"upload the file as a multipart part named {field}, or send "
                                f"{{\"{_INLINE_FILE_KEY}\": \"data:image/png;base64,...\"}}")
    try:
        return base64.b64decode(match["data"], validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"{field}: the data URL's base64 data is damaged", field=field,
                           hint="encode the file with standard base64") from None


def _not_uploaded(field: str, value: object) -> RequestError:
    return RequestError(f"{field}={shown_value(value, limit=60)} is not an uploaded file: this server opens only files uploaded "
                        f"with the request, never a path or URL named by a client", field=field,
                        hint=f"upload the file as a multipart part named {field} (openai client: "
                             f"{field}=open(path, 'rb')), or send {{\"{_INLINE_FILE_KEY}\": \"data:...;base64,...\"}}")


_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_TRUE, _FALSE = frozenset({"true", "1"}), frozenset({"false", "0"})


# What each kind of field takes, for refusing a list or an object given for one.
_KIND_WORDS = {str: "text", int: "a whole number", float: "a number", bool: "true or false"}


def _require_plain_value(spec: BodyField, name: str, value: object) -> None:
    """A field's value is one JSON value (a list only spreads a repeated field into its items,
    pairs_from_json): a list or an object here is refused naming the field."""
    if isinstance(value, (list, tuple, Mapping)):
        what = "an object" if isinstance(value, Mapping) else "a list inside a list" if spec.repeated else "a list"
        wanted = _KIND_WORDS[spec.kind]
        example = (f'{name}: ["{SlowerPath.BF16_MLP.value}", "{SlowerPath.DYNAMIC_FC1_K.value}"]' if spec.repeated
                   else f"{name}: <{wanted}>")
        raise RequestError(f"{name} must be {wanted}{' (or a list of them)' if spec.repeated else ''}, not {what}",
                           field=name, hint=f"send {example}")


def _typed(spec: BodyField, value: object) -> object:
    """`value` as spec.kind when it is that or its usual text form; anything else is passed on
    unchanged, for GenerationRequest.validate to refuse in its own words. A number is read by
    safeio.numbers, so one of hundreds of digits is refused here, naming the request's field."""
    if spec.kind is int and _is_number(value, _INT_TEXT):
        return read_int(value, field=spec.target, hint=f"send {spec.name} as a whole number in the setting's range")
    if spec.kind is float and (_is_number(value, _FLOAT_TEXT) or isinstance(value, float)):
        return read_float(value, field=spec.target, hint=f"send {spec.name} as a finite number, e.g. 5")
    if isinstance(value, LongNumber):
        return whole_number(value.text)      # not a number field: validate refuses it, showing its size
    if spec.kind is bool and isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return value


def _is_number(value: object, text: re.Pattern[str]) -> bool:
    """A JSON integer (of any length) or number text: what safeio.numbers reads for a number field."""
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, LongNumber)) or (isinstance(value, str) and text.fullmatch(value.strip()) is not None)


def _parse_size(value: object) -> tuple[object, object]:
    match = re.fullmatch(r"\s*([0-9]+)\s*[xX]\s*([0-9]+)\s*", value) if isinstance(value, str) else None
    if match is None:
        raise RequestError(f"size={shown_value(value)} must be WIDTHxHEIGHT, e.g. 864x480", field="size",
                           hint="use size=864x480, or width and height")
    return whole_number(match[1]), whole_number(match[2])


def request_from_wire(pairs: Iterable[tuple[str, object]],
                      uploads: Sequence[UploadedFile] = ()) -> tuple[GenerationRequest, str | None]:
    """The GenerationRequest (not yet validated) a body describes, and the model it named.

    `pairs` are the body's non-file fields in order (`pairs_from_json`, or a form's text
    fields); `uploads` its file parts in form order, already stored by the server. Raises
    RequestError(field=<wire name>) for what only the body can get wrong; call `validate()` on
    the result for every rule `generate` checks."""
    seen: dict[str, str] = {}          # target -> the wire name that set it
    values: dict[str, object] = {}
    repeated: dict[str, list[object]] = {}
    model: str | None = None
    for raw_name, value in pairs:
        name, _ = normalise_name(raw_name)
        if name in RENAMED_KEYS:
            warn_renamed(name, RENAMED_KEYS[name], "request body")
            name = RENAMED_KEYS[name]
        if name in FILE_FIELDS:
            raise _not_uploaded(name, value)
        spec = _FIELD_BY_NAME.get(name)
        if spec is None:
            raise RequestError(f"unknown field {shown_value(name)}", field=name if len(name) <= 64 else name[:61] + "...",
                               hint=f"the fields h3bridge takes are: {', '.join(field_names())}")
        _require_plain_value(spec, name, value)
        if spec.repeated:
            repeated.setdefault(spec.target, []).append(value)
            continue
        if spec.target in seen:
            first = seen[spec.target]
            said = f"{name!r} is given more than once" if first == name else f"{first!r} and {name!r} are the same setting"
            raise RequestError(f"{said}; give it once", field=name, hint=f"keep one {spec.name}")
        seen[spec.target] = name
        values[spec.target] = _typed(spec, value)
    if "prompt" not in values:
        raise RequestError("prompt is required", field="prompt", hint="describe the clip in the prompt")
    if "model" in values:
        model = values.pop("model") if isinstance(values["model"], str) else None
        if model is None:
            raise RequestError("model must be text", field="model", hint="drop model, or name it as text")
    if "size" in values:
        width, height = _parse_size(values.pop("size"))
        for target, number in (("width", width), ("height", height)):
            if target in values and values[target] != number:
                raise RequestError(f"size={shown_value(width)}x{shown_value(height)} and "
                                   f"{target}={shown_value(values[target])} disagree",
                                   field=target, hint="give size, or width and height, not both")
            values[target] = number
    if "fps" in values:
        fps = values.pop("fps")
        if fps != FPS:
            raise RequestError(f"fps={shown_value(fps)}: MiniMax-H3 renders at {FPS} fps only", field="fps",
                               hint=f"drop fps, or use fps={FPS}")
    if "reference_image_size" in values:
        text = values["reference_image_size"]
        values["reference_image_size"] = next((s for s in ReferenceImageSize if s.value == text), text)
    if "slower_paths" in repeated:
        values["slower_paths"] = frozenset(next((p for p in SlowerPath if p.value == item), item)
                                           for item in repeated["slower_paths"])
    values.update(_files_from_uploads(uploads))
    preset = values.pop("preset", None)
    prompt = values.pop("prompt")
    if preset is not None:
        if not isinstance(preset, str):
            raise RequestError(f"preset={shown_value(preset)} must be a preset's name", field="preset",
                               hint=f"use one of: {', '.join(PRESETS)}")
        return GenerationRequest.from_preset(preset, prompt, **values), model  # type: ignore[arg-type]
    return GenerationRequest(prompt=prompt, **values), model  # type: ignore[arg-type]


def _files_from_uploads(uploads: Sequence[UploadedFile]) -> dict[str, object]:
    values: dict[str, object] = {}
    references: list[Reference] = []
    pending_video: UploadedFile | None = None
    for upload in uploads:
        field = upload.field
        if field in FIRST_FRAME_FIELDS or field == LAST_FRAME_FIELD:
            target = "last_frame" if field == LAST_FRAME_FIELD else "first_frame"
            if target in values:
                raise RequestError(f"more than one {target.replace('_', ' ')} uploaded", field=field,
                                   hint=f"upload one {field}")
            values[target] = upload.path
        elif field == "ref_video_audio":
            if pending_video is None:
                pending_video = upload
            else:
                references.append(Reference(ReferenceKind.VIDEO_AUDIO, pending_video.path, upload.path))
                pending_video = None
        elif field in REFERENCE_FIELDS:
            references.append(Reference(REFERENCE_FIELDS[field], upload.path))
        else:
            raise RequestError(f"{field!r} is not a file field", field=field,
                               hint=f"file parts are: {', '.join(FILE_FIELDS)}")
    if pending_video is not None:
        raise RequestError("a ref_video_audio video was uploaded without its soundtrack: ref_video_audio parts "
                           "come in pairs (the video, then its audio)", field="ref_video_audio",
                           hint="upload the soundtrack as the next ref_video_audio part")
    if references:
        values["references"] = tuple(references)
    return values


# ----------------------------------------------------------------------------- the API's words for a fix

# Each GenerationRequest field as the body field that sets it (the standard name where there is one).
_WIRE_NAME: dict[str, str] = {}
for _spec in FIELDS:
    _WIRE_NAME.setdefault(_spec.target, _spec.name)


def http_word(change: Change) -> str:
    """One change as a request body says it (h3bridge.fixes: the HTTP API's renderer): `"num_frames": 39`;
    a reference of one kind as its file part; what no body field sets, said as such."""
    value = change.value
    if isinstance(change, Given):     # a setting the request gave, named in a message as the error's param names it
        return python_word(change)
    if change.field == "references" and isinstance(value, ReferenceKind):
        return f'a "ref_{value.value}" file part'
    name = _WIRE_NAME.get(change.field)
    if name is None:      # preview, force, ...: the server's settings, not a job's
        return f"({change.field} is the server's setting, not a body field)"
    if value is None:
        return f'(leave "{name}" out)'
    return f'"{name}": {json.dumps(getattr(value, "value", value))}'


def http_words(group: Sequence[Change]) -> str:
    """A group of changes as body fields: `"ssd_streaming": true, "layers": 40`."""
    return ", ".join(http_word(change) for change in group)


def in_wire_words(message: str, uploads: Sequence[UploadedFile]) -> str:
    """A validation message with every stored upload's server path replaced by the client's
    name for it (the library names files by path; the client sent a part)."""
    for upload in uploads:
        message = message.replace(str(upload.path), upload.label)
    return message


# ----------------------------------------------------------------------------- outgoing bodies

@dataclass(frozen=True)
class WireBody:
    """A request as a `POST /v1/videos` body: JSON-able fields (standard names first, then the
    H3 settings that differ from upstream's defaults) and the files as (part name, local path)
    in order. A request that uses no H3-only setting is a plain SGLang/vLLM-Omni body."""

    fields: dict[str, object]
    files: tuple[tuple[str, Path], ...]

    def form_fields(self) -> list[tuple[str, str]]:
        """The fields as multipart text fields (booleans "true"/"false", lists repeated)."""
        pairs: list[tuple[str, str]] = []
        for name, value in self.fields.items():
            for item in (value if isinstance(value, list) else [value]):
                pairs.append((name, ("true" if item else "false") if isinstance(item, bool) else str(item)))
        return pairs

    @property
    def h3_only_fields(self) -> list[str]:
        """The fields only h3bridge's server understands (what another server may ignore or refuse)."""
        return [name for name in self.fields if name not in _STANDARD_NAMES] + \
            [name for name, _ in self.files if name not in FIRST_FRAME_FIELDS]


_STANDARD_NAMES = frozenset({"prompt", "model", "size", "width", "height", "seconds", "num_frames", "fps",
                             "seed", "num_inference_steps"})


def request_to_wire(request: GenerationRequest, *, model: str | None = None) -> WireBody:
    """The body that makes a server run `request` (the inverse of request_from_wire).

    The length is always explicit (`num_frames`, or `seconds` when the request gave seconds),
    and `fps` is 24, so a server with other defaults (SGLang's 4 s, vLLM-Omni's model defaults)
    renders the same length."""
    fields: dict[str, object] = {"prompt": request.prompt}
    if model is not None:
        fields["model"] = model
    fields["size"] = f"{request.width}x{request.height}"
    if request.seconds is not None:
        fields["seconds"] = request.seconds
    else:
        fields["num_frames"] = DEFAULT_FRAMES if request.frames is None else request.frames
    fields["fps"] = FPS
    fields["seed"] = request.seed
    fields["num_inference_steps"] = request.steps
    defaults = {"reuse": 1, "layers": MAX_LAYERS, "core_reuse": 1}
    for spec in FIELDS:
        if spec.name in fields or spec.target in ("prompt", "model", "size", "width", "height", "seconds",
                                                  "frames", "fps", "seed", "steps", "preset"):
            continue
        value = getattr(request, spec.target)
        if spec.target in defaults:
            if value != defaults[spec.target]:
                fields[spec.name] = value
        elif spec.kind is bool:
            if value:
                fields[spec.name] = True
        elif spec.target == "reference_image_size":
            if value is not ReferenceImageSize.MATCH:
                fields[spec.name] = value.value
        elif spec.target == "slower_paths":
            if value:
                fields[spec.name] = sorted(p.value for p in value)
        elif value is not None:
            fields[spec.name] = value
    files: list[tuple[str, Path]] = []
    if request.first_frame is not None:
        files.append((FIRST_FRAME_FIELDS[0], Path(request.first_frame)))
    if request.last_frame is not None:
        files.append((LAST_FRAME_FIELD, Path(request.last_frame)))
    for reference in request.references:
        name = f"ref_{reference.kind.value}"
        files.append((name, Path(reference.path)))
        if reference.audio_path is not None:
            files.append((name, Path(reference.audio_path)))
    return WireBody(fields, tuple(files))


# ----------------------------------------------------------------------------- response objects

class VideoError(BaseModel):
    """A failed job's `error` (OpenAI `VideoCreateError`), and the body of an HTTP error."""

    code: str
    message: str
    param: str | None = None       # the body field at fault, for a refusal
    type: str | None = None
    hint: str | None = None        # h3bridge: what to do about it


class VideoJob(BaseModel):
    """A job as `GET /v1/videos/{id}` reports it: the openai client's `Video`, plus h3bridge's
    own fields (the clip's exact shape and the engine's current phase)."""

    id: str
    object: Literal["video"] = "video"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    completed_at: int | None = None
    expires_at: int | None = None
    model: str = DEFAULT_MODEL
    status: JobStatus = JobStatus.QUEUED
    progress: int = Field(default=0, ge=0, le=100)
    prompt: str | None = None
    seconds: str = "0"                 # the clip's length when played, e.g. "2.333"
    size: str = ""                     # "WIDTHxHEIGHT"
    error: VideoError | None = None
    remixed_from_video_id: str | None = None
    # h3bridge
    num_frames: int | None = None
    fps: int = FPS
    seed: int | None = None
    phase: str | None = None           # the engine's current phase while in progress

    @property
    def fraction(self) -> float:
        return self.progress / 100.0

    def listed(self) -> "VideoJob":
        """The job as a list shows it: the prompt cut to LISTED_PROMPT_CHARS (a page holds up to
        100 jobs; the whole prompt is in GET /v1/videos/{id})."""
        if self.prompt is None or len(self.prompt) <= LISTED_PROMPT_CHARS:
            return self
        return self.model_copy(update={"prompt": self.prompt[:LISTED_PROMPT_CHARS - 1] + "\u2026"})


# How much of each prompt GET /v1/videos repeats (OpenAI's list gives the prompt; h3 takes up to
# 167,772 bytes of one, and 100 of those made a 16 MiB page).
LISTED_PROMPT_CHARS = 200


class VideoList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VideoJob]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class VideoDeleted(BaseModel):
    id: str
    deleted: bool = True
    object: Literal["video.deleted"] = "video.deleted"


class ErrorBody(BaseModel):
    """Every HTTP error's body, in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    error: VideoError


def clip_shape(request: GenerationRequest) -> dict[str, Any]:
    """The job-object fields that describe the clip a request makes."""
    frames = request.frame_count
    return {"prompt": request.prompt, "size": f"{request.width}x{request.height}", "num_frames": frames,
            "seconds": f"{frames / FPS:.3f}".rstrip("0").rstrip("."), "seed": request.seed}


def progress_percent(fraction: float, *, finished: bool = False) -> int:
    """0..100 for the job object; 100 only once the MP4 is published."""
    if finished:
        return 100
    return max(0, min(99, int(fraction * 100)))


def refusal_body(error: RequestError, uploads: Sequence[UploadedFile] = ()) -> ErrorBody:
    """The HTTP 400 body for a request refused before queueing: the library's message (as
    `generate` prints it, with uploads named as the client sent them) and its fix."""
    return ErrorBody(error=VideoError(code=ErrorCode.INVALID_REQUEST.value, type="invalid_request_error",
                                      message=in_wire_words(error.message_in(http_words), uploads), param=error.field,
                                      hint=None if error.hint is None else in_wire_words(error.hint_in(http_words) or "",
                                                                                         uploads)))


def error_from_body(body: object) -> VideoError | None:
    """The VideoError in an HTTP error body (OpenAI's shape, or FastAPI's {"detail": ...}), for clients."""
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping):
            try:       # vLLM's error code is the HTTP status, a number
                return VideoError.model_validate({**inner, "code": str(inner.get("code", "error"))})
            except ValueError:
                return None
        detail = body.get("detail")
        if detail is not None:
            return VideoError(code="error", message=str(detail))
    return None


def server_message(response: Any) -> str:
    """A server's own words for a refusal or failure, verbatim: the error object's message (OpenAI's
    shape, or FastAPI's `detail`, read by error_from_body), else the body's text. `response`: an
    httpx.Response (anything with json(), text, status_code and reason_phrase)."""
    try:
        error = error_from_body(response.json())
    except ValueError:
        error = None
    if error is not None:
        return error.message
    text = response.text.strip()
    return text[:4000] or f"HTTP {response.status_code} {response.reason_phrase}"


__all__ = [
    "API_KEY_ENV", "DEFAULT_MODEL", "ErrorBody", "ErrorCode", "FIELDS", "FILE_FIELDS", "HEALTH_PATH", "IDEMPOTENCY_HEADER",
    "JobStatus", "LISTED_PROMPT_CHARS", "LongNumber", "PEER_FILE_FIELDS", "PEER_INLINE_FILE_FIELDS", "UploadedFile", "VIDEOS_PATH", "VideoDeleted", "VideoError", "VideoJob", "VideoList",
    "WireBody", "clip_shape", "decode_data_url", "error_from_body", "server_message", "in_wire_words", "inline_file_text",
    "is_file_field", "normalise_name", "pairs_from_json", "progress_percent", "refusal_body",
    "request_from_wire", "request_to_wire", "json_int", "whole_number",
]
