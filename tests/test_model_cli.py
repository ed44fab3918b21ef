"""`h3bridge info`, `verify`, `plan`, and the pre-flight check in `generate`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core_helpers import sim_engine_path, sim_invocations, sim_log  # noqa: F401
from model_helpers import copy_model, fl2va_template  # noqa: F401  (fixture)
from h3bridge.cli.main import main
from h3bridge.model.memory import MachineFacts
from h3bridge.sim.fixture import write_fixture_model


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("H3_MODEL_DIR", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def tiny(fl2va_template: Path, tmp_path: Path) -> Path:  # noqa: F811
    return copy_model(fl2va_template, tmp_path)


@pytest.fixture(scope="module")
def realistic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture_model(tmp_path_factory.mktemp("real") / "MiniMax-H3", realistic=True, ref2va=False)


@pytest.fixture
def mac_24(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MachineFacts, "detect", classmethod(lambda cls: MachineFacts.mac(24, "Apple M4 Pro")))


def test_info_prints_the_inventory(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tiny)]) == 0
    out = capsys.readouterr().out
    assert "FL2VA" in out and "transformer" in out and "layout: OK" in out and "references need it" in out


def test_info_and_verify_json(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tiny), "--json"]) == 0
    inventory = json.loads(capsys.readouterr().out)
    transformer = inventory["partitions"]["FL2VA"]["components"]["transformer"]
    assert transformer["files"] == 7 and set(transformer["dtype_bytes"]) == {"BF16", "F32"}
    assert inventory["problems"] == [] and inventory["ref2va"] is False
    assert main(["verify", str(tiny), "--checksums", "--quiet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and len(report["shards"]) == 23 and all(len(s["sha256"]) == 64 for s in report["shards"])


def test_info_reports_a_mistaken_layout_with_its_fix(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tiny / "FL2VA/text_encoder/._model-00001-of-00014.safetensors").write_bytes(bytes(4096))
    assert main(["info", str(tiny)]) == 1
    out = capsys.readouterr().out
    assert "AppleDouble" in out and "dot_clean" in out


def test_info_uses_h3_model_dir(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("H3_MODEL_DIR", str(tiny))
    assert main(["info"]) == 0 and str(tiny) in capsys.readouterr().out


def test_info_without_a_model_dir_exits_2_with_a_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 2          # a refusal before anything ran (README "exit statuses")
    assert "H3_MODEL_DIR" in capsys.readouterr().err


def test_verify_headers_and_checksums(tiny: Path, private_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(tiny)]) == 0
    assert "23 shard(s): OK" in capsys.readouterr().out
    assert main(["verify", str(tiny), "--checksums", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "manifest written" in out and str(private_cache) in out
    shard = sorted((tiny / "FL2VA/audio_vae").glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["verify", str(tiny), "--checksums", "--quiet"]) == 1
    assert "CHECKSUM MISMATCH" in capsys.readouterr().out


def test_plan_table_and_exit_status(realistic: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-d", str(realistic), "--memory-gb", "24"]) == 1
    out = capsys.readouterr().out
    assert "DiT load + denoise" in out and "does not fit" in out and "--ssd-streaming" in out
    assert main(["plan", "-d", str(realistic), "--memory-gb", "24", "--ssd-streaming"]) == 0
    assert "fits:" in capsys.readouterr().out


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--memory-gb", "128", "--chip", "Apple M5 Max", "--json", "--show"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fits"] and plan["dit_path"] == "int8" and plan["preview"]
    assert {p["name"] for p in plan["phases"]} >= {"prompt encoding", "DiT load + denoise", "video decode"}


def test_generate_refuses_what_does_not_fit_before_starting_h3(realistic: Path, tmp_path: Path, mac_24: None,
                                                               sim_log: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "fox.mp4"
    status = main(["generate", "-p", "fox", "-o", str(output), "--engine-path", str(sim_engine_path()),
                   "--model-dir", str(realistic), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2 and "does not fit" in err and "--ssd-streaming" in err and "--force" in err
    assert "DiT load + denoise" in err                       # the plan is shown
    assert sim_invocations(sim_log) == [] and not output.exists()


def test_generate_refuses_a_damaged_model_before_starting_h3(tiny: Path, tmp_path: Path, sim_log: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    shard = sorted((tiny / "FL2VA/transformer").glob("*.safetensors"))[0]
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 8)
    status = main(["generate", "-p", "fox", "-o", str(tmp_path / "x.mp4"), "--engine-path",
                   str(sim_engine_path()), "--model-dir", str(tiny), "--quiet"])
    assert status == 2 and "truncated" in capsys.readouterr().err
    assert sim_invocations(sim_log) == []


def test_force_passes_the_preflight(realistic: Path, mac_24: None, capsys: pytest.CaptureFixture[str]) -> None:
    from h3bridge.cli.main import preflight_generate
    from h3bridge.request import GenerationRequest
    preflight_generate(GenerationRequest("fox"), realistic, force=True)
    assert "--force: does not fit" in capsys.readouterr().err


def test_generate_in_a_folder_that_is_not_a_model_says_so_first(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`generate -d /tmp` led with "5 AppleDouble '._*' files ... find /tmp -name '._*' -delete"."""
    folder = tmp_path / "downloads"
    (folder / "clips").mkdir(parents=True)
    (folder / "clips" / "._take.safetensors").write_bytes(b"\0\5\26\7")
    status = main(["generate", "-p", "fox", "-d", str(folder), "--engine-path", str(sim_engine_path()),
                   "-o", str(tmp_path / "out.mp4")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.splitlines()[0] == (f"h3bridge: {folder} is not a MiniMax-H3 model directory (missing required "
                                   f"model file: {folder}/FL2VA/transformer/config.json)")
    assert "AppleDouble" not in err and "-delete" not in err
