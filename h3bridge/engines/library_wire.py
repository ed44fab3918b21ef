"""What the host and the libh3 worker say to each other, and how a request becomes `h3_params`.

The worker (library_worker.py) reads messages on its stdin and writes them on a private copy of
its stdout (fd 1 itself is pointed at stderr, so anything C prints goes to the engine log). A
message is one JSON line; a message with `"payload": N` is followed by exactly N raw bytes (a
preview image), so pixels never go through JSON. Strings keep undecodable bytes as lone
surrogates (`surrogateescape`), which JSON carries, so an invalid-UTF-8 prompt reaches
`h3_generate` byte for byte, as it reaches the one-shot engine's argv.

Host -> worker: {"op": "generate", "job": N, "prompt": ..., "fields": {...}, "references": [...],
"frames_path": PATH|null, "frame_shape": [F, H, W], "preview": bool} and {"op": "cancel", "job": N}.
Worker -> host: "ready" (device and model facts), "load_failed", "progress", "preview" (+payload),
"done", "failed".

`h3_params_fields` names fields exactly as h3.h's `h3_params`, and reference kinds by their h3.h
enum names, so the worker sets them by name on libh3's ctypes structure: the mapping is written
once, here, and tested without loading any library.
"""
from __future__ import annotations

import json
import os
from typing import IO, Any

from ..request import GenerationRequest, ReferenceImageSize, ReferenceKind

PROTOCOL_VERSION = 1
# One JSON line is at most this long (a 100 KB prompt and its fields fit many times over).
MAX_LINE = 64 * 1024 * 1024


def encode_text(text: str) -> bytes:
    """A str for C: UTF-8, undecodable bytes (surrogateescape) restored."""
    return text.encode("utf-8", "surrogateescape")


def send(stream: IO[bytes], message: dict[str, Any], payload: bytes | memoryview | None = None) -> None:
    """Write one message (and its payload) and flush."""
    if payload is not None:
        message = {**message, "payload": len(payload)}
    stream.write(json.dumps(message, ensure_ascii=True).encode("ascii") + b"\n")
    if payload is not None:
        stream.write(payload)
    stream.flush()


def receive(stream: IO[bytes]) -> tuple[dict[str, Any], bytes | None] | None:
    """The next message and its payload; None at end of stream (or a torn last message)."""
    line = stream.readline(MAX_LINE)
    if not line.endswith(b"\n"):
        return None
    message = json.loads(line)
    size = message.get("payload")
    payload = None
    if size is not None:
        payload = _read_exactly(stream, int(size))
        if payload is None:
            return None
    return message, payload


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# main.c's option table: how each --ref-* flag fills an h3_reference.
_REFERENCE_KINDS: dict[ReferenceKind, tuple[str, int]] = {
    ReferenceKind.IMAGE: ("H3_REFERENCE_IMAGE", 0),
    ReferenceKind.VIDEO: ("H3_REFERENCE_VIDEO", 1),          # --ref-video: with its embedded audio
    ReferenceKind.SILENT_VIDEO: ("H3_REFERENCE_VIDEO", 0),   # --ref-silent-video
    ReferenceKind.VIDEO_AUDIO: ("H3_REFERENCE_VIDEO_AUDIO", 0),
    ReferenceKind.AUDIO: ("H3_REFERENCE_AUDIO", 0),
}
_IMAGE_SIZES = {ReferenceImageSize.MATCH: "H3_REFERENCE_IMAGE_MATCH", ReferenceImageSize.MAX: "H3_REFERENCE_IMAGE_MAX"}


def _path(path: os.PathLike[str] | str | None) -> str | None:
    return None if path is None else os.path.abspath(os.path.expanduser(os.fspath(path)))


def h3_params_fields(request: GenerationRequest, *, output_path: str | None, preview: bool) -> dict[str, Any]:
    """Every `h3_params` field (h3.h) the request sets, by its C name, as main.c sets it from the
    same flags; enum values by their h3.h names. Callbacks and the reference array are the
    worker's. `output_path` None: no MP4 (main.c's `-o ''`)."""
    fields: dict[str, Any] = {
        "width": request.width, "height": request.height, "frames": request.frame_count,
        "steps": request.steps, "seed": request.seed, "output_path": output_path,
        "first_frame": _path(request.first_frame), "last_frame": _path(request.last_frame),
        "reference_image_size": _IMAGE_SIZES[request.reference_image_size],
        "denoise_reuse": request.reuse, "dit_layers": request.layers, "core_reuse": request.core_reuse,
        "token_reduction": int(request.token_reduction), "use_int8_row_fc2": int(request.int8_row_fc2),
        "use_reference_rope": int(request.reference_rope), "ssd_streaming": int(request.ssd_streaming),
        "render_width": request.render_width or 0, "render_height": request.render_height or 0,
        "preview_denoise": int(preview),
    }
    for slower in request.slower_paths:
        fields["use_slower_" + slower.value.replace("-", "_")] = 1
    return fields


def h3_references(request: GenerationRequest) -> list[dict[str, Any]]:
    """The `h3_reference` array, in order (kind by its h3.h enum name)."""
    entries = []
    for reference in request.references:
        kind, embedded = _REFERENCE_KINDS[reference.kind]
        entries.append({"kind": kind, "path": _path(reference.path), "audio_path": _path(reference.audio_path),
                        "include_embedded_audio": embedded})
    return entries


__all__ = ["PROTOCOL_VERSION", "encode_text", "h3_params_fields", "h3_references", "receive", "send"]
