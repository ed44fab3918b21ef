"""Runs one C-API case of the differential checks inside this process, over one libh3.

    python bench/differential_capi.py LIBRARY CASE.json RESULT.json

CASE.json: {"model": path or null, "ops": [...], "media": folder, "case_dir": folder}; the
ops are bench/differential_cases.py's. Every call goes through h3bridge/libh3.py's ctypes
binding; RESULT.json records, per op, what a C caller can observe: the returned pointer's
NULL-ness and fields, h3_last_error, the progress callback's (phase, completed, total)
sequence, each frame's geometry and indices (not its pixels) and the cache info. A crash ends
the process; the runner then reports the ops recorded so far (written after every op).
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from h3bridge import libh3  # noqa: E402

KINDS = {"image": libh3.H3_REFERENCE_IMAGE, "video": libh3.H3_REFERENCE_VIDEO,
         "audio": libh3.H3_REFERENCE_AUDIO, "video_audio": libh3.H3_REFERENCE_VIDEO_AUDIO,
         "kind0": 0, "kind5": 5}


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8", "surrogateescape")


def _error(lib: ctypes.CDLL, ctx: object) -> str | None:
    raw = lib.h3_last_error(ctx)
    return None if raw is None else raw.decode("utf-8", "replace")


def main(library: str, case_path: str, result_path: str) -> int:
    case = json.loads(Path(case_path).read_text())
    media = Path(case["media"])
    case_dir = Path(case["case_dir"])
    results: list[dict[str, object]] = []

    def media_path(name: str | None) -> str | None:
        if name is None or name == "":
            return name
        if name == "missing.png":
            return str(case_dir / "nowhere" / name)
        return str(media / name)

    def save() -> None:
        Path(result_path).write_text(json.dumps(results))

    lib = libh3.load_library(library)
    model = case["model"]
    ctx = lib.h3_load_dir(_bytes(model))
    results.append({"op": "load", "null": not ctx, "error": _error(lib, ctx if ctx else None)})
    save()
    if not ctx:
        return 0
    keep: list[object] = []     # ctypes objects the library may still point at
    for op in case["ops"]:
        name = op["op"]
        record: dict[str, object] = {"op": name}
        if name == "last_error":
            record["error"] = _error(lib, ctx)
        elif name == "device":
            device = lib.h3_device(ctx).contents
            record.update(name=device.name.decode(), metal4=device.metal4,
                          family=device.apple_gpu_family, memory=device.physical_memory)
        elif name == "model":
            info = lib.h3_model(ctx).contents
            record["components"] = [[getattr(info, part).files, getattr(info, part).tensors,
                                     getattr(info, part).tensor_bytes]
                                    for part, _ in libh3.h3_model_info._fields_]
        elif name == "cache_set":
            lib.h3_cache_set_enabled(ctx, op["enabled"])
        elif name == "cache_clear":
            lib.h3_cache_clear(ctx)
        elif name == "cache_info":
            info = libh3.h3_cache_info()
            lib.h3_cache_get_info(ctx, ctypes.byref(info))
            # embedding_bytes counts the tokenizer's tokens: a size, compared as is.
            record.update(entries=info.embedding_entries, bytes=info.embedding_bytes,
                          dit=info.prepared_dit, decoder=info.video_decoder)
        elif name == "generate":
            record.update(_generate(lib, ctx, op, media_path, case_dir, keep))
        results.append(record)
        save()
    lib.h3_free(ctx)
    save()
    return 0


def _generate(lib: ctypes.CDLL, ctx: object, op: dict[str, object], media_path, case_dir: Path,
              keep: list[object]) -> dict[str, object]:
    progress: list[list[object]] = []
    frames: list[list[int]] = []
    cancel = op.get("cancel")

    def on_progress(phase: bytes, completed: int, total: int, _opaque: object) -> int:
        text = phase.decode("utf-8", "replace")
        progress.append([text, completed, total])
        return int(bool(cancel) and cancel[0] == "progress" and cancel[1] == text
                   and cancel[2] == completed)

    def on_frame(pointer: object, _opaque: object) -> int:
        frame = pointer.contents   # type: ignore[attr-defined]
        frames.append([frame.width, frame.height, frame.stride, frame.frame_index,
                       frame.frame_count, frame.denoise_step, frame.denoise_steps])
        return int(bool(cancel) and cancel[0] == "frame" and cancel[1] == frame.denoise_step
                   and cancel[2] == frame.frame_index)

    fields = op.get("params")
    params_pointer = None
    if fields is not None:
        params = libh3.default_params()
        for key, value in fields.items():   # type: ignore[union-attr]
            if key in ("first_frame", "last_frame"):
                value = _bytes(media_path(value))
            setattr(params, key, value)
        refs = op.get("refs") or []
        array = (libh3.h3_reference * max(len(refs), 1))()
        for slot, ref in zip(array, refs):   # type: ignore[arg-type]
            slot.kind = KINDS[ref[0]]
            slot.path = _bytes(media_path(ref[1]))
            if ref[0] == "video":
                slot.include_embedded_audio = ref[2]
            if ref[0] == "video_audio":
                slot.audio_path = _bytes(media_path(ref[2]))
        if refs:
            params.references = array
            params.reference_count = len(refs)
        if op.get("refs_null"):
            params.reference_count = fields.get("reference_count", 1)   # type: ignore[union-attr]
        if op.get("output"):
            target = op.get("output_path") or "{CASE}/out.mp4"
            params.output_path = _bytes(str(target).replace("{CASE}", str(case_dir)))
        callback_progress = libh3.h3_progress_callback(on_progress)
        params.on_progress = callback_progress
        if op.get("on_frame"):
            callback_frame = libh3.h3_frame_callback(on_frame)
            params.on_frame = callback_frame
            keep.append(callback_frame)
        keep += [params, array, callback_progress]
        params_pointer = ctypes.byref(params)
    result = lib.h3_generate(ctx, _bytes(op.get("prompt")), params_pointer)   # type: ignore[arg-type]
    record: dict[str, object] = {"null": not result, "progress": progress, "frames": frames}
    if result:
        value = result.contents
        record["result"] = [value.width, value.height, value.frames, value.fps, value.sample_rate,
                            value.seed]
        lib.h3_result_free(result)
    else:
        record["error"] = _error(lib, ctx)
    return record


if __name__ == "__main__":
    if len(sys.argv) != 4:      # (a helper: differential.py runs it once per C-API case)
        sys.exit("usage: python bench/differential_capi.py LIBRARY CASE.json RESULT.json (run by differential.py)")
    sys.exit(main(*sys.argv[1:4]))
