"""`h3bridge model download` against a hub that misbehaves (tests/hub_helpers.py: never answers,
drips a byte at a time, sends a body that never ends, lists sizes and names that cannot be placed)
and with its own record damaged. Every wait is bounded by the small limits the test hands the
code (`default_limits`), never by how fast the machine is; the hub holds a misbehaviour at most
HOLD seconds, so code without the bounds ends (wrongly) instead of hanging the test."""
from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from h3bridge.errors import DiskError, ModelError
from h3bridge.model import download
from h3bridge.model.download import PARTS, RECORD, download_model
from h3bridge.safeio.http import FetchLimits
from hub_helpers import TestHub, fixture_files, hub, hub_env  # noqa: F401 (fixtures)

BOUND = 120.0        # a safety net for a child process, not an expected time
HOLD = 30.0          # how long the hub keeps misbehaving before it gives in
# the first content a FL2VA download fetches (groups are sorted by path, h3's markers last): a
# misbehaviour on it is met before any other file, so no other file's timing matters
FIRST = "FL2VA/audio_vae/config.json"


def _quiet(directory: Path, **options: object):
    return download_model(directory, progress=False, say=lambda text: None, partition="FL2VA", **options)


@pytest.fixture
def bounds(monkeypatch: pytest.MonkeyPatch):
    """Hands the download small, explicit bounds (default_limits is what download_model uses)."""
    def set_bounds(**limits: float) -> None:
        chosen = FetchLimits(**limits)
        monkeypatch.setattr(download, "default_limits", lambda: chosen, raising=False)
    return set_bounds


def test_an_endless_chunked_body_stops_at_the_listed_size_and_keeps_nothing(hub: TestHub, tmp_path: Path) -> None:
    hub.endless.add(FIRST)
    hub.hold_for = HOLD
    size = len(hub.files[FIRST].data)
    with pytest.raises(ModelError) as caught:
        _quiet(tmp_path / "m")
    assert f"sent more than the {size} bytes the file has" in caught.value.message
    assert FIRST in caught.value.message and "HF_ENDPOINT" in (caught.value.hint or "")
    assert "continues from" not in (caught.value.hint or "")
    assert not list((tmp_path / "m" / PARTS).glob("*.part")) and not (tmp_path / "m" / FIRST).exists()
    hub.endless.clear()
    assert _quiet(tmp_path / "m").report.ok          # and the next run starts that file afresh


def test_a_hub_that_never_answers_the_listing_is_reported(hub: TestHub, tmp_path: Path, bounds) -> None:
    hub.silent_listing = True
    hub.hold_for = HOLD
    bounds(connect_timeout=5.0, read_timeout=0.5)
    with pytest.raises(ModelError) as caught:
        _quiet(tmp_path / "m")
    assert f"cannot reach {hub.url}" in caught.value.message and "run the same command again" in caught.value.hint
    assert not hub.gets(FIRST)


def test_a_hub_that_drips_the_listing_is_stopped_by_the_deadline(hub: TestHub, tmp_path: Path, bounds) -> None:
    hub.drip_listing = True
    hub.hold_for = HOLD
    bounds(connect_timeout=5.0, read_timeout=5.0, deadline=2.0)
    with pytest.raises(ModelError) as caught:
        _quiet(tmp_path / "m")
    assert "did not answer within 2 s" in caught.value.message and "did not list" in caught.value.message
    assert not hub.gets(FIRST)


def test_a_file_dripped_a_byte_at_a_time_is_stopped_by_the_stall_bound(hub: TestHub, tmp_path: Path, bounds) -> None:
    hub.drip.add(FIRST)
    hub.hold_for = HOLD
    # a drip never trips a read timeout: the stall bound (bytes per window) must stop it
    bounds(connect_timeout=5.0, read_timeout=HOLD * 4, stall_window=1.0, stall_bytes=1024)
    with pytest.raises(ModelError) as caught:
        _quiet(tmp_path / "m")
    assert f"the download of {FIRST} stopped" in caught.value.message and "stalled" in caught.value.message
    assert "less than the 1024 bytes per 1 s" in caught.value.message
    assert hub.sent[FIRST] < len(hub.files[FIRST].data)      # stopped mid-drip, not when the hub gave in


def test_a_file_the_hub_never_answers_is_reported_after_the_read_timeout(hub: TestHub, tmp_path: Path,
                                                                         bounds) -> None:
    hub.silent.add(FIRST)
    hub.hold_for = HOLD
    bounds(connect_timeout=5.0, read_timeout=0.5)
    with pytest.raises(ModelError) as caught:
        _quiet(tmp_path / "m")
    assert f"the download of {FIRST} stopped" in caught.value.message
    assert "did not answer within 0.5 s" in caught.value.message
    assert len(hub.gets(FIRST)) == 1             # a timeout is reported, not retried


def test_a_full_disk_while_placing_a_file_is_a_disk_error_and_the_rerun_finishes(
        hub: TestHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import _local_folder
    real = _local_folder.write_download_metadata
    failed: list[str] = []

    def full_once(local_dir, filename, *args, **kwargs):
        # the disk fills after the file was linked into place, before its .part was removed
        if filename == "FL2VA/transformer/model-00002-of-00007.safetensors" and not failed:
            failed.append(filename)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(local_dir, filename, *args, **kwargs)

    monkeypatch.setattr(_local_folder, "write_download_metadata", full_once)
    root = tmp_path / "m"
    with pytest.raises(DiskError) as caught:
        _quiet(root)
    assert failed and "the disk filled up" in caught.value.message and "run the same command again" in caught.value.hint
    summaries: list[str] = []
    result = download_model(root, progress=False, say=summaries.append, partition="FL2VA")     # the rerun
    assert result.report.ok and not (root / PARTS).exists()
    assert "still to download: 0 B" not in summaries[0]


def test_a_negative_listed_size_is_refused_before_downloading(hub: TestHub, tmp_path: Path) -> None:
    hub.listed_size[FIRST] = -5
    with pytest.raises(ModelError) as caught:
        _quiet(tmp_path / "m")
    assert "-5 is not a size" in caught.value.message and "HF_ENDPOINT" in (caught.value.hint or "")
    assert not [entry for entry in hub.log if entry[0] == "GET"]


def test_a_name_listed_as_file_and_folder_is_refused_before_downloading(hub: TestHub, tmp_path: Path) -> None:
    from hub_helpers import ServedFile
    inside = FIRST + "/inside.json"
    hub.files[inside] = ServedFile(inside, b"{}")
    with pytest.raises(ModelError) as caught:
        _quiet(tmp_path / "m")
    assert f"lists {FIRST!r} both as a file and as a folder" in caught.value.message
    assert not [entry for entry in hub.log if entry[0] == "GET"]


def test_a_local_file_where_a_folder_goes_is_named_with_its_fix(hub: TestHub, tmp_path: Path) -> None:
    root = tmp_path / "m"
    blocker = root / "FL2VA" / "audio_vae"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("mine")
    with pytest.raises(ModelError) as caught:
        _quiet(root)
    assert f"{blocker} is in the way" in caught.value.message and f"mv {blocker} {blocker}.mine" in caught.value.hint
    assert blocker.read_text() == "mine" and not [entry for entry in hub.log if entry[0] == "GET"]


def _cli(tmp_path: Path, hub: TestHub, root: Path) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, in a child bounded in time and memory (a FIFO record hung the
    command, a record linked to /dev/zero read until memory ran out)."""
    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    program = Path(sys.executable).with_name("h3bridge")
    return subprocess.run([str(program), "model", "download", str(root), "--partition", "FL2VA", "--quiet"],
                          env=hub_env(tmp_path, hub), capture_output=True, text=True, timeout=BOUND,
                          preexec_fn=cap_memory)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_record_that_is_a_fifo_or_a_device_is_refused_with_its_fix(kind: str, hub: TestHub, tmp_path: Path) -> None:
    root = tmp_path / "m"
    record = root / RECORD
    record.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(record)
    else:
        record.symlink_to("/dev/zero")
    done = _cli(tmp_path, hub, root)
    assert done.returncode == 2, done.stderr
    what = "a named pipe (FIFO)" if kind == "fifo" else "a character device (a symbolic link to /dev/zero)"
    assert f"{record} is {what}, not h3bridge's download record" in done.stderr
    assert f"rm {record}" in done.stderr and "Traceback" not in done.stderr
    assert not hub.log                             # refused before asking the hub anything
    assert os.path.islink(record) if kind == "dev-zero" else record.is_fifo()     # and left as it was


@pytest.mark.parametrize("text", ['{"placed": "x"}', '{"placed": {"a": 1}}', '{"commit": 7}', "[1, 2]", "{nope",
                                  '{"placed": {}}' + " " * (5 << 20)])
def test_a_record_of_the_wrong_shape_counts_as_no_record(text: str, hub: TestHub, tmp_path: Path) -> None:
    root = tmp_path / "m"
    record = root / RECORD
    record.parent.mkdir(parents=True)
    record.write_text(text)
    assert _quiet(root).report.ok
    written = json.loads(record.read_text())
    assert isinstance(written["placed"], dict) and all(isinstance(v, str) for v in written["placed"].values())


def test_a_record_write_killed_midway_does_not_block_every_rerun(hub: TestHub, tmp_path: Path) -> None:
    root = tmp_path / "m"
    assert _quiet(root).report.ok
    # what a SIGKILL between the record writer's mkstemp and its rename leaves (verify.py's
    # _atomic_write_json): a ".tmp" the model check counts as an unfinished download
    leftover = root / RECORD.parent / ".download.json.k1ll3d.tmp"
    leftover.write_text('{"placed": {')
    assert _quiet(root).report.ok and not leftover.exists()
