"""verify: header checks, checksums against HF hashes or our manifest, and the hash cache."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from model_helpers import copy_model, fl2va_template  # noqa: F401  (fixture)
from h3bridge.model import verify as verify_module
from h3bridge.errors import IntegrityError, ModelError
from h3bridge.model.verify import HashCache, check_headers, hash_files, manifest_path, verify_model
from h3bridge.userdirs import cache_dir


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def model(fl2va_template: Path, tmp_path: Path) -> Path:  # noqa: F811
    return copy_model(fl2va_template, tmp_path)


@pytest.fixture
def count_hashing(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    hashed: list[Path] = []
    original = verify_module.sha256_file

    def counting(path: Path, on_bytes=None) -> str:
        hashed.append(path)
        return original(path, on_bytes)

    monkeypatch.setattr(verify_module, "sha256_file", counting)
    return hashed


def some_shard(root: Path) -> Path:
    return sorted((root / "FL2VA/transformer").glob("*.safetensors"))[1]


def flip_last_byte(path: Path) -> None:
    """Change data without changing the size (what bit rot or a bad copy does)."""
    status = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        value = handle.read(1)[0]
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([value ^ 0xFF]))
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))


def test_cache_dir_follows_environment(private_cache: Path) -> None:
    assert cache_dir() == private_cache


def test_header_verify_checks_every_shard(model: Path) -> None:
    report = verify_model(model)
    assert report.ok and len(report.results) == 23
    assert {r.status for r in report.results} == {"header ok"}
    assert "23 shard(s): OK" in report.table()


def test_the_table_lists_only_problems_and_a_summary_unless_verbose(model: Path) -> None:
    shard = some_shard(model)
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 4)
    report = verify_model(model)
    from h3bridge.cli.engine import cli_words
    quiet = report.table(words=cli_words).splitlines()       # as `h3bridge verify` prints it
    assert report.table().splitlines()[-1].endswith("verbose=True lists every shard)")    # Python's words
    good = [r for r in report.results if not r.header_error]
    assert all(str(r.relative) not in line for r in good for line in quiet)   # no line per healthy shard
    assert any(str(shard.relative_to(model)) in line and "BAD HEADER" in line for line in quiet)
    assert any(line.startswith("  fix: ") for line in quiet)
    assert quiet[-1].startswith("23 shard(s): 1 problem(s) (in ") and "--verbose" in quiet[-1]
    verbose = report.table(verbose=True)
    assert all(str(r.relative) in verbose for r in report.results)
    assert verbose.splitlines()[-1] == "23 shard(s): 1 problem(s)"


def test_header_verify_reports_damaged_shard(model: Path) -> None:
    shard = some_shard(model)
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 4)
    report = verify_model(model)
    assert not report.ok
    bad = [r for r in report.results if r.header_error]
    assert [r.path for r in bad] == [shard] and bad[0].status == "BAD HEADER"
    with pytest.raises(IntegrityError, match="truncated"):
        report.raise_for_errors()


def test_check_headers_raises_on_layout_problem(model: Path) -> None:
    assert check_headers(model).component("FL2VA", "transformer").files == 7
    (model / "FL2VA/transformer/config.json").unlink()
    with pytest.raises(ModelError, match="missing required model file"):
        check_headers(model)


def test_first_checksum_run_writes_manifest_then_checks_against_it(model: Path, private_cache: Path,
                                                                  count_hashing: list[Path]) -> None:
    first = verify_model(model, checksums=True, progress=False)
    assert first.ok and first.manifest_written
    assert first.manifest == manifest_path(model, private_cache) and first.manifest.is_file()
    assert {r.status for r in first.results} == {"hashed, recorded"}
    assert len(count_hashing) == 23
    for result in first.results:
        assert result.sha256 == hashlib.sha256(result.path.read_bytes()).hexdigest()
    assert "manifest written" in first.table()

    count_hashing.clear()
    second = verify_model(model, checksums=True, progress=False)
    assert second.ok and not second.manifest_written and count_hashing == []   # unchanged: nothing re-read
    assert {r.status for r in second.results} == {"ok (cached)"}
    assert {r.expected_source for r in second.results} == {"manifest"}


def test_changed_file_invalidates_cache_and_fails_checksum(model: Path, count_hashing: list[Path]) -> None:
    verify_model(model, checksums=True, progress=False)
    shard = some_shard(model)
    flip_last_byte(shard)
    count_hashing.clear()
    report = verify_model(model, checksums=True, progress=False)
    assert count_hashing == [shard]          # only the changed file is hashed again
    bad = [r for r in report.results if r.checksum_error]
    assert [r.path for r in bad] == [shard] and bad[0].status == "CHECKSUM MISMATCH"
    with pytest.raises(IntegrityError, match="checksum mismatch") as caught:
        report.raise_for_errors()
    assert caught.value.path == shard and "rewrite-manifest" in (caught.value.hint or "")
    # a deliberate replacement is accepted after rewriting the manifest
    assert verify_model(model, checksums=True, progress=False, rewrite_manifest=True).ok
    assert verify_model(model, checksums=True, progress=False).ok


def test_touched_but_identical_file_is_rehashed_and_passes(model: Path, count_hashing: list[Path]) -> None:
    verify_model(model, checksums=True, progress=False)
    shard = some_shard(model)
    status = shard.stat()
    os.utime(shard, ns=(status.st_atime_ns, status.st_mtime_ns + 5_000_000_000))
    count_hashing.clear()
    assert verify_model(model, checksums=True, progress=False).ok
    assert count_hashing == [shard]


def make_hf_cache_snapshot(template: Path, hub: Path) -> Path:
    """hub/models--MiniMaxAI--MiniMax-H3/{blobs/<sha256>, snapshots/<rev>/... -> ../../blobs/<sha256>}."""
    repo = hub / "models--MiniMaxAI--MiniMax-H3"
    snapshot = repo / "snapshots" / ("c0ffee" * 6 + "abcd")
    (repo / "blobs").mkdir(parents=True)
    for source in template.rglob("*"):
        if source.is_dir():
            continue
        target = snapshot / source.relative_to(template)
        target.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(source.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        shutil.copyfile(source, blob)
        target.symlink_to(os.path.relpath(blob, target.parent))
    return snapshot


def test_hugging_face_cache_snapshot_uses_blob_hashes(fl2va_template: Path, tmp_path: Path,  # noqa: F811
                                                      count_hashing: list[Path]) -> None:
    snapshot = make_hf_cache_snapshot(fl2va_template, tmp_path / "hub")
    report = verify_model(snapshot, checksums=True, progress=False)
    assert report.ok and not report.manifest_written
    assert {r.expected_source for r in report.results} == {"huggingface-cache"}
    flip_last_byte(some_shard(snapshot).resolve())
    report = verify_model(snapshot, checksums=True, progress=False)
    assert [r.path for r in report.results if r.checksum_error] == [some_shard(snapshot)]


def test_local_dir_download_metadata_etag(model: Path) -> None:
    shard = some_shard(model)
    relative = shard.relative_to(model)
    metadata = model / ".cache/huggingface/download" / (str(relative) + ".metadata")
    metadata.parent.mkdir(parents=True)
    metadata.write_text(f"{'1' * 40}\n{'0' * 64}\n1700000000.0\n")    # a wrong published hash
    report = verify_model(model, checksums=True, progress=False)
    [result] = [r for r in report.results if r.path == shard]
    assert result.expected_source == "huggingface-download" and result.status == "CHECKSUM MISMATCH"
    metadata.write_text(f"{'1' * 40}\n{hashlib.sha256(shard.read_bytes()).hexdigest()}\n1700000000.0\n")
    assert verify_model(model, checksums=True, progress=False).ok


def test_parallel_hashing_matches_hashlib(tmp_path: Path) -> None:
    paths = []
    for index, size in enumerate([0, 1, 8 * 1024 * 1024 + 3, 12345]):
        path = tmp_path / f"f{index}"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    digests = hash_files(paths, workers=3, progress=False)
    assert digests == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def test_damaged_cache_file_is_ignored(model: Path, private_cache: Path) -> None:
    private_cache.mkdir(parents=True)
    (private_cache / "verify-cache.json").write_text("{not json")
    assert verify_model(model, checksums=True, progress=False).ok
    assert HashCache(private_cache).load().get(verify_module.FileIdentity.of(some_shard(model)))


def test_cache_and_manifest_of_the_wrong_shape_are_ignored(model: Path, private_cache: Path) -> None:
    """Valid JSON holding the wrong structure (hand-edited, another version) costs a re-hash, never a
    raw AttributeError/TypeError."""
    shard = some_shard(model)
    private_cache.mkdir(parents=True)
    (private_cache / "verify-cache.json").write_text(
        '{"version": 1, "files": {"%s": "not an entry", "other": 3}}' % shard.resolve())
    manifest = manifest_path(model, private_cache)
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"files": {"FL2VA/transformer/%s": "no hash here"}}' % shard.name)
    report = verify_model(model, checksums=True, progress=False)
    assert report.ok and report.manifest_written
    manifest.write_text('{"files": ["a", "list"]}')
    assert verify_model(model, checksums=True, progress=False, cache_directory=private_cache).ok


def test_unwritable_cache_location_is_a_model_error_not_oserror(model: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(blocker / "cache"))
    assert verify_model(model, progress=False).ok              # headers only: no cache needed
    with pytest.raises(ModelError, match="cannot write the checksum manifest") as caught:
        verify_model(model, checksums=True, progress=False)
    assert "H3BRIDGE_CACHE_DIR" in caught.value.hint


def test_unreadable_shard_while_hashing_is_an_integrity_error(tmp_path: Path) -> None:
    from h3bridge.model.verify import sha256_file
    with pytest.raises(IntegrityError, match="cannot read") as caught:
        sha256_file(tmp_path / "vanished.safetensors")
    assert caught.value.path == tmp_path / "vanished.safetensors"


def test_hashing_without_a_terminal_prints_progress_lines(model: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`verify --checksums` in a log or CI printed nothing for many seconds: without a terminal
    (capsys is not one) a line starts, a line per interval (here every read), a line ends."""
    monkeypatch.setattr(verify_module, "PROGRESS_LINE_SECONDS", 0.0)
    verify_model(model, checksums=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("h3bridge: sha256: hashing ")
    assert any(" of " in line and "%)" in line for line in lines[1:-1])
    assert lines[-1].startswith("h3bridge: sha256: hashed ")
    verify_model(model, checksums=True, rewrite_manifest=True, progress=False)       # --quiet
    assert capsys.readouterr().err == ""
