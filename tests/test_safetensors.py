"""Header validation: every defect upstream checks, the ones it misses, and fuzzed input."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3bridge.errors import IntegrityError
from h3bridge.model.safetensors import MAX_HEADER_BYTES, read_header
from h3bridge.sim.fixture import TensorSpec, encode_header, write_safetensors


def raw_shard(path: Path, header: bytes | str | dict, data: bytes = b"", *, pad: bool = True) -> Path:
    """A shard from an explicit header (dict -> compact JSON), padded to 8 bytes unless told not to."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    if pad:
        header += b" " * (-(8 + len(header)) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def good_header() -> dict:
    return {"__metadata__": {"format": "pt"},
            "a.weight": entry("BF16", [2, 2], 0, 8),
            "b.bias": entry("F32", [2], 8, 16)}


def test_valid_shard_reads_every_tensor(tmp_path: Path) -> None:
    path = raw_shard(tmp_path / "ok.safetensors", good_header(), bytes(16))
    header = read_header(path)
    assert {t.name: (t.dtype, t.shape, t.nbytes) for t in header.tensors} == {
        "a.weight": ("BF16", (2, 2), 8), "b.bias": ("F32", (2,), 8)}
    assert header.metadata == {"format": "pt"}
    assert header.data_start % 8 == 0 and header.tensor_bytes == 16 and header.dtypes == {"BF16", "F32"}


def test_fixture_writer_output_validates(tmp_path: Path) -> None:
    specs = [TensorSpec("x", "BF16", (3, 5)), TensorSpec("y", "F32", (7,))]
    size = write_safetensors(tmp_path / "f.safetensors", specs)
    header = read_header(tmp_path / "f.safetensors")
    assert header.file_size == size and {t.name for t in header.tensors} == {"x", "y"}


def test_sparse_realistic_shard_reads_without_data(tmp_path: Path) -> None:
    specs = [TensorSpec("big", "BF16", (50_000, 50_000))]   # 5 GB nominal, no disk used
    write_safetensors(tmp_path / "big.safetensors", specs, sparse=True)
    assert read_header(tmp_path / "big.safetensors").tensor_bytes == 5 * 10**9


@pytest.mark.parametrize("header, data, pad, fragment, tensor", [
    # --- checks upstream h3_safetensors.c makes
    ("{", b"", True, "malformed safetensors JSON header", None),
    ('{"a": 1} x', b"", True, "malformed", None),                                  # trailing data
    ("[]", b"", True, "not a JSON object", None),
    ({"a": entry("Q9", [1], 0, 1)}, b"\0" * 8, True, "unknown or unsupported dtype 'Q9'", "a"),
    ({"a": entry("F8_E4M3", [8], 0, 8)}, b"\0" * 8, True, "quantized format", "a"),
    ({"a": entry("F4", [8], 0, 8)}, b"\0" * 8, True, "quantized format", "a"),
    ({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 8, True, "incomplete tensor descriptor", "a"),
    ({"a": entry("F32", [1] * 9, 0, 4)}, b"\0" * 8, True, "rank 9 exceeds 8", "a"),
    ({"a": entry("F32", [-1], 0, 4)}, b"\0" * 8, True, "not an unsigned 64-bit integer", "a"),
    ({"a": entry("F32", [1.0], 0, 4)}, b"\0" * 8, True, "not an unsigned 64-bit integer", "a"),
    ({"a": entry("F32", [True], 0, 4)}, b"\0" * 8, True, "not an unsigned 64-bit integer", "a"),
    ({"a": entry("F32", [2**64], 0, 4)}, b"\0" * 8, True, "not an unsigned 64-bit integer", "a"),
    ({"a": entry("F32", [2**40, 2**40], 0, 4)}, b"\0" * 8, True, "element count overflows", "a"),
    ({"a": entry("F64", [2**62], 0, 4)}, b"\0" * 8, True, "byte count overflows", "a"),
    ({"a": entry("F32", [3], 0, 8)}, b"\0" * 8, True, "needs 12 bytes but data_offsets span 8", "a"),
    ({"a": entry("F32", [1], 8, 4)}, b"\0" * 8, True, "end 4 is before begin 8", "a"),
    ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 8, 16)}, b"\0" * 8, True, "truncated", "b"),
    # --- stricter than upstream
    ('{"a": 1, "a": 2}', b"", True, "duplicate key", None),
    ('{"a": NaN}', b"", True, "non-finite", None),
    ('{"a": Infinity}', b"", True, "non-finite", None),
    ({"__metadata__": {"k": 1}}, b"", True, "__metadata__ must map names to strings", None),
    ({"a": entry("F32", [1], 0, 4)}, b"\0" * 4, False, "not a multiple of 8", None),   # misaligned data section
    ({"a": entry("BF16", [1], 1, 3)}, b"\0" * 8, True, "not a multiple of its 2-byte element size", "a"),
    ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)}, b"\0" * 8, True, "overlaps tensor 'a'", "b"),
    ({"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}, b"\0" * 12, True, "unindexed bytes", "b"),
    ({"a": entry("F32", [1], 4, 8)}, b"\0" * 8, True, "at the start of the data section", "a"),
    ({"a": entry("F32", [1], 0, 4)}, b"\0" * 12, True, "8 bytes after its last tensor", None),
])
def test_header_defects_raise_integrity_error_naming_file_and_tensor(
        tmp_path: Path, header, data: bytes, pad: bool, fragment: str, tensor: str | None) -> None:
    path = raw_shard(tmp_path / "bad.safetensors", header, data, pad=pad)
    with pytest.raises(IntegrityError) as caught:
        read_header(path)
    assert fragment in str(caught.value)
    assert str(path) in str(caught.value) and caught.value.path == path
    assert caught.value.tensor == tensor
    assert caught.value.hint


def test_header_length_over_256_mib_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 8) + b"{}")
    with pytest.raises(IntegrityError, match="over the 256 MiB limit"):
        read_header(path)


def test_header_length_past_end_of_file_is_a_truncated_download(tmp_path: Path) -> None:
    good = encode_header([TensorSpec("a", "F32", (4,))])
    path = tmp_path / "cut.safetensors"
    path.write_bytes(good[:20])
    with pytest.raises(IntegrityError, match="truncated download"):
        read_header(path)


@pytest.mark.parametrize("content, fragment", [
    (b"", "too short"),
    (b"\x01\x02", "too short"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 123\n", "Git LFS pointer"),
    (b"GGUF\x03\x00\x00\x00" + b"\0" * 64, "GGUF"),
])
def test_files_that_are_not_safetensors(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(content)
    with pytest.raises(IntegrityError, match=fragment):
        read_header(path)


def test_truncated_data_section_names_first_missing_tensor(tmp_path: Path) -> None:
    specs = [TensorSpec("first", "F32", (16,)), TensorSpec("second", "F32", (16,))]
    path = tmp_path / "t.safetensors"
    size = write_safetensors(path, specs)
    with open(path, "r+b") as handle:
        handle.truncate(size - 10)
    with pytest.raises(IntegrityError) as caught:
        read_header(path)
    assert caught.value.tensor == "second" and "truncated" in str(caught.value)


def test_unreadable_path_is_an_integrity_error(tmp_path: Path) -> None:
    with pytest.raises(IntegrityError, match="cannot read"):
        read_header(tmp_path / "missing.safetensors")


# --- fuzzing: whatever the bytes, the reader returns a header or raises IntegrityError

def _check_never_crashes(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    try:
        header = read_header(path)
    except IntegrityError as error:
        assert error.path == path
    else:
        assert header.data_start + sum(t.nbytes for t in header.tensors) == header.file_size


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(content=st.binary(max_size=200))
def test_fuzz_random_bytes(tmp_path: Path, content: bytes) -> None:
    _check_never_crashes(tmp_path / "fuzz.safetensors", content)


@FUZZ
@given(content=st.binary(max_size=120))
def test_fuzz_random_header_with_plausible_length(tmp_path: Path, content: bytes) -> None:
    _check_never_crashes(tmp_path / "fuzz.safetensors", struct.pack("<Q", len(content)) + content)


_VALID = encode_header([TensorSpec("w", "BF16", (2, 3)), TensorSpec("b", "F32", (3,))],
                       {"format": "pt"}) + bytes(24)


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_valid_shard(tmp_path: Path, data: st.DataObject) -> None:
    content = bytearray(_VALID)
    for _ in range(data.draw(st.integers(1, 6))):
        action = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        position = data.draw(st.integers(0, max(len(content) - 1, 0)))
        if action == "flip" and content:
            content[position] = data.draw(st.integers(0, 255))
        elif action == "insert":
            content[position:position] = data.draw(st.binary(min_size=1, max_size=8))
        elif action == "delete" and content:
            del content[position:position + data.draw(st.integers(1, 8))]
        elif action == "truncate":
            del content[position:]
    _check_never_crashes(tmp_path / "fuzz.safetensors", bytes(content))


@FUZZ
@given(document=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20))
def test_fuzz_arbitrary_json_documents(tmp_path: Path, document: object) -> None:
    body = json.dumps(document).encode()
    body += b" " * (-(8 + len(body)) % 8)
    _check_never_crashes(tmp_path / "fuzz.safetensors", struct.pack("<Q", len(body)) + body + bytes(16))


def test_deeply_nested_json_is_an_integrity_error(tmp_path: Path) -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    path = tmp_path / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body)
    with pytest.raises(IntegrityError, match="malformed"):
        read_header(path)


_EDGE_INTEGERS = st.sampled_from([0, 1, 2, 3, 7, 8, 16, -1, 2**32, 2**63, 2**64 - 1, 2**64, 10**30])
_DESCRIPTOR = st.fixed_dictionaries({
    "dtype": st.sampled_from(["BF16", "F32", "I8", "BOOL", "F8_E4M3", "C64", "bf16", "Q4"]) | st.integers(),
    "shape": st.lists(st.integers(0, 6) | _EDGE_INTEGERS, max_size=10) | st.text(max_size=3),
    "data_offsets": st.lists(st.integers(0, 64) | _EDGE_INTEGERS, min_size=0, max_size=3),
}, optional={"extra": st.integers()})


@FUZZ
@given(descriptors=st.dictionaries(st.text(min_size=1, max_size=6), _DESCRIPTOR, min_size=1, max_size=4),
       data_bytes=st.integers(0, 64))
def test_fuzz_tensor_descriptors(tmp_path: Path, descriptors: dict, data_bytes: int) -> None:
    """Well-formed JSON whose descriptors hold every kind of wrong value (huge, negative, overflowing
    shapes and offsets, unknown and quantized dtypes, deep ranks): a header or an IntegrityError."""
    body = json.dumps(descriptors).encode()
    body += b" " * (-(8 + len(body)) % 8)
    _check_never_crashes(tmp_path / "fuzz.safetensors", struct.pack("<Q", len(body)) + body + bytes(data_bytes))
