"""Model folders holding what is not a regular file (issue 9 item 5), and an incomplete optional
Ref2VA partition (issue 9 item 6).

A FIFO is opened by nothing: on the old code each of these tests hung in a blocking `open`
(the timeout turns that into a failure)."""
from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from core_helpers import sim_engine_path, sim_invocations, sim_log  # noqa: F401
from h3bridge.cli.main import main
from h3bridge.errors import IntegrityError, ModelError
from h3bridge.model.memory import check_model_for, preflight, MachineFacts
from h3bridge.model.inventory import inspect_model
from h3bridge.request import GenerationRequest, Reference, ReferenceKind
from h3bridge.model.safetensors import read_header
from model_helpers import model, template  # noqa: F401  (fixtures)
from h3bridge.sim.fixture import write_fixture_model
from h3bridge.model.verify import sha256_file, verify_model

pytestmark = pytest.mark.timeout(60)

ROOMY_MAC = MachineFacts.mac(128, "Apple M5 Max")


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("H3_MODEL_DIR", raising=False)
    return tmp_path / "cache"




def image_reference(tmp_path: Path) -> Reference:
    return Reference(ReferenceKind.IMAGE, tmp_path / "ref.png")


# ----------------------------------------------------------------------------- item 5: not regular files

def test_a_fifo_shard_is_reported_not_opened(model: Path) -> None:
    fifo = model / "FL2VA/transformer/model-00099-of-00099.safetensors"
    os.mkfifo(fifo)
    inventory = inspect_model(model)
    [problem] = [p for p in inventory.problems if p.kind == "not-a-file"]
    assert problem.severity == "error" and problem.path == fifo and not problem.references_only
    assert "named pipe (FIFO)" in problem.message and str(fifo) in problem.message
    assert f"rm {fifo}" in problem.fix
    with pytest.raises(IntegrityError, match="named pipe"):
        inventory.raise_for_problems()


def test_a_fifo_anywhere_in_the_folder_is_a_warning(model: Path) -> None:
    (model / "extras").mkdir()
    os.mkfifo(model / "extras/notes.safetensors")
    inventory = inspect_model(model)
    [problem] = [p for p in inventory.problems if p.kind == "not-a-file"]
    assert problem.severity == "warning" and "h3 does not read this folder" in problem.message
    inventory.raise_for_problems()


def test_a_shard_linked_to_dev_zero_fails_verify(model: Path) -> None:
    link = model / "FL2VA/text_encoder/model-00099-of-00099.safetensors"
    link.symlink_to("/dev/zero")
    report = verify_model(model)
    assert not report.ok
    assert any("character device" in e.message and "/dev/zero" in e.message for e in report.errors)
    assert all(r.path != link for r in report.results)        # never opened or hashed


def test_a_directory_and_a_socket_named_safetensors_are_reported(model: Path, tmp_path: Path) -> None:
    (model / "FL2VA/audio_vae/extra.safetensors").mkdir()
    inventory = inspect_model(model)
    assert any(p.kind == "not-a-file" and "a directory" in p.message for p in inventory.errors)
    shutil.rmtree(model / "FL2VA/audio_vae/extra.safetensors")
    # AF_UNIX paths are limited to ~100 bytes: bind in a short folder, link it into the model.
    short = Path(f"/tmp/h3b-sock-{os.getpid()}")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(short))
        try:
            (model / "FL2VA/audio_vae/extra.safetensors").symlink_to(short)
            assert any("a socket" in p.message for p in inspect_model(model).errors)
        finally:
            short.unlink()


def test_info_and_verify_flag_a_device_or_fifo_whatever_its_name(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 19 item 3: notes.txt or an index JSON linked to /dev/zero (or a FIFO) passed info and
    verify, and `lora fold`, which copies every file, wrote until the disk was full."""
    notes = model / "notes.txt"
    notes.symlink_to("/dev/zero")
    inventory = inspect_model(model)
    [problem] = [p for p in inventory.problems if p.kind == "not-a-file"]
    assert problem.severity == "warning" and problem.path == notes
    assert "character device (a symbolic link to /dev/zero)" in problem.message and f"rm {notes}" in problem.fix
    notes.unlink()
    config = model / "FL2VA/transformer/config.json"      # a file h3 requires: an error
    config.unlink()
    os.mkfifo(config)
    index = model / "FL2VA/text_encoder/model.safetensors.index.json"
    index.unlink(missing_ok=True)
    os.mkfifo(index)
    report = verify_model(model)
    assert not report.ok
    assert any(e.message.startswith(f"{config}: is a named pipe (FIFO)") for e in report.errors)
    assert "and 1 more such entries" in inspect_model(model).errors[0].message
    assert main(["info", str(model)]) != 0
    assert "named pipe (FIFO)" in capsys.readouterr().out


def test_header_and_hash_readers_refuse_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "x.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(IntegrityError, match="named pipe"):
        read_header(fifo)
    with pytest.raises(IntegrityError, match="named pipe"):
        sha256_file(fifo)
    with pytest.raises(IntegrityError, match="character device"):
        read_header("/dev/zero")


def test_generate_refuses_a_fifo_shard_before_starting_h3(model: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(model / "FL2VA/video_vae/source/model-00099.safetensors")
    status = main(["generate", "-p", "fox", "-o", str(tmp_path / "x.mp4"), "--engine-path",
                   str(sim_engine_path()), "--model-dir", str(model), "--quiet"])
    assert status != 0 and "named pipe (FIFO)" in capsys.readouterr().err
    assert sim_invocations(sim_log) == []


# ----------------------------------------------------------------------------- item 6: incomplete Ref2VA

def half_download_ref2va(model: Path) -> None:
    """What an interrupted `huggingface-cli download` leaves: the index is there, the text encoder
    and a transformer shard are not, and a partial file waits in the download cache."""
    for shard in (model / "Ref2VA/text_encoder").glob("*.safetensors"):
        shard.unlink()
    sorted((model / "Ref2VA/transformer").glob("*.safetensors"))[-1].unlink()
    cache = model / ".cache/huggingface/download/Ref2VA/text_encoder"
    cache.mkdir(parents=True)
    (cache / "model-00001-of-00002.safetensors.incomplete").write_bytes(b"\0" * 100)


def test_an_incomplete_ref2va_stops_only_reference_jobs(model: Path, tmp_path: Path) -> None:
    half_download_ref2va(model)
    inventory = inspect_model(model)
    assert inventory.errors == [] and not inventory.has_ref2va
    assert {p.kind for p in inventory.reference_errors} >= {"missing-component", "missing-shards", "partial-download"}
    inventory.raise_for_problems()                          # text-to-video and first/last-frame jobs
    warnings = check_model_for(GenerationRequest("fox"), inventory)
    assert any("Ref2VA is incomplete" in w and "this job does not use it" in w for w in warnings)
    with pytest.raises(ModelError) as refused:
        check_model_for(GenerationRequest("fox", references=(image_reference(tmp_path),)), inventory)
    message = refused.value.message
    assert "references need h3's Ref2VA checkpoint" in message
    assert "Ref2VA/text_encoder: no safetensors files" in message and "missing" in message
    assert "jobs without references" in (refused.value.hint or "")
    assert f"--include 'Ref2VA/*' --local-dir {model}" in (refused.value.hint or "")
    assert "error (reference jobs only)" in inventory.table()


def test_ref2va_without_its_index_names_the_missing_pieces_for_a_reference_job(model: Path, tmp_path: Path) -> None:
    (model / "Ref2VA/transformer/model.safetensors.index.json").unlink()
    inventory = inspect_model(model)
    assert inventory.errors == []
    check_model_for(GenerationRequest("fox"), inventory)
    with pytest.raises(ModelError, match="model.safetensors.index.json"):
        check_model_for(GenerationRequest("fox", references=(image_reference(tmp_path),)), inventory)


def test_what_h3_load_dir_reads_for_every_job_still_stops_every_job(model: Path) -> None:
    # h3.c h3_load_dir inventories Ref2VA/transformer (headers) once its index exists.
    shard = sorted((model / "Ref2VA/transformer").glob("*.safetensors"))[0]
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 8)
    assert [p.kind for p in inspect_model(model).errors] == ["integrity"]
    for other in (model / "Ref2VA/transformer").glob("*.safetensors"):
        other.unlink()
    assert [p.kind for p in inspect_model(model).errors] == ["missing-component"]


def test_generate_runs_text_to_video_with_an_incomplete_ref2va_and_warns(
        model: Path, tmp_path: Path, sim_log: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    half_download_ref2va(model)
    output = tmp_path / "fox.mp4"
    status = main(["generate", "-p", "fox", "-o", str(output), "--engine-path", str(sim_engine_path()),
                   "--model-dir", str(model), "--quiet", "--frames", "22", "--width", "256", "--height", "256"])
    err = capsys.readouterr().err
    assert status == 0, err
    assert output.is_file()
    assert "h3bridge: warning:" in err and "Ref2VA is incomplete" in err


def test_preflight_keeps_the_warnings_on_the_plan(model: Path) -> None:
    half_download_ref2va(model)
    plan = preflight(GenerationRequest("fox"), model, machine=ROOMY_MAC)
    assert any("Ref2VA is incomplete" in w for w in plan.model_warnings)


def test_unfinished_hugging_face_cache_blobs_stop_only_reference_jobs(template: Path, tmp_path: Path) -> None:
    # `huggingface-cli download` into the hub cache: FL2VA is linked and complete, Ref2VA's files
    # are still blobs/*.incomplete (not linked into the snapshot yet).
    repo = tmp_path / "hub/models--MiniMaxAI--MiniMax-H3"
    snapshot = Path(shutil.copytree(template, repo / "snapshots/0123abcd"))
    shutil.rmtree(snapshot / "Ref2VA")
    (repo / "blobs").mkdir()
    (repo / "blobs" / ("e" * 64 + ".incomplete")).write_bytes(bytes(10))
    inventory = inspect_model(snapshot)
    assert inventory.errors == [] and [p.kind for p in inventory.reference_errors] == ["partial-download"]
    assert check_model_for(GenerationRequest("fox"), inventory)      # a warning, not a refusal
    with pytest.raises(ModelError, match="unfinished download") as refused:
        check_model_for(GenerationRequest("fox", references=(image_reference(tmp_path),)), inventory)
    assert "--include 'Ref2VA/*'`" in (refused.value.hint or "") and "--local-dir" not in (refused.value.hint or "")
    # With FL2VA itself incomplete the unfinished blobs may be its own: they stop every job.
    next((snapshot / "FL2VA/audio_vae").glob("*.safetensors")).unlink()
    assert {p.kind for p in inspect_model(snapshot).errors} == {"partial-download", "missing-component"}


def test_a_shard_index_of_megabytes_of_spaces_is_a_bad_index_not_read_whole(model: Path) -> None:  # noqa: F811
    """model.safetensors.index.json is read through safeio.paths with a cap (a real one is KiB)."""
    from h3bridge.model.inventory import MAX_INDEX_BYTES
    index = model / "FL2VA" / "transformer" / "model.safetensors.index.json"
    index.write_bytes(index.read_bytes() + b" " * MAX_INDEX_BYTES)
    problems = [p for p in inspect_model(model).errors if p.kind == "bad-index"]
    assert problems and str(index) in problems[0].message and "over the" in problems[0].message
