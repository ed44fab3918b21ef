"""The Python side of the libh3 double (h3bridge/sim/double/libh3_double.c): h3.h's calls, as C
makes them, carried out by h3-sim's engine.

The C double exports h3.h's functions and calls these with the addresses of the C objects;
they are read and written through `h3bridge.libh3`'s structs (the one Python copy of h3.h's
layout), so the double, h3-sim's command line and the library engine share one implementation
of upstream's rules: h3bridge/sim/engine.py. Not a public API: only the C double calls it.

Functions that can fail return None, or the error text (bytes, h3_last_error's content).
"""
from __future__ import annotations

import _thread
import ctypes
import os
from typing import Callable

from .. import libh3
from .device import DeviceConfigError
from .engine import SimContext, SimError, SimFrame, generate as engine_generate
from .params import ReferenceKind, SimParams, SimReference
from .st_header import ComponentInfo

_STRING_FIELDS = ("output_path", "first_frame", "last_frame")
_NOT_IN_SIM_PARAMS = {"references", "reference_count", "on_frame", "on_progress", "callback_opaque"}
_KINDS = {int(kind) for kind in ReferenceKind}
_RGB_POINTER = ctypes.POINTER(ctypes.c_uint8)


def _error(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _text(value: bytes | None) -> str | None:
    """A C string as h3-sim sees the same bytes in argv."""
    return None if value is None else os.fsdecode(value)


def _fill_component(target: libh3.h3_component_info, info: ComponentInfo) -> None:
    target.bytes, target.tensor_bytes = info.bytes, info.tensor_bytes
    target.files, target.tensors = info.files, info.tensors


def load_dir(model_dir: bytes | None, device_address: int,
             model_address: int) -> tuple[SimContext | None, bytes | None]:
    """h3_load_dir: the engine's context, device and model inventory into the C structs."""
    try:
        sim = SimContext.load_dir(_text(model_dir))
    except SimError as error:
        return None, _error(error.message)
    except DeviceConfigError as error:
        return None, _error(str(error))
    device = libh3.h3_device_info.from_address(device_address)
    # char name[128]: at most 127 bytes and the terminating NUL.
    device.name = sim.device.name.encode("utf-8", "surrogateescape")[:127]
    device.architecture = sim.device.architecture.encode("utf-8", "surrogateescape")[:127]
    device.physical_memory = sim.device.physical_memory
    device.recommended_working_set = sim.device.recommended_working_set
    device.max_buffer_length = sim.device.max_buffer_length
    device.apple_gpu_family = sim.device.apple_gpu_family
    device.metal4 = int(sim.device.metal4)
    device.unified_memory = int(sim.device.unified_memory)
    model = libh3.h3_model_info.from_address(model_address)
    for name in ("text_encoder", "fl2va_transformer", "ref2va_transformer", "video_vae", "audio_vae"):
        _fill_component(getattr(model, name), getattr(sim.model, name))
    return sim, None


def free(sim: SimContext, _unused: int) -> None:
    """h3_free: h3_cache_clear, then the context goes."""
    sim.clear_cache()


def cache_set_enabled(sim: SimContext, enabled: int) -> None:
    sim.set_cache_enabled(enabled != 0)


def cache_clear(sim: SimContext, _unused: int) -> None:
    sim.clear_cache()


def cache_get_info(sim: SimContext, info_address: int) -> None:
    info = sim.cache_info()
    target = libh3.h3_cache_info.from_address(info_address)
    target.embedding_entries = info.embedding_entries
    target.embedding_bytes = info.embedding_bytes
    target.prepared_dit = int(info.prepared_dit)
    target.video_decoder = int(info.video_decoder)


def sim_params(c_params: libh3.h3_params) -> SimParams:
    """The engine's SimParams for a C h3_params: every field by name, C strings as h3-sim reads
    argv, references as far as the engine may look at them."""
    values: dict[str, object] = {}
    for name, _ in libh3.h3_params._fields_:
        if name in _NOT_IN_SIM_PARAMS:
            continue
        value = getattr(c_params, name)
        values[name] = _text(value) if name in _STRING_FIELDS else value
    params = SimParams(**values)   # type: ignore[arg-type]
    count = c_params.reference_count
    if count and not c_params.references:
        params.references_null = True
        return params
    # Past 12 the engine stops at "at most 12 references" without reading any: 13 are enough.
    for index in range(min(count, 13)):
        reference = c_params.references[index]
        kind = reference.kind
        params.references.append(SimReference(
            kind=ReferenceKind(kind) if kind in _KINDS else kind,    # type: ignore[arg-type]
            path=_text(reference.path), audio_path=_text(reference.audio_path),
            include_embedded_audio=reference.include_embedded_audio))   # type: ignore[arg-type]
    return params


def generate(sim: SimContext, prompt: bytes | None, params_address: int,
             result_address: int) -> bytes | tuple[bytes] | None:
    """h3_generate: the engine's run with the C callbacks; the h3_result filled on success."""
    c_params = libh3.h3_params.from_address(params_address) if params_address else None
    params = sim_params(c_params) if c_params is not None else None
    on_progress: Callable[[str, int, int], bool] | None = None
    on_frame: Callable[[SimFrame], bool] | None = None
    if c_params is not None and c_params.on_progress:
        progress_callback, opaque = c_params.on_progress, c_params.callback_opaque

        def call_progress(phase: str, completed: int, total: int) -> bool:
            return progress_callback(phase.encode("utf-8"), completed, total, opaque) != 0

        on_progress = call_progress
    if c_params is not None and c_params.on_frame:
        frame_callback, frame_opaque = c_params.on_frame, c_params.callback_opaque

        def call_frame(frame: SimFrame) -> bool:
            rgb = frame.rgb if frame.rgb.flags.c_contiguous else frame.rgb.copy()
            c_frame = libh3.h3_frame(frame.width, frame.height, frame.stride,
                                     ctypes.cast(rgb.ctypes.data, _RGB_POINTER),
                                     frame.frame_index, frame.frame_count,
                                     frame.denoise_step, frame.denoise_steps)
            # `rgb` stays referenced until the callback returns: the pointer is valid only then.
            return frame_callback(ctypes.byref(c_frame), frame_opaque) != 0

        on_frame = call_frame

    try:
        result = engine_generate(sim, _text(prompt), params,   # type: ignore[arg-type]
                                 on_progress=on_progress, on_frame=on_frame)
    except SimError as error:
        return _error(error.message)
    except KeyboardInterrupt:
        # SIGINT arrived while C was "inside" h3_generate. An exception cannot cross the C
        # frame, so the call fails and the interrupt is raised again in the main thread as soon
        # as the caller is back in Python.
        _thread.interrupt_main()
        return _error("generation interrupted (SIGINT)")
    target = libh3.h3_result.from_address(result_address)
    target.width, target.height, target.frames = result.width, result.height, result.frames
    target.fps, target.sample_rate, target.seed = result.fps, result.sample_rate, result.seed
    # A success that leaves text in h3_last_error (a cancel that came too late) goes back as a
    # 1-tuple: the C side sets the error buffer and still returns the result.
    return (result.last_error.encode("utf-8"),) if result.last_error else None
