"""`h3bridge.libh3`: the 1:1 ctypes mirror of upstream's public C API, `h3.h` (antirez/h3.c at 8974cc0).

Like llama-cpp-python's low-level `llama_cpp` module, this is the C header in Python and nothing
more: the structs are named exactly as the C types and list every field in h3.h's order and type,
the enums and `H3_*` constants carry h3.h's values, and `load_library` declares `argtypes` and
`restype` for all twelve functions (pointer results as pointer types, never ctypes' default
int, which would truncate a 64-bit pointer). String lifetimes, callbacks and freeing are the
caller's business (the library engine), as they are for a C caller.

    lib = load_library(path)                  # raises LibraryLoadError with the fix
    ctx = lib.h3_load_dir(b"/models/H3")      # POINTER(h3_ctx); NULL pointer (falsy) on failure
    params = default_params()                 # == H3_PARAMS_DEFAULT (h3.h:131-135)
    result = lib.h3_generate(ctx, b"prompt", ctypes.byref(params))
    ...
    lib.h3_result_free(result); lib.h3_free(ctx)

Errors while loading: `LibraryLoadError` (h3bridge.errors), one sentence naming the problem, with
the fix in `hint`. The file's header is read before dlopen so that a library built for the
other architecture or OS is named as such ("an x86_64 library on an arm64 Mac") instead of
dlopen's "incompatible architecture (have 'x86_64', need 'arm64e' or 'arm64')".
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_int, c_size_t,
                    c_uint8, c_uint64, c_void_p)
from pathlib import Path

from .errors import LibraryLoadError
from .safeio.paths import open_regular, symlink_note

# ---------------------------------------------------------------- constants (h3.h:12-18)

H3_VERSION = "0.1.0-dev"
H3_DEFAULT_WIDTH = 864
H3_DEFAULT_HEIGHT = 480
H3_DEFAULT_FRAMES = 56
H3_DEFAULT_STEPS = 20
H3_DEFAULT_DIT_LAYERS = 50
H3_MIN_DIT_LAYERS = 35

# ---------------------------------------------------------------- enums (h3.h:30-35, 44-47)

h3_reference_kind = c_int            # a C enum with small positive values is an int
H3_REFERENCE_IMAGE = 1
H3_REFERENCE_VIDEO = 2
H3_REFERENCE_AUDIO = 3
H3_REFERENCE_VIDEO_AUDIO = 4

h3_reference_image_size = c_int
H3_REFERENCE_IMAGE_MATCH = 0
H3_REFERENCE_IMAGE_MAX = 1

# ---------------------------------------------------------------- types


class h3_ctx(Structure):
    """`typedef struct h3_ctx h3_ctx;` (h3.h:20): opaque, only ever used through a pointer."""


class h3_cache_info(Structure):
    """h3.h:23-28."""

    _fields_ = [
        ("embedding_entries", c_size_t),
        ("embedding_bytes", c_size_t),
        ("prepared_dit", c_int),
        ("video_decoder", c_int),
    ]


class h3_reference(Structure):
    """h3.h:37-42."""

    _fields_ = [
        ("kind", h3_reference_kind),
        ("path", c_char_p),
        ("audio_path", c_char_p),
        ("include_embedded_audio", c_int),
    ]


class h3_frame(Structure):
    """h3.h:49-59. `rgb` points at height rows of `stride` bytes, valid only during the callback;
    `denoise_step` is non-negative only for an intermediate denoising preview."""

    _fields_ = [
        ("width", c_int),
        ("height", c_int),
        ("stride", c_int),
        ("rgb", POINTER(c_uint8)),
        ("frame_index", c_int),
        ("frame_count", c_int),
        ("denoise_step", c_int),
        ("denoise_steps", c_int),
    ]


# h3.h:61-63. Non-zero return cancels the generation.
h3_frame_callback = CFUNCTYPE(c_int, POINTER(h3_frame), c_void_p)
h3_progress_callback = CFUNCTYPE(c_int, c_char_p, c_int, c_int, c_void_p)


class h3_params(Structure):
    """h3.h:65-129; see the header's comments for each switch."""

    _fields_ = [
        ("width", c_int),
        ("height", c_int),
        ("frames", c_int),
        ("steps", c_int),
        ("seed", c_uint64),
        ("output_path", c_char_p),
        ("first_frame", c_char_p),
        ("last_frame", c_char_p),
        ("references", POINTER(h3_reference)),
        ("reference_count", c_size_t),
        ("reference_image_size", h3_reference_image_size),
        ("denoise_reuse", c_int),
        ("dit_layers", c_int),
        ("core_reuse", c_int),
        ("token_reduction", c_int),
        ("use_int8_row_fc2", c_int),
        ("use_reference_rope", c_int),
        ("ssd_streaming", c_int),
        ("render_width", c_int),
        ("render_height", c_int),
        ("use_slower_bf16_mlp", c_int),
        ("use_slower_bf16_qkv", c_int),
        ("use_slower_bf16_attention_output", c_int),
        ("use_slower_row_major_attention_output", c_int),
        ("use_slower_unfused_int8_inputs", c_int),
        ("use_slower_unfused_qkv_rope", c_int),
        ("use_slower_scalar_qkv_rms", c_int),
        ("use_slower_uncached_int8_scales", c_int),
        ("use_slower_dynamic_fc1_k", c_int),
        ("use_slower_grouped_quantizer", c_int),
        ("preview_denoise", c_int),
        ("on_frame", h3_frame_callback),
        ("on_progress", h3_progress_callback),
        ("callback_opaque", c_void_p),
    ]


# H3_PARAMS_DEFAULT (h3.h:131-135), positionally, exactly as the macro lists it.
H3_PARAMS_DEFAULT = (
    H3_DEFAULT_WIDTH, H3_DEFAULT_HEIGHT, H3_DEFAULT_FRAMES, H3_DEFAULT_STEPS,
    42, None, None, None, None, 0, H3_REFERENCE_IMAGE_MATCH,
    1, H3_DEFAULT_DIT_LAYERS, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, None, None, None,
)
assert len(H3_PARAMS_DEFAULT) == len(h3_params._fields_)


def default_params() -> h3_params:
    """A fresh `h3_params` equal to `H3_PARAMS_DEFAULT` (a NULL pointer is ctypes' zero value,
    which is what a field left out of the constructor gets)."""
    values = {name: value for (name, _), value in zip(h3_params._fields_, H3_PARAMS_DEFAULT)
              if value is not None}
    return h3_params(**values)


class h3_device_info(Structure):
    """h3.h:137-146."""

    _fields_ = [
        ("name", c_char * 128),
        ("architecture", c_char * 128),
        ("physical_memory", c_uint64),
        ("recommended_working_set", c_uint64),
        ("max_buffer_length", c_uint64),
        ("apple_gpu_family", c_int),
        ("metal4", c_int),
        ("unified_memory", c_int),
    ]


class h3_component_info(Structure):
    """h3.h:148-153."""

    _fields_ = [
        ("bytes", c_uint64),
        ("tensor_bytes", c_uint64),
        ("files", c_size_t),
        ("tensors", c_size_t),
    ]


class h3_model_info(Structure):
    """h3.h:155-161."""

    _fields_ = [
        ("text_encoder", h3_component_info),
        ("fl2va_transformer", h3_component_info),
        ("ref2va_transformer", h3_component_info),
        ("video_vae", h3_component_info),
        ("audio_vae", h3_component_info),
    ]


class h3_result(Structure):
    """`struct h3_result` (h3.h:163-170)."""

    _fields_ = [
        ("width", c_int),
        ("height", c_int),
        ("frames", c_int),
        ("fps", c_int),
        ("sample_rate", c_int),
        ("seed", c_uint64),
    ]


STRUCTS = (h3_cache_info, h3_reference, h3_frame, h3_params, h3_device_info, h3_component_info,
           h3_model_info, h3_result)

# name: (restype, argtypes), h3.h:172-197 in order.
FUNCTIONS: dict[str, tuple[object, list[object]]] = {
    "h3_load_dir": (POINTER(h3_ctx), [c_char_p]),
    "h3_free": (None, [POINTER(h3_ctx)]),
    "h3_last_error": (c_char_p, [POINTER(h3_ctx)]),
    "h3_device": (POINTER(h3_device_info), [POINTER(h3_ctx)]),
    "h3_model": (POINTER(h3_model_info), [POINTER(h3_ctx)]),
    "h3_cache_set_enabled": (None, [POINTER(h3_ctx), c_int]),
    "h3_cache_clear": (None, [POINTER(h3_ctx)]),
    "h3_cache_get_info": (None, [POINTER(h3_ctx), POINTER(h3_cache_info)]),
    "h3_generate": (POINTER(h3_result), [POINTER(h3_ctx), c_char_p, POINTER(h3_params)]),
    "h3_result_free": (None, [POINTER(h3_result)]),
}
# h3.h declares exactly these ten functions; with the two callback typedefs above they are
# the header's twelve function declarations (the "all twelve functions").

# ---------------------------------------------------------------- loading

_ELF_MACHINES = {3: "i386", 40: "arm", 62: "x86_64", 183: "arm64"}
_MACHO_CPUS = {7: "i386", 0x01000007: "x86_64", 12: "arm", 0x0100000C: "arm64"}


def host_architecture() -> str:
    """This process's CPU in the names used below ("arm64", "x86_64")."""
    machine = platform.machine().lower()
    return {"aarch64": "arm64", "amd64": "x86_64", "arm64e": "arm64"}.get(machine, machine)


def _host_os() -> str:
    return "Mac" if sys.platform == "darwin" else ("Linux machine" if sys.platform.startswith("linux")
                                                   else f"{sys.platform} machine")


def _fix_hint() -> str:
    if sys.platform == "darwin":
        from .runnable import h3bridge_command
        return (f"build it from an h3.c checkout with `{h3bridge_command('build-engine', 'H3C_DIR')}` "
                "and pass the libh3.dylib it prints last")
    return ("libh3 itself runs only on Apple Silicon Macs (build it there with "
            "`h3bridge build-engine H3C_DIR`); for tests here, build the C double with `h3-sim-lib` "
            "and pass the path it prints")


def describe_binary(header: bytes) -> tuple[str, str | None, list[str]]:
    """(format, file kind, architectures) of a file's first bytes.

    format is "elf", "mach-o", "archive" or "unknown"; kind is "shared" / "executable" /
    "object" / "other" (None when not known)."""
    if header.startswith(b"\x7fELF") and len(header) >= 20:
        little = header[5] == 1
        e_type, e_machine = struct.unpack("<HH" if little else ">HH", header[16:20])
        kind = {3: "shared", 2: "executable", 1: "object"}.get(e_type, "other")
        return "elf", kind, [_ELF_MACHINES.get(e_machine, f"machine {e_machine}")]
    if len(header) >= 16 and header[:4] in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe"):
        cputype, _, filetype = struct.unpack("<iii", header[4:16])
        kind = {6: "shared", 8: "shared", 2: "executable", 1: "object"}.get(filetype, "other")
        return "mach-o", kind, [_MACHO_CPUS.get(cputype & 0xFFFFFFFF, f"cpu {cputype:#x}")]
    if len(header) >= 8 and header[:4] == b"\xca\xfe\xba\xbe":
        count = struct.unpack(">I", header[4:8])[0]
        if 0 < count < 32:    # a Java class file shares the magic; its "count" is huge
            cpus = []
            for index in range(count):
                offset = 8 + 20 * index
                if len(header) < offset + 4:
                    break
                cputype = struct.unpack(">I", header[offset:offset + 4])[0]
                cpus.append(_MACHO_CPUS.get(cputype, f"cpu {cputype:#x}"))
            return "mach-o", "shared", cpus
    if header.startswith(b"!<arch>\n"):
        return "archive", None, []
    return "unknown", None, []


def check_library_file(path: str | os.PathLike[str]) -> Path:
    """Raise LibraryLoadError unless `path` looks like a shared library this process can load."""
    library = Path(path)
    hint = _fix_hint()
    if not library.exists():
        raise LibraryLoadError(f"no library at {library}", path=library, hint=hint)
    if library.is_dir():
        raise LibraryLoadError(f"{library} is a folder, not a library file", path=library, hint=hint)

    def not_a_library(path: Path, kind: str) -> LibraryLoadError:
        return LibraryLoadError(f"{path} is {kind}{symlink_note(path)}, not a library file", path=path, hint=hint)
    try:
        with open_regular(library, not_a_library) as handle:    # a FIFO or a device is never waited on
            header = handle.read(4096)
    except OSError as error:
        raise LibraryLoadError(f"cannot read the library {library}: {error.strerror}",
                               path=library, hint=hint) from None
    form, kind, architectures = describe_binary(header)
    here = host_architecture()
    on_mac = sys.platform == "darwin"
    if form == "archive":
        raise LibraryLoadError(
            f"{library} is a static archive (like upstream's libh3.a), which cannot be loaded; "
            "it has to be linked into a shared library first", path=library, hint=hint)
    if form == "unknown":
        raise LibraryLoadError(f"{library} is not a shared library", path=library, hint=hint)
    if (form == "elf") == on_mac:
        made_for = "Linux (ELF)" if form == "elf" else "macOS (Mach-O)"
        raise LibraryLoadError(f"{library} is a {made_for} library and this is a {_host_os()}",
                               path=library, hint=hint)
    if kind != "shared":
        raise LibraryLoadError(f"{library} is {'an' if kind in ('executable', 'object') else 'a'} "
                               f"{kind or 'unknown'} file, not a shared library",
                               path=library, hint=hint)
    if here not in architectures:
        built = " + ".join(architectures) or "unknown-architecture"
        article = "an" if built[0] in "aeiouxAEIOUX" else "a"
        raise LibraryLoadError(f"{library} is {article} {built} library on {'an' if here[0] in 'aeiouxAEIOUX' else 'a'} "
                               f"{here} {_host_os()}", path=library, hint=hint)
    return library


def load_library(path: str | os.PathLike[str]) -> ctypes.CDLL:
    """dlopen the library at `path` and declare every h3.h function's argtypes and restype."""
    library = check_library_file(path)
    try:
        lib = ctypes.CDLL(os.fspath(library.resolve()))
    except OSError as error:
        raise LibraryLoadError(f"cannot load the library {library}: {error}", path=library,
                               hint=_fix_hint()) from None
    missing = [name for name in FUNCTIONS if not hasattr(lib, name)]
    if missing:
        raise LibraryLoadError(f"{library} is not libh3: it lacks {', '.join(missing)}",
                               path=library, hint=_fix_hint())
    for name, (restype, argtypes) in FUNCTIONS.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib
