"""`h3bridge model download` against a local hub (tests/hub_helpers.py) serving the fixture model."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from h3bridge.errors import DiskError, IntegrityError, ModelError
from h3bridge.model.download import PARTS, check_space, download_model, plan_download
from hub_helpers import COMMIT, TestHub, fixture_files, hub, hub_env  # noqa: F401 (fixtures)

BOUND = 60.0      # every wait is bounded; a safety net on a loaded machine


def _quiet_download(directory: Path, **options: object):
    return download_model(directory, progress=False, say=lambda text: None, **options)


def test_download_all_places_both_partitions_shares_identical_files_and_verifies(hub: TestHub, tmp_path: Path) -> None:
    result = _quiet_download(tmp_path / "MiniMax-H3")
    root = tmp_path / "MiniMax-H3"
    assert result.report.ok and result.plan.commit == COMMIT
    for path, item in hub.files.items():
        assert (root / path).read_bytes() == item.data, path
    # identical by the hub's sha256: one inode; the Ref2VA transformer (different bytes): its own
    shared = root / "FL2VA/text_encoder/model-00001-of-00014.safetensors"
    assert os.path.samefile(shared, root / "Ref2VA/text_encoder/model-00001-of-00014.safetensors")
    assert shared.stat().st_nlink == 2
    assert not os.path.samefile(root / "FL2VA/transformer/model-00001-of-00007.safetensors",
                                root / "Ref2VA/transformer/model-00001-of-00007.safetensors")
    # each shared content was fetched once
    assert len(hub.gets("Ref2VA/text_encoder/model-00001-of-00014.safetensors")) + \
        len(hub.gets("FL2VA/text_encoder/model-00001-of-00014.safetensors")) == 1
    assert {r.expected_source for r in result.report.results} == {"huggingface-download"}
    assert not (root / PARTS).exists()


def test_a_dropped_connection_is_resumed_with_a_range_request(hub: TestHub, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants
    # huggingface_hub writes what it received in chunks of DOWNLOAD_CHUNK_SIZE (10 MB, more than
    # a fixture file); 64 KiB chunks make the part received before the drop visible
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 65536)
    path = "FL2VA/audio_vae/diffusion_pytorch_model.safetensors"
    hub.drop_after[path] = 300_000
    result = _quiet_download(tmp_path / "m", partition="FL2VA")
    assert result.report.ok
    assert (tmp_path / "m" / path).read_bytes() == hub.files[path].data
    assert hub.gets(path) == [None, f"bytes={4 * 65536}-"]     # huggingface_hub's own resume: only the rest


def test_a_rerun_fetches_nothing_finished_and_continues_a_kept_part(hub: TestHub, tmp_path: Path) -> None:
    root = tmp_path / "m"
    _quiet_download(root, partition="FL2VA")
    before = len(hub.log)
    # what an interrupted run leaves for one file: its first bytes in the .part, nothing in place
    path = "FL2VA/video_vae/source/diffusion_pytorch_model.safetensors"
    data = hub.files[path].data
    (root / path).unlink()
    (root / PARTS).mkdir(parents=True, exist_ok=True)
    (root / PARTS / f"{hub.files[path].etag}.part").write_bytes(data[:100_000])
    result = _quiet_download(root, partition="FL2VA")
    assert result.fetched == [path]
    assert [entry for entry in hub.log[before:] if entry[0] == "GET"] == [("GET", path, "bytes=100000-")]
    assert (root / path).read_bytes() == data


def test_a_corrupted_file_is_refused_and_nothing_poses_as_complete(hub: TestHub, tmp_path: Path) -> None:
    path = "FL2VA/transformer/model-00003-of-00007.safetensors"
    hub.corrupt.add(path)
    root = tmp_path / "m"
    with pytest.raises(IntegrityError) as caught:
        _quiet_download(root, partition="FL2VA")
    assert path in caught.value.message and hub.files[path].etag in caught.value.message
    assert "run the same command again" in (caught.value.hint or "")
    assert not (root / path).exists()
    assert not list((root / PARTS).glob("*.part"))           # the bad bytes are not kept to resume from
    assert not (root / "FL2VA/transformer/config.json").exists()     # h3's marker comes last
    hub.corrupt.clear()
    assert _quiet_download(root, partition="FL2VA").report.ok


def test_a_wrong_revision_is_a_clear_error(hub: TestHub, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as caught:
        _quiet_download(tmp_path / "m", revision="v9-does-not-exist")
    assert "'v9-does-not-exist' does not exist in MiniMaxAI/MiniMax-H3" in caught.value.message
    # the fix is data (issue 34.3): the CLI says --revision, Python revision=
    from h3bridge.cli.engine import cli_hint
    assert "--revision" in (cli_hint(caught.value) or "") and "revision=" in (caught.value.hint or "")
    assert not [entry for entry in hub.log if entry[0] == "GET"]


def test_the_free_space_check_counts_only_the_remaining_bytes(hub: TestHub, tmp_path: Path) -> None:
    root = tmp_path / "m"
    plan = plan_download(root)
    unique = {f.key: f.size for f in plan.files}
    assert plan.remaining_bytes == sum(unique.values()) < sum(f.size for f in plan.files)   # shared once
    with pytest.raises(DiskError) as caught:
        download_model(root, progress=False, say=lambda text: None, free=lambda folder: plan.remaining_bytes - 1)
    assert caught.value.before_start and caught.value.needed == plan.remaining_bytes
    assert "--partition FL2VA" in (caught.value.hint or "")
    assert not [entry for entry in hub.log if entry[0] == "GET"]
    # after FL2VA, only Ref2VA's own files remain; with a .part kept, less still
    _quiet_download(root, partition="FL2VA")
    plan = plan_download(root)
    here = plan.in_place
    own = [f for f in plan.files if f.path not in plan.done and f.key not in here]
    assert own and all(f.path.startswith("Ref2VA/transformer/") for f in own if f.path.endswith(".safetensors"))
    shard = next(f for f in own if f.size > 1000)
    kept = plan.part_path(shard.key)
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_bytes(hub.files[shard.path].data[:1000])
    assert plan.remaining_bytes == sum(f.size for f in own) - 1000
    check_space(plan, plan.remaining_bytes)        # exactly enough: no refusal
    plan.links = False                             # a disk without hard links stores copies
    linked = [f for f in plan.files if f.path not in plan.done and f.key in here]
    assert plan.remaining_bytes == sum(f.size for f in own) - 1000 + sum(f.size for f in linked)
    # and the rest of the download links the shared files to FL2VA's instead of fetching them
    before = len(hub.log)
    result = _quiet_download(root)
    assert sorted(result.fetched) == sorted(f.path for f in own)
    assert {p for method, p, r in hub.log[before:] if method == "GET"} == {f.path for f in own}
    assert os.path.samefile(root / linked[0].path, root / "FL2VA" / linked[0].path.split("/", 1)[1])


def test_a_file_the_user_made_is_never_overwritten(hub: TestHub, tmp_path: Path) -> None:
    root = tmp_path / "m"
    mine = root / "FL2VA/tokenizer/tokenizer.json"
    mine.parent.mkdir(parents=True)
    mine.write_text('{"mine": true}')
    with pytest.raises(ModelError) as caught:
        _quiet_download(root, partition="FL2VA")
    assert str(mine) in caught.value.message and f"mv {mine}" in (caught.value.hint or "")
    assert mine.read_text() == '{"mine": true}'
    assert not [entry for entry in hub.log if entry[0] == "GET"]


def test_a_folder_of_other_files_or_a_repack_is_refused(hub: TestHub, tmp_path: Path) -> None:
    repack = tmp_path / "comfy"
    repack.mkdir()
    (repack / "minimax_h3_fp8_scaled.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ModelError) as caught:
        _quiet_download(repack)
    assert "single-file repacks" in caught.value.message and "pass a new folder as DIR" in (caught.value.hint or "")


def test_a_repack_repository_is_refused_before_downloading(hub: TestHub, tmp_path: Path) -> None:
    from hub_helpers import ServedFile
    hub.files = {"minimax_h3_bf16.safetensors": ServedFile("minimax_h3_bf16.safetensors", b"\0" * 64)}
    with pytest.raises(ModelError) as caught:
        _quiet_download(tmp_path / "m", repo_id="MiniMaxAI/MiniMax-H3")
    assert "single-file weights such as minimax_h3_bf16.safetensors" in caught.value.message
    # the fix is data (issue 34.3): the CLI says --repo, Python repo_id=
    from h3bridge.cli.engine import cli_hint
    assert "--repo MiniMaxAI/MiniMax-H3" in (cli_hint(caught.value) or "")
    assert "repo_id='MiniMaxAI/MiniMax-H3'" in (caught.value.hint or "")
    assert not [entry for entry in hub.log if entry[0] == "GET"]


def test_a_misaligned_shard_is_refused_with_the_reason(hub: TestHub, tmp_path: Path) -> None:
    import json
    import struct
    path = "FL2VA/audio_vae/diffusion_pytorch_model.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header += b" " * ((8 - (8 + len(header)) % 8) % 8 + 1)        # data starts off the 8-byte grid
    from hub_helpers import ServedFile
    hub.files[path] = ServedFile(path, struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(IntegrityError) as caught:
        _quiet_download(tmp_path / "m", partition="FL2VA")
    assert "misaligned" in caught.value.message and "h3 cannot load it" in caught.value.message
    assert not (tmp_path / "m" / path).exists()


def _wait_for(condition, what: str) -> None:
    import threading
    import time
    pause = threading.Event()
    deadline = time.monotonic() + BOUND          # by the clock: a busy machine makes each look slower
    while time.monotonic() < deadline:
        if condition():
            return
        pause.wait(0.05)
    raise AssertionError(f"waited {BOUND} s for {what}")


def test_ctrl_c_mid_file_then_a_rerun_continues_and_fetches_no_finished_file(hub: TestHub, tmp_path: Path) -> None:
    root = tmp_path / "m"
    path = "FL2VA/video_vae/source/diffusion_pytorch_model.safetensors"
    chunk = 65536
    hub.pause_after[path] = 200_000
    # the CLI as a user runs it, with huggingface_hub writing in 64 KiB chunks (its 10 MB default is
    # more than a fixture file, so nothing would be kept to continue from)
    program = ("import sys; import huggingface_hub.constants as c; c.DOWNLOAD_CHUNK_SIZE = %d; "
               "from h3bridge.cli.main import main; raise SystemExit(main(sys.argv[1:]))" % chunk)
    argv = [sys.executable, "-c", program, "model", "download", str(root), "--partition", "FL2VA", "--quiet"]
    env = hub_env(tmp_path, hub)
    # the hub holds the file mid-way until this test has seen the pause and sent Ctrl-C (and
    # released it); with huggingface_hub's 10 s read timeout the client gave up waiting first,
    # resumed and finished when the machine was busy enough to delay this test's look past 10 s
    env["HF_HUB_DOWNLOAD_TIMEOUT"] = str(int(BOUND * 4))
    # as started from a terminal: Ctrl-C's default disposition, whatever this test process inherited
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        part = root / PARTS / f"{hub.files[path].etag}.part"
        _wait_for(lambda: hub.paused.is_set() and part.exists() and part.stat().st_size >= 3 * chunk,
                  "the download to stop mid-file")
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=BOUND * 2)
    finally:
        process.kill()
        process.wait(BOUND)
    assert process.returncode == 130, err
    assert f"run `h3bridge model download {root} --partition FL2VA` again to continue" in err
    assert not (root / path).exists() and part.stat().st_size == 3 * chunk
    finished = {p for method, p, r in hub.log if method == "GET" and p != path}
    assert finished and all((root / p).exists() for p in finished)
    from h3bridge.model.inventory import inspect_model
    problems = {p.kind: p for p in inspect_model(root).problems}      # `h3bridge info` on the unfinished folder
    assert f"`h3bridge model download {root}` continues" in problems["partial-download"].fix
    assert "missing-file" in problems         # h3's marker files come last: not a model h3 would load yet
    hub.release.set()

    rerun = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=BOUND * 2)
    assert rerun.returncode == 0, rerun.stderr
    assert hub.gets(path) == [None, f"bytes={3 * chunk}-"]
    assert all(len(hub.gets(p)) == 1 for p in finished)        # nothing finished was fetched again
    assert (root / path).read_bytes() == hub.files[path].data
    assert "verified: " in rerun.stdout and "OK" in rerun.stdout


def test_cli_refusals_name_the_flag_and_exit_2(hub: TestHub, tmp_path: Path) -> None:
    env = hub_env(tmp_path, hub)
    program = Path(sys.executable).with_name("h3bridge")
    wrong = subprocess.run([str(program), "model", "download", str(tmp_path / "m"), "--revision", "nope"],
                           env=env, capture_output=True, text=True, timeout=BOUND * 2)
    assert wrong.returncode == 2 and "revision 'nope' does not exist" in wrong.stderr and "--revision" in wrong.stderr
    alone = subprocess.run([str(program), "model", "download", str(tmp_path / "m"), "--partition", "Ref2VA"],
                           env=env, capture_output=True, text=True, timeout=BOUND * 2)
    assert alone.returncode == 2 and "--partition Ref2VA alone cannot run" in alone.stderr
    assert f"h3bridge model download {tmp_path / 'm'}`" in alone.stderr


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 4 MiB tmpfs (root only; skipped where mounting is not permitted)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True, timeout=BOUND)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=BOUND)


def test_a_disk_that_fills_up_mid_download_is_reported_and_the_rerun_continues(hub: TestHub, small_disk: Path) -> None:
    root = small_disk / "m"
    filler = small_disk / "filler"
    path = "FL2VA/video_vae/source/diffusion_pytorch_model.safetensors"

    def fill_the_disk(requested: str) -> None:
        if requested == path and not hub.gets(path)[:-1]:         # the first GET of that file only
            with open(filler, "wb") as handle:
                try:
                    while True:
                        handle.write(b"\0" * 65536)
                        handle.flush()
                except OSError:
                    pass

    hub.before_get = fill_the_disk
    with pytest.raises(DiskError) as caught:
        _quiet_download(root, partition="FL2VA")
    assert f"the disk filled up while downloading {path}" in caught.value.message
    assert "run the same command again" in (caught.value.hint or "")
    assert not (root / path).exists() and not (root / "FL2VA/transformer/config.json").exists()
    filler.unlink()
    assert _quiet_download(root, partition="FL2VA").report.ok


def test_the_documented_commands_run_against_a_local_hub(hub: TestHub, tmp_path: Path) -> None:
    """docs/model-download.md's tested-by block, run as written (bash -euo pipefail, a fresh
    folder as the working directory, HOME in tmp, HF_ENDPOINT at the local hub)."""
    import re
    docs = Path(__file__).resolve().parents[1] / "docs" / "model-download.md"
    name = "tests/test_model_download.py::test_the_documented_commands_run_against_a_local_hub"
    found = re.search(rf"<!-- tested-by: {re.escape(name)} -->\n```sh\n(.*?)```", docs.read_text(), re.DOTALL)
    assert found, f"no block in {docs} names this test"
    work = tmp_path / "work"
    work.mkdir()
    env = hub_env(tmp_path, hub)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", found[1]], cwd=work, env=env, capture_output=True,
                          text=True, timeout=BOUND * 4)
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout and (work / "MiniMax-H3/Ref2VA/transformer/model.safetensors.index.json").is_file()
    shared = "text_encoder/model-00001-of-00014.safetensors"
    assert os.path.samefile(work / "MiniMax-H3/FL2VA" / shared, work / "MiniMax-H3/Ref2VA" / shared)


def test_a_file_name_pointing_outside_dir_is_refused(hub: TestHub, tmp_path: Path) -> None:
    from hub_helpers import ServedFile
    evil = "FL2VA/../../escaped.safetensors"
    hub.files[evil] = ServedFile(evil, b"\0" * 64)
    with pytest.raises(ModelError) as caught:
        _quiet_download(tmp_path / "deep" / "m", partition="FL2VA")
    assert repr(evil) in caught.value.message and "HF_ENDPOINT" in (caught.value.hint or "")
    assert not (tmp_path / "escaped.safetensors").exists() and not (tmp_path / "deep" / "m").exists()


def test_a_server_that_delivers_nothing_is_reported_not_retried_forever(hub: TestHub, tmp_path: Path) -> None:
    path = "FL2VA/audio_vae/config.json"
    hub.fail_with[path] = 500
    with pytest.raises(ModelError) as caught:
        _quiet_download(tmp_path / "m", partition="FL2VA")
    assert f"the download of {path} stopped" in caught.value.message
    assert f"h3bridge model download {tmp_path / 'm'} --partition FL2VA" in (caught.value.hint or "")
    assert 1 <= len(hub.gets(path)) <= 6        # huggingface_hub's own retries at most, then one report


def test_offline_mode_is_named_with_its_fix(hub: TestHub, tmp_path: Path) -> None:
    env = hub_env(tmp_path, hub)
    env["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run([str(Path(sys.executable).with_name("h3bridge")), "model", "download", str(tmp_path / "m")],
                          env=env, capture_output=True, text=True, timeout=BOUND * 2)
    assert done.returncode == 2 and "HF_HUB_OFFLINE is set" in done.stderr and "unset HF_HUB_OFFLINE" in done.stderr
    assert not hub.log
