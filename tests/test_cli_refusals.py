"""Exit status 2 for every refusal before the engine starts (README "exit statuses"), each with a
message naming the problem and a fix in the CLI's words; the engine never runs. Exit 1 stays for
a job that ran and failed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core_helpers import sim_engine_path, sim_invocations, sim_log  # noqa: F401  (fixture)
from model_helpers import copy_model, fl2va_template  # noqa: F401  (fixture)
from h3bridge.cli.main import main
from h3bridge.model.memory import MachineFacts
from h3bridge.sim.fixture import write_fixture_model

FAST_FLAGS = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2", "--quiet"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("H3_MODEL_DIR", raising=False)
    monkeypatch.delenv("H3_BIN", raising=False)


@pytest.fixture
def tiny(fl2va_template: Path, tmp_path: Path) -> Path:  # noqa: F811
    return copy_model(fl2va_template, tmp_path)


def generate(capsys: pytest.CaptureFixture[str], tmp_path: Path, *, engine: Path | str, model: Path | str,
             extra: tuple[str, ...] = ()) -> tuple[int, str]:
    """`h3bridge generate` through the CLI's entry point; (exit status, stderr)."""
    capsys.readouterr()
    status = main(["generate", "-p", "a red fox", *FAST_FLAGS, "-o", str(tmp_path / "out" / "fox.mp4"),
                   "--engine-path", str(engine), "--model-dir", str(model), *extra])
    return status, capsys.readouterr().err


def assert_refused(status: int, err: str, sim_log: Path, tmp_path: Path, *words: str) -> None:  # noqa: F811
    assert status == 2, err
    for word in words:
        assert word in err, (word, err)
    assert "fix:" in err and "Traceback" not in err
    assert sim_invocations(sim_log) == [], "the engine must not start"
    assert not (tmp_path / "out").exists()


def test_a_missing_model_folder_exits_2(tmp_path: Path, sim_log: Path,  # noqa: F811
                                        capsys: pytest.CaptureFixture[str]) -> None:
    status, err = generate(capsys, tmp_path, engine=sim_engine_path(), model=tmp_path / "no-such-model")
    assert_refused(status, err, sim_log, tmp_path, "no-such-model", "does not exist")


def test_a_model_path_that_is_a_file_exits_2(tmp_path: Path, sim_log: Path,  # noqa: F811
                                             capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"\0" * 64)
    status, err = generate(capsys, tmp_path, engine=sim_engine_path(), model=model)
    # issue 30: say what the file is (a repack checkpoint) and the download that gives a model folder
    assert_refused(status, err, sim_log, tmp_path, str(model), "single-file checkpoint", "not a ComfyUI-style repack",
                   "model download DIR")


def test_no_model_folder_at_all_exits_2_naming_the_flag(tmp_path: Path, sim_log: Path,  # noqa: F811
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    status = main(["generate", "-p", "fox", *FAST_FLAGS, "-o", str(tmp_path / "out" / "x.mp4"),
                   "--engine-path", str(sim_engine_path())])
    err = capsys.readouterr().err
    assert_refused(status, err, sim_log, tmp_path, "no MiniMax-H3 model directory given", "--model-dir")
    assert "model_dir" not in err


def test_an_incomplete_model_exits_2(tiny: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tiny / "FL2VA/transformer/config.json").unlink()
    status, err = generate(capsys, tmp_path, engine=sim_engine_path(), model=tiny)
    assert_refused(status, err, sim_log, tmp_path, "FL2VA/transformer/config.json")


def test_a_damaged_shard_exits_2(tiny: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                 capsys: pytest.CaptureFixture[str]) -> None:
    shard = sorted((tiny / "FL2VA/transformer").glob("*.safetensors"))[0]
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size - 8)
    status, err = generate(capsys, tmp_path, engine=sim_engine_path(), model=tiny)
    assert_refused(status, err, sim_log, tmp_path, shard.name, "truncated")


def test_a_missing_engine_exits_2_with_the_build_hint(tiny: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    status, err = generate(capsys, tmp_path, engine=tmp_path / "bin" / "h3", model=tiny)
    assert_refused(status, err, sim_log, tmp_path, "does not exist", "github.com/antirez/h3.c", "h3-sim",
                   "--engine-path")
    assert "engine_path" not in err      # the library's field name, not a CLI word


def test_an_engine_that_is_not_executable_exits_2(tiny: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    engine = tmp_path / "h3"
    engine.write_text("#!/bin/sh\nexit 0\n")
    engine.chmod(0o644)
    status, err = generate(capsys, tmp_path, engine=engine, model=tiny)
    assert_refused(status, err, sim_log, tmp_path, "not executable", f"chmod +x {engine}")


def test_a_folder_given_as_the_engine_says_it_is_a_folder(tiny: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "tools"
    folder.mkdir()
    status, err = generate(capsys, tmp_path, engine=folder, model=tiny)
    assert_refused(status, err, sim_log, tmp_path, f"is a folder with no h3 program in it: {folder}",
                   "give the h3 program itself")
    assert "does not exist" not in err
    # An h3.c checkout that was never built: the fix is build-engine on it (issue 30: not a bare `make`).
    (folder / "h3.c").write_text("/* h3 */\n")
    (folder / "Makefile").write_text("all:\n")
    status, err = generate(capsys, tmp_path, engine=folder, model=tiny)
    assert_refused(status, err, sim_log, tmp_path, "is a folder", "never built", f"build-engine {folder}`",
                   "checkout 8974cc0")
    assert "`make`" not in err


def test_a_memory_plan_that_does_not_fit_exits_2(tmp_path: Path, sim_log: Path,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    realistic = write_fixture_model(tmp_path / "real" / "MiniMax-H3", realistic=True, ref2va=False)
    monkeypatch.setattr(MachineFacts, "detect", classmethod(lambda cls: MachineFacts.mac(24, "Apple M4 Pro")))
    capsys.readouterr()
    status = main(["generate", "-p", "fox", "--quiet", "-o", str(tmp_path / "out" / "fox.mp4"),
                   "--engine-path", str(sim_engine_path()), "--model-dir", str(realistic)])
    err = capsys.readouterr().err
    assert_refused(status, err, sim_log, tmp_path, "does not fit", "--ssd-streaming", "--force")


@pytest.mark.parametrize("quiet", [False, True])
def test_a_memory_refusal_says_does_not_fit_once_and_quiet_prints_no_plan(
        quiet: bool, tmp_path: Path, sim_log: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    realistic = write_fixture_model(tmp_path / "real" / "MiniMax-H3", realistic=True, ref2va=False)
    monkeypatch.setattr(MachineFacts, "detect", classmethod(lambda cls: MachineFacts.mac(24, "Apple M4 Pro")))
    capsys.readouterr()
    status = main(["generate", "-p", "fox", *(["--quiet"] if quiet else []), "-o", str(tmp_path / "out" / "fox.mp4"),
                   "--engine-path", str(sim_engine_path()), "--model-dir", str(realistic)])
    err = capsys.readouterr().err
    assert_refused(status, err, sim_log, tmp_path, "does not fit", "--ssd-streaming", "--force")
    assert err.count("does not fit") == 1, err
    assert ("sizes from:" in err) is (not quiet), err     # the plan's table
    assert "force=True" not in err


def test_library_wording_is_in_cli_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's refusals carry their fixes as data (h3bridge.fixes); the CLI says them as flags."""
    from h3bridge.cli.main import cli_error_text
    from h3bridge.engines.library import LIBRARY_ENV, locate_library
    from h3bridge.errors import H3BridgeError
    from h3bridge.takes import check_take_outputs, sheet_output
    sheet_output(tmp_path / "out.mp4").write_bytes(b"a sheet")
    with pytest.raises(H3BridgeError) as taken:
        check_take_outputs(tmp_path / "out.mp4", 2, overwrite=False)
    assert cli_error_text(taken.value).endswith("fix: choose another name, or allow overwriting (--overwrite)")
    monkeypatch.delenv(LIBRARY_ENV, raising=False)
    with pytest.raises(H3BridgeError) as missing:
        locate_library(None)
    assert "fix: pass --library-path PATH or set H3_LIBRARY" in cli_error_text(missing.value)


def test_the_console_script_exits_2_too(tmp_path: Path) -> None:
    """The same through a real process (`python -m h3bridge.cli`), as a shell script sees it."""
    folder = tmp_path / "h3.c"
    folder.mkdir()
    done = subprocess.run([sys.executable, "-m", "h3bridge.cli", "generate", "-p", "x", "--engine-path",
                           str(folder), "--model-dir", str(tmp_path / "missing")], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k not in ("H3_BIN", "H3_MODEL_DIR")})
    assert done.returncode == 2 and "is a folder" in done.stderr and "Traceback" not in done.stderr


def test_a_job_that_ran_and_failed_still_exits_1(tiny: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("H3_SIM_FAIL_PHASE", "denoise")
    status, err = generate(capsys, tmp_path, engine=sim_engine_path(), model=tiny)
    assert status == 1 and "h3 failed" in err and len(sim_invocations(sim_log)) == 1


def test_a_program_that_is_not_h3_is_named_as_such(tiny: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`--engine-path /bin/true` said "h3 reported success but wrote no MP4"."""
    true = tmp_path / "true"
    true.write_text("#!/bin/sh\nexit 0\n")
    true.chmod(0o755)
    status, err = generate(capsys, tmp_path, engine=true, model=tiny)
    assert status == 1
    assert f"the engine {true} exited without an error, an MP4 or any of h3's progress output: it does not " \
           "look like h3" in err and "--engine-path" in err and "h3 reported success" not in err


@pytest.mark.skipif(sys.platform == "darwin", reason="the hint for a machine that cannot run the real h3")
def test_the_missing_engine_hint_off_a_mac_offers_the_demo(tiny: Path, tmp_path: Path, sim_log: Path,  # noqa: F811
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    capsys.readouterr()
    status = main(["generate", "-p", "a red fox", *FAST_FLAGS, "-o", str(tmp_path / "out" / "fox.mp4"),
                   "--model-dir", str(tiny)])
    err = capsys.readouterr().err
    assert_refused(status, err, sim_log, tmp_path, "the h3 engine was not found", "`h3bridge demo`")
