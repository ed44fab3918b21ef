"""The CLI as a newcomer meets it (issue 9 item 9): `demo`, `verify` output, `h3-sim-model`'s size,
the generate summary's two durations, and `doctor`'s memory plan."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core_helpers import FAST, sim_engine_path
from h3bridge.cli.main import main, preflight_generate
from h3bridge.model.memory import MachineFacts, preflight
from h3bridge.model.inventory import format_bytes
from h3bridge.request import GenerationRequest
from h3bridge.sim import fixture, fixture_cli


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    for variable in ("H3_BIN", "H3_MODEL_DIR", "H3_SIM_CRASH_PHASE", "H3_SIM_HANG_PHASE", "H3_SIM_FAIL_PHASE"):
        monkeypatch.delenv(variable, raising=False)
    return tmp_path / "cache"


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return fixture.write_fixture_model(tmp_path / "MiniMax-H3", ref2va=False)


# ----------------------------------------------------------------------------- demo

def test_demo_needs_no_flags_says_it_is_synthetic_and_never_overwrites(
        tmp_path: Path, private_cache: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["demo", "--quiet"]) == 0
    from h3bridge.cli.main import SYNTHETIC_NOTE
    err = capsys.readouterr().err
    first = work / "h3bridge-demo.mp4"
    assert first.is_file() and first.stat().st_size > 0
    assert SYNTHETIC_NOTE == "synthetic test patterns from h3-sim, not model output"
    assert f"{first} holds {SYNTHETIC_NOTE}" in err and "wall time" in err
    model = private_cache / "demo-model"
    assert (model / "FL2VA").is_dir()                       # made by itself, in h3bridge's cache
    made = (model / "FL2VA").stat().st_ino
    kept = first.read_bytes()

    assert main(["demo", "--quiet"]) == 0                     # again: a new name, the first clip kept
    assert (work / "h3bridge-demo-2.mp4").is_file() and first.read_bytes() == kept
    assert (model / "FL2VA").stat().st_ino == made            # the cached fixture is reused
    capsys.readouterr()

    assert main(["demo", "--quiet", "-o", str(first)]) == 2   # an explicit -o that exists: refused
    assert "--overwrite" in capsys.readouterr().err and first.read_bytes() == kept
    clips = tmp_path / "clips"
    clips.mkdir()
    assert main(["demo", "--quiet", "-o", f"{clips}{os.sep}"]) == 0   # a folder: a new name inside it
    assert [p.name for p in clips.iterdir()] == ["h3bridge-demo.mp4"]
    assert main(["demo", "--quiet", "--output=-dash.mp4", "--prompt=-dash first"]) == 0   # values, not flags
    assert (work / "-dash.mp4").is_file()


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_demo_o_that_is_not_a_regular_file_is_refused_before_the_fixture_is_made(
        tmp_path: Path, private_cache: Path, capsys: pytest.CaptureFixture[str], overwrite: list[str]) -> None:
    """A FIFO or a dangling link at -o: exit 2 before the demo's model is written, left as it was."""
    fifo = tmp_path / "fifo.mp4"
    os.mkfifo(fifo)
    dangling = tmp_path / "dangling.mp4"
    dangling.symlink_to(tmp_path / "nowhere.mp4")
    for path in (fifo, dangling):
        assert main(["demo", "--quiet", "-o", str(path), *overwrite]) == 2
        err = capsys.readouterr().err
        assert f"{path} already exists and is a" in err and "Traceback" not in err
    assert not (private_cache / "demo-model").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling.mp4", "fifo.mp4"]


def test_demo_rewrites_a_cached_fixture_that_is_not_this_versions(private_cache: Path, tmp_path: Path) -> None:
    folder = private_cache / "demo-model"
    folder.mkdir(parents=True)
    (folder / "half-written").write_text("")                # e.g. from an older h3bridge
    assert fixture.cached_fixture_model(folder) == folder
    assert not (folder / "half-written").exists() and (folder / "FL2VA").is_dir()
    assert [p.name for p in private_cache.iterdir()] == ["demo-model"]     # no temporary copies left


# ----------------------------------------------------------------------------- verify

def test_verify_lists_only_problems_and_a_summary_unless_verbose(
        tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(tiny)]) == 0
    quiet = capsys.readouterr().out
    assert "OK" in quiet and ".safetensors" not in quiet and len(quiet.strip().splitlines()) <= 2
    assert main(["verify", str(tiny), "--verbose"]) == 0
    verbose = capsys.readouterr().out
    shards = sorted(str(p.relative_to(tiny)) for p in tiny.rglob("*.safetensors"))
    assert all(name in verbose for name in shards)
    victim = sorted((tiny / "FL2VA/audio_vae").glob("*.safetensors"))[0]
    victim.write_bytes(victim.read_bytes()[:100])             # a truncated download
    assert main(["verify", str(tiny)]) == 1
    problems = capsys.readouterr().out
    assert sum(name in problems for name in shards) == 1 and str(victim.relative_to(tiny)) in problems


# ----------------------------------------------------------------------------- h3-sim-model

def test_h3_sim_model_reports_the_size_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It printed "(0.0 GB nominal)" for the tiny fixture."""
    assert fixture_cli.main([str(tmp_path / "tiny")]) == 0
    out = capsys.readouterr().out
    size = sum(p.stat().st_size for p in (tmp_path / "tiny").rglob("*") if p.is_file())
    assert f"({format_bytes(size)}, synthetic weights for h3-sim)" in out and "0.0 GB" not in out
    assert fixture_cli.main([str(tmp_path / "real"), "--realistic", "--no-ref2va"]) == 0
    out = capsys.readouterr().out
    files = [p.stat() for p in (tmp_path / "real").rglob("*") if p.is_file()]
    nominal, disk = sum(f.st_size for f in files), sum(f.st_blocks * 512 for f in files)
    assert f"({format_bytes(nominal)} nominal in sparse files, {format_bytes(disk)} on disk)" in out
    assert nominal > 100 * 2**30


# ----------------------------------------------------------------------------- generate summary

def test_the_summary_says_which_time_is_wall_time_and_which_is_clip_length(
        tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--width", str(FAST["width"]), "--height", str(FAST["height"]), "--frames", str(FAST["frames"]),
             "--steps", str(FAST["steps"]), "--engine-path", str(sim_engine_path()), "--model-dir", str(tiny), "--quiet"]
    assert main(["generate", "-p", "a fox", "-o", str(tmp_path / "a.mp4"), *flags]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{FAST['frames']} frames ({FAST['frames'] / 24:.1f} s clip at 24 fps)" in line
    assert line.endswith(" s wall time") and "rendered in " in line
    assert main(["generate", "-p", "a fox", "-o", str(tmp_path / "b.mp4"), "--json", *flags]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["clip_seconds"] == pytest.approx(FAST["frames"] / 24)
    # the wall time is the whole job here: the engine's own total, plus any wait for the engine
    assert summary["wall_seconds"] >= summary["timings"]["total"] > 0
    assert summary["waited_seconds"] >= 0


# ----------------------------------------------------------------------------- doctor

def test_doctor_plans_memory_from_the_model_it_was_given_as_generate_does(
        tiny: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """On a 16 GB Mac doctor said the default request "needs --ssd-streaming" (sized for the
    released model) while generate, sized from the model folder it was given, ran it."""
    monkeypatch.setattr(MachineFacts, "detect", classmethod(lambda cls: MachineFacts.mac(16, "Apple M4 Pro")))
    request = GenerationRequest("doctor")
    preflight_generate(request, tiny, force=False)             # generate's check: it fits
    plan = preflight(request, tiny, force=True)
    main(["doctor", "--engine-path", str(sim_engine_path()), "--model-dir", str(tiny), "--json"])
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    memory = checks["memory"]["detail"]
    assert "fits without --ssd-streaming" in memory, memory
    assert f"planned peak {format_bytes(plan.peak)} of {format_bytes(plan.budget)} usable" in memory
