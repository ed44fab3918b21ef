"""h3bridge.libh3 against the C compiler: every h3.h struct's size and field offsets, the
constants and enums, H3_PARAMS_DEFAULT, and the functions' prototypes, checked for the double's
own header (h3bridge/sim/double/h3_double.h) and, where the mirror exists, upstream's h3.h.
Then load_library's refusals: a missing file, a text file, an archive, the wrong OS or CPU."""
from __future__ import annotations

import ctypes
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from h3bridge import libh3
from h3bridge.errors import EngineNotFoundError, LibraryLoadError
from h3bridge.sim.library import SOURCE_DIR

from double_helpers import compiler_or_skip, double_library_path, upstream_header

DOUBLE_HEADER = SOURCE_DIR / "h3_double.h"
C_NAMES = {libh3.h3_result: "struct h3_result"}
CONSTANTS = ("H3_DEFAULT_WIDTH", "H3_DEFAULT_HEIGHT", "H3_DEFAULT_FRAMES", "H3_DEFAULT_STEPS",
             "H3_DEFAULT_DIT_LAYERS", "H3_MIN_DIT_LAYERS", "H3_REFERENCE_IMAGE",
             "H3_REFERENCE_VIDEO", "H3_REFERENCE_AUDIO", "H3_REFERENCE_VIDEO_AUDIO",
             "H3_REFERENCE_IMAGE_MATCH", "H3_REFERENCE_IMAGE_MAX")
# h3.h:172-197, as upstream declares them (const included): a redeclaration that differs from
# the header's is a compile error, so these are checked by the compiler, then mapped to ctypes.
PROTOTYPES = {
    "h3_load_dir": "h3_ctx *h3_load_dir(const char *model_dir);",
    "h3_free": "void h3_free(h3_ctx *ctx);",
    "h3_last_error": "const char *h3_last_error(const h3_ctx *ctx);",
    "h3_device": "const h3_device_info *h3_device(const h3_ctx *ctx);",
    "h3_model": "const h3_model_info *h3_model(const h3_ctx *ctx);",
    "h3_cache_set_enabled": "void h3_cache_set_enabled(h3_ctx *ctx, int enabled);",
    "h3_cache_clear": "void h3_cache_clear(h3_ctx *ctx);",
    "h3_cache_get_info": "void h3_cache_get_info(const h3_ctx *ctx, h3_cache_info *info);",
    "h3_generate": "h3_result *h3_generate(h3_ctx *ctx, const char *prompt, const h3_params *params);",
    "h3_result_free": "void h3_result_free(h3_result *result);",
}
CALLBACKS = ("typedef int (*check_frame_callback)(const h3_frame *frame, void *opaque);\n"
             "typedef int (*check_progress_callback)(const char *phase, int completed, int total, "
             "void *opaque);\n")
CTYPES_OF = {
    "void": None, "int": ctypes.c_int, "const char *": ctypes.c_char_p,
    "h3_ctx *": ctypes.POINTER(libh3.h3_ctx), "const h3_ctx *": ctypes.POINTER(libh3.h3_ctx),
    "const h3_device_info *": ctypes.POINTER(libh3.h3_device_info),
    "const h3_model_info *": ctypes.POINTER(libh3.h3_model_info),
    "h3_cache_info *": ctypes.POINTER(libh3.h3_cache_info),
    "h3_result *": ctypes.POINTER(libh3.h3_result),
    "const h3_params *": ctypes.POINTER(libh3.h3_params),
}
NUMERIC = (ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t)


def _layout_program(header: Path) -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", f'#include "{header}"']
    lines += [prototype for prototype in PROTOTYPES.values()]
    lines.append(CALLBACKS)
    lines += ["_Static_assert(__builtin_types_compatible_p(h3_frame_callback, check_frame_callback), \"frame\");",
              "_Static_assert(__builtin_types_compatible_p(h3_progress_callback, check_progress_callback), \"progress\");",
              "int main(void) {"]
    for struct_type in libh3.STRUCTS:
        c_name = C_NAMES.get(struct_type, struct_type.__name__)
        lines.append(f'printf("size {struct_type.__name__} %zu %zu\\n", sizeof({c_name}), _Alignof({c_name}));')
        for field, _ in struct_type._fields_:
            lines.append(f'printf("field {struct_type.__name__}.{field} %zu %zu\\n", '
                         f'offsetof({c_name}, {field}), sizeof((({c_name} *)0)->{field}));')
    for name in CONSTANTS:
        lines.append(f'printf("const {name} %lld\\n", (long long){name});')
    lines.append('printf("version H3_VERSION %s\\n", H3_VERSION);')
    lines.append('printf("enum sizes %zu %zu\\n", sizeof(h3_reference_kind), sizeof(h3_reference_image_size));')
    lines.append("h3_params d = H3_PARAMS_DEFAULT;")
    for field, field_type in libh3.h3_params._fields_:
        if field_type in NUMERIC or field_type in (libh3.h3_reference_kind,):
            lines.append(f'printf("default {field} %llu\\n", (unsigned long long)d.{field});')
        else:
            lines.append(f'printf("default {field} null=%d\\n", d.{field} == NULL);')
    lines += ["return 0;", "}"]
    return "\n".join(lines) + "\n"


def _compile_and_run(header: Path, tmp_path: Path) -> dict[str, list[str]]:
    compiler = compiler_or_skip()
    source = tmp_path / "layout.c"
    program = tmp_path / "layout"
    source.write_text(_layout_program(header))
    built = subprocess.run([*compiler, "-std=gnu11", "-Wall", "-Werror", "-o", str(program), str(source)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    output = subprocess.run([str(program)], capture_output=True, text=True, check=True).stdout
    facts: dict[str, list[str]] = {}
    for line in output.splitlines():
        kind, name, *values = line.split(" ")
        facts[f"{kind} {name}"] = values
    return facts


def _check_layout(facts: dict[str, list[str]]) -> None:
    for struct_type in libh3.STRUCTS:
        name = struct_type.__name__
        size, alignment = map(int, facts[f"size {name}"])
        assert (ctypes.sizeof(struct_type), ctypes.alignment(struct_type)) == (size, alignment), name
        for field, _ in struct_type._fields_:
            offset, field_size = map(int, facts[f"field {name}.{field}"])
            descriptor = getattr(struct_type, field)
            assert (descriptor.offset, descriptor.size) == (offset, field_size), f"{name}.{field}"
    for name in CONSTANTS:
        assert int(facts[f"const {name}"][0]) == getattr(libh3, name), name
    assert facts["version H3_VERSION"] == [libh3.H3_VERSION]
    assert list(map(int, facts["enum sizes"])) == [ctypes.sizeof(libh3.h3_reference_kind),
                                             ctypes.sizeof(libh3.h3_reference_image_size)]
    defaults = libh3.default_params()
    for field, field_type in libh3.h3_params._fields_:
        value = facts[f"default {field}"][0]
        if value.startswith("null="):
            assert value == "null=1"
            assert not getattr(defaults, field), field
        else:
            assert int(value) == getattr(defaults, field), field


def test_the_doubles_header_has_h3h_layout_constants_defaults_and_prototypes(tmp_path: Path) -> None:
    _check_layout(_compile_and_run(DOUBLE_HEADER, tmp_path))


def test_upstream_h3h_has_the_same_layout_constants_defaults_and_prototypes(tmp_path: Path) -> None:
    header = upstream_header(tmp_path / "h3.h")
    if header is None:
        pytest.skip("upstream's h3.h is not at $H3_UPSTREAM_SOURCE (a clone or source tarball of antirez/h3.c)")
    _check_layout(_compile_and_run(header, tmp_path))


def _c_type(declaration: str) -> str:
    """ "const char *model_dir" -> "const char *"; "int enabled" -> "int"."""
    return re.sub(r"\s*\b\w+$", "", declaration.strip()).replace("* ", "*").strip()


def test_every_function_is_declared_with_the_prototypes_ctypes_types() -> None:
    assert set(libh3.FUNCTIONS) == set(PROTOTYPES)
    for name, prototype in PROTOTYPES.items():
        result_text, _, rest = prototype.partition(name + "(")
        arguments = rest.removesuffix(");").split(",")
        restype, argtypes = libh3.FUNCTIONS[name]
        assert restype is CTYPES_OF[result_text.strip()], name
        assert argtypes == [CTYPES_OF[_c_type(argument)] for argument in arguments], name


def test_load_library_declares_pointer_results_as_pointers() -> None:
    lib = libh3.load_library(double_library_path())
    for name, (restype, argtypes) in libh3.FUNCTIONS.items():
        function = getattr(lib, name)
        assert function.restype is restype and function.argtypes == argtypes, name
    assert lib.h3_load_dir.restype is not ctypes.c_int
    assert issubclass(lib.h3_generate.restype, ctypes._Pointer)


def test_default_params_equals_the_macro_field_by_field() -> None:
    params = libh3.default_params()
    values = [getattr(params, name) for name, _ in libh3.h3_params._fields_]
    expected = [False if value is None else value for value in libh3.H3_PARAMS_DEFAULT]
    assert [bool(v) if v is None or not isinstance(v, int) else v for v in values] == expected
    assert (params.width, params.height, params.frames, params.steps, params.seed) == (864, 480, 56, 20, 42)
    assert (params.denoise_reuse, params.dit_layers, params.core_reuse) == (1, 50, 1)
    assert params.output_path is None and not params.on_frame and not params.references


# ---------------------------------------------------------------- load errors


def _load_error(path: Path) -> LibraryLoadError:
    with pytest.raises(LibraryLoadError) as caught:
        libh3.load_library(path)
    error = caught.value
    assert isinstance(error, EngineNotFoundError) and error.before_start
    assert error.hint and ("h3-sim-lib" in error.hint or "build-engine" in error.hint)
    assert error.path == path
    return error


def test_a_missing_file_names_the_path(tmp_path: Path) -> None:
    assert _load_error(tmp_path / "libh3.dylib").message == f"no library at {tmp_path / 'libh3.dylib'}"


def test_a_folder_and_a_text_file_are_not_libraries(tmp_path: Path) -> None:
    assert _load_error(tmp_path).message == f"{tmp_path} is a folder, not a library file"
    text = tmp_path / "libh3.so"
    text.write_text("not a library\n")
    assert _load_error(text).message == f"{text} is not a shared library"
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    assert _load_error(empty).message == f"{empty} is not a shared library"


@pytest.mark.timeout(30)
def test_a_fifo_or_a_device_as_the_library_is_refused_without_waiting(tmp_path: Path) -> None:
    """Issue 19 item 3: a FIFO as --library-path hung forever in a blocking open."""
    import os
    fifo = tmp_path / "libh3.dylib"
    os.mkfifo(fifo)
    assert _load_error(fifo).message == f"{fifo} is a named pipe (FIFO), not a library file"
    device = tmp_path / "zero.dylib"
    device.symlink_to("/dev/zero")
    assert _load_error(device).message == f"{device} is a character device (a symbolic link to /dev/zero), not a library file"


def test_a_static_archive_says_it_must_be_linked_first(tmp_path: Path) -> None:
    archive = tmp_path / "libh3.a"
    archive.write_bytes(b"!<arch>\n" + b"\0" * 64)
    message = _load_error(archive).message
    assert message.startswith(f"{archive} is a static archive") and "linked into a shared library" in message


def _elf(machine: int, e_type: int = 3) -> bytes:
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    return ident + struct.pack("<HHI", e_type, machine, 1) + b"\0" * 200


def _macho(cputype: int, filetype: int = 6) -> bytes:
    return b"\xcf\xfa\xed\xfe" + struct.pack("<iiiii", cputype, 0, filetype, 0, 0) + b"\0" * 200


def test_an_elf_library_for_another_cpu_is_named_before_dlopen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(libh3.platform, "machine", lambda: "x86_64")
    library = tmp_path / "libh3.so"
    library.write_bytes(_elf(183))          # EM_AARCH64
    assert _load_error(library).message == f"{library} is an arm64 library on an x86_64 Linux machine"
    executable = tmp_path / "h3"
    executable.write_bytes(_elf(62, e_type=2))
    assert _load_error(executable).message == f"{executable} is an executable file, not a shared library"


def test_an_x86_64_dylib_on_an_arm64_mac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(libh3.platform, "machine", lambda: "arm64")
    library = tmp_path / "libh3.dylib"
    library.write_bytes(_macho(0x01000007))
    error = _load_error(library)
    assert error.message == f"{library} is an x86_64 library on an arm64 Mac"
    # issue 30: build-library is retired; the steps are build-engine's at the pinned commit (the
    # commit libh3 mirrors is the one build-engine and doctor check)
    from h3bridge.engine_build.record import PINNED_COMMIT
    assert libh3.MIRRORED_COMMIT == PINNED_COMMIT[:7]
    assert "build-engine DIR" in error.hint and f"checkout {PINNED_COMMIT[:7]}" in error.hint
    assert "build-library" not in error.hint
    universal = tmp_path / "fat.dylib"
    universal.write_bytes(b"\xca\xfe\xba\xbe" + struct.pack(">I", 1)
                          + struct.pack(">IIIII", 0x01000007, 3, 4096, 100, 12) + b"\0" * 64)
    assert _load_error(universal).message == f"{universal} is an x86_64 library on an arm64 Mac"
    linux = tmp_path / "libh3.so"
    linux.write_bytes(_elf(183))
    assert _load_error(linux).message == f"{linux} is a Linux (ELF) library and this is a Mac"


def test_a_mac_library_on_linux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    library = tmp_path / "libh3.dylib"
    library.write_bytes(_macho(0x0100000C))
    assert _load_error(library).message == f"{library} is a macOS (Mach-O) library and this is a Linux machine"


def test_a_real_shared_library_that_is_not_libh3(tmp_path: Path) -> None:
    compiler = compiler_or_skip()
    source = tmp_path / "other.c"
    source.write_text("int not_h3(void) { return 1; }\n")
    library = tmp_path / "libother.so"
    subprocess.run([*compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    message = _load_error(library).message
    assert message.startswith(f"{library} is not libh3: it lacks h3_load_dir, h3_free")
