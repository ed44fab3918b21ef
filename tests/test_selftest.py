"""`h3bridge selftest` (issue 33): every engine checked end to end against h3-sim and against
upstream's own h3/libh3, the report (flags, privacy), the calibration feeding the ETA and the
preset advice, and a Ctrl-C that leaves nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from core_helpers import model_dir  # noqa: F401 (fixture)
from double_helpers import double_library_path
from h3bridge.cli import main as cli_main
from h3bridge.geometry import video_latent_t
from h3bridge.history.calibration import (Calibration, CalibrationEntry, calibrated_phase_seconds, load_calibration,
                                          preset_advice, preset_table, save_calibration)
from h3bridge.history.recorder import JobRecorder
from h3bridge.history.store import HistoryStore
from h3bridge.progress import ProgressEvent
from h3bridge.request import GenerationRequest
from h3bridge.result import GenerationResult
from h3bridge.selftest.report import Report, Status, shareable
from h3bridge.engines.scratch import WORKDIR_PREFIX
from h3bridge.selftest.runs import PROMPT, Rendered, make_plan, takes_pause, time_check
from h3bridge.upstream_costs import expected_phases
from h3bridge.vocabulary import EngineKind
from remote_helpers import key, start_server  # noqa: F401 (fixture)
from upstream_helpers import realistic_model, upstream_engine  # noqa: F401 (fixtures)

ENGINES = ("one-shot", "session", "library")


def sim_engine() -> str:
    import shutil
    path = shutil.which("h3-sim")
    if path is None:
        pytest.skip("h3-sim console script not installed (pip install -e .)")
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = cli_main(["selftest", *args])
    return status, capsys.readouterr().err


def _one_folder(parent: Path) -> Path:
    folders = [path for path in parent.iterdir() if path.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


def _assert_every_engine_checked(report: dict, engines: tuple[str, ...]) -> None:
    lines = {check["name"]: check for check in report["checks"]}
    for engine in engines:
        for what in ("smallest", "mid"):
            assert lines[f"{engine} {what} render"]["status"] == "pass", lines[f"{engine} {what} render"]
            assert lines[f"{engine} {what} memory"]["status"] in ("pass", "slower than planned")
            assert lines[f"{engine} {what} memory"]["figures"]["peak"]["measured"] > 0
            assert lines[f"{engine} {what} time"]["status"] in ("pass", "slower than planned")
            assert "denoise loop" in lines[f"{engine} {what} time"]["figures"]
        for point in ("silent phase", "denoise", "FFmpeg"):
            check = lines[f"{engine} cancel in {point}"]
            assert check["status"] == "pass", check
            assert check["figures"]["leftovers"] == []
        pause = lines[f"{engine} pause and resume"]     # every engine takes a pause (engines/child.py)
        assert pause["status"] == "pass", pause
        assert pause["figures"]["paused_seconds"] > 0 and pause["figures"]["leftovers"] == []
        assert pause["figures"]["engine_stopped_while_paused"] is True and pause["figures"]["paused_reported"] is True
    # the library engine gives previews: one per step counted; the others say they give none
    assert lines["library mid previews"]["figures"]["per_step"] == [1, 1, 1, 1]
    assert lines["one-shot mid previews"]["status"] == "skipped"


def test_selftest_runs_every_engine_against_h3_sim(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch, model_dir: Path) -> None:  # noqa: F811
    """End to end: facts, both renders, three cancels and the pause check per engine, the report in
    one folder with nothing private, the calibration stored, the user's history untouched."""
    library = double_library_path()       # built (or found) in the real cache before HOME moves
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    model = home / "models" / "MiniMax-H3"
    model.symlink_to(model_dir, target_is_directory=True)
    monkeypatch.setenv("HOME", str(home))
    out = tmp_path / "out"
    status, err = _run(capsys, "--engine-path", sim_engine(), "--model-dir", str(model), "--library-path",
                       str(library), "--output-dir", str(out))
    assert status == 0, err
    assert "budget about" in err.splitlines()[0]          # said before anything runs
    folder = _one_folder(out)
    assert sorted(path.name for path in folder.iterdir()) == ["report.json", "report.md"]   # renders removed
    report = json.loads((folder / "report.json").read_text())
    markdown = (folder / "report.md").read_text()
    _assert_every_engine_checked(report, ENGINES)
    facts = report["facts"]
    for fact in ("chip", "memory", "os", "h3bridge", "engine", "h3 build", "h3 commit",
                 "h3 commit is the pinned one", "libh3", "ffmpeg", "model"):
        assert fact in facts, fact
    assert facts["h3 build"].startswith("h3-sim") and facts["h3 commit is the pinned one"] is None   # not an h3 build
    assert facts["libh3"] is not None and facts["ffmpeg"] is not None
    lines = {check["name"]: check for check in report["checks"]}
    for found in ("engine found", "libh3 found", "ffmpeg found", "model found"):
        assert lines[found]["status"] == "pass", lines[found]
    assert lines["model verify"]["status"] == "pass" and lines["model verify"]["figures"]["checksums"] is False
    assert report["facts"]["model"] == "~/models/MiniMax-H3"       # the home folder shortened
    assert str(home) not in markdown and str(home) not in json.dumps(report)
    for check in report["checks"]:       # one line per check in the Markdown
        assert f"- {check['status']}: {check['name']}: " in markdown
    assert PROMPT not in json.dumps(report)       # not even the selftest's own prompt is needed
    calibration = load_calibration(engine="one-shot")
    assert calibration is not None and {(e.width, e.height) for e in calibration.entries} == {(32, 32), (640, 352)}
    assert HistoryStore().recent_jobs() == []       # the renders were not the user's jobs
    # the example report under docs/ is one of this code's: the same checks, facts and fields
    example = json.loads((Path(__file__).resolve().parents[1] / "docs" / "selftest-example" / "report.json")
                         .read_text())
    assert list(example) == list(report) and list(example["facts"]) == list(report["facts"])
    assert [check["name"] for check in example["checks"]] == [check["name"] for check in report["checks"]]
    assert [sorted(check["figures"]) for check in example["checks"]] == \
        [sorted(check["figures"]) for check in report["checks"]]


def test_quick_does_the_smallest_render_with_one_engine(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        model_dir: Path) -> None:  # noqa: F811
    status, err = _run(capsys, "--quick", "--checksums", "--engine-path", sim_engine(), "--model-dir",
                       str(model_dir), "--output-dir", str(tmp_path))
    assert status == 0, err
    report = json.loads((_one_folder(tmp_path) / "report.json").read_text())
    renders = [check["name"] for check in report["checks"] if check["name"].endswith(" render")]
    assert renders == ["one-shot smallest render"]
    verify = next(check for check in report["checks"] if check["name"] == "model verify")
    assert verify["status"] == "pass" and verify["figures"]["checksums"] is True    # on request
    assert verify["detail"].startswith("headers and checksums: ")
    assert report["facts"]["run"] == "quick"
    calibration = next(check for check in report["checks"] if check["name"] == "calibration")
    assert calibration["status"] == "skipped" and "too small to time a denoise step" in calibration["detail"]
    assert load_calibration() is None       # a 32x32 step calibrates nothing


def test_no_calibrate_stores_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                     model_dir: Path) -> None:  # noqa: F811
    status, err = _run(capsys, "--engine", "one-shot", "--engine-path", sim_engine(), "--model-dir", str(model_dir),
                       "--output-dir", str(tmp_path), "--no-calibrate")
    assert status == 0, err
    report = json.loads((_one_folder(tmp_path) / "report.json").read_text())
    assert "one-shot mid render" in {check["name"] for check in report["checks"]}
    assert "calibration" not in {check["name"] for check in report["checks"]}
    assert load_calibration() is None


def test_a_missing_library_engine_is_refused_before_anything_runs(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path, model_dir: Path,  # noqa: F811
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("H3_LIBRARY", raising=False)
    status, err = _run(capsys, "--engine", "library", "--engine-path", sim_engine(), "--model-dir", str(model_dir),
                       "--output-dir", str(tmp_path / "out"))
    assert status == 2
    assert "library engine cannot run: no libh3 was found" in err
    assert not (tmp_path / "out").exists()


def test_a_given_path_or_url_that_is_wrong_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A path the caller named is refused as `generate` refuses it (a missing one only looked for is a
    report line): no run folder, nothing run."""
    from h3bridge.errors import H3BridgeError
    from h3bridge.selftest import SelftestOptions, run_selftest
    out = tmp_path / "out"
    cases = {"model_dir": SelftestOptions(engine_path=sim_engine(), model_dir=tmp_path / "no-model", output_dir=out),
             "engine_path": SelftestOptions(engine_path=tmp_path / "no-h3", output_dir=out),
             "remote_url": SelftestOptions(engine_path=sim_engine(), remote_url="not a url", output_dir=out)}
    for field, options in cases.items():
        with pytest.raises(H3BridgeError) as refused:
            run_selftest(options)
        assert refused.value.hint, field
        if field == "remote_url":
            assert refused.value.field == "remote_url", refused.value
            assert "not a URL" in refused.value.message or "not an http" in refused.value.message
    assert not out.exists()


def test_selftest_against_upstreams_own_h3_and_libh3(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                     upstream_engine, realistic_model: Path) -> None:  # noqa: F811
    """Upstream's C built by build-engine (one-shot, session, library) on the full-shape fixture.
    The mid canvas is made smaller: upstream's portable backend computes on this machine's CPU."""
    from h3bridge.selftest import SelftestOptions, run_selftest
    outcome = run_selftest(SelftestOptions(engine_path=upstream_engine.program, model_dir=realistic_model,
                                           library_path=upstream_engine.library, output_dir=tmp_path,
                                           mid_canvas=(128, 96)))
    report = outcome.report.as_json()
    _assert_every_engine_checked(report, ENGINES)
    assert report["facts"]["h3 commit is the pinned one"] is True
    assert outcome.calibrated


# ----------------------------------------------------------------------------- the report's flags

def _rendered_at(share: float) -> Rendered:
    """A finished render whose every phase took `share` times the plan's seconds."""
    request = GenerationRequest("planted", width=640, height=352, frames=22, steps=4).validate()
    timings = {phase: seconds * share for phase, seconds in expected_phases(request, writes_mp4=True).items()
               if phase != "denoise"}         # the loop reported once, under "denoise enqueue"
    result = GenerationResult(request=request, video_path=None, frames=None, audio=None, width=640, height=352,
                              frame_count=22, seed=0, timings=timings)
    from h3bridge.selftest.measure import ProgressLog
    return Rendered(EngineKind.ONE_SHOT, "mid", request, result, ProgressLog(), None, wall=1.0)


def test_a_measurement_20_percent_above_the_plan_is_flagged() -> None:
    check = time_check("one-shot mid", _rendered_at(1.2))
    assert check.status is Status.SLOWER
    assert "denoise loop" in " ".join(check.flags) and "total" in " ".join(check.flags)
    assert all("20 % above the plan's" in flag for flag in check.flags)
    assert abs(check.figures["total"]["gap"] - 0.2) < 1e-9
    report = Report(facts={}, checks=[check])
    assert "- slower than planned: one-shot mid time: " in report.markdown()


def test_a_measurement_within_10_percent_is_not_flagged() -> None:
    check = time_check("one-shot mid", _rendered_at(1.05))
    assert check.status is Status.PASS and check.flags == []
    assert "within 10 % of the plan" in check.detail


def test_the_report_shortens_the_home_folder() -> None:
    value = {"model": "/Users/ana/models/MiniMax-H3", "list": ["/Users/ana/h3"], "other": "/opt/h3"}
    assert shareable(value, "/Users/ana") == {"model": "~/models/MiniMax-H3", "list": ["~/h3"], "other": "/opt/h3"}


# ----------------------------------------------------------------------------- calibration

def _entries(ratio: float) -> list[CalibrationEntry]:
    """Measured seconds per step `ratio` times the cost model's, at two canvases; the rest as planned."""
    entries = []
    for width, height in ((32, 32), (640, 352)):
        request = GenerationRequest("c", width=width, height=height, frames=22, steps=4).validate()
        planned = expected_phases(request, writes_mp4=True)
        loop = planned["denoise"]
        other = sum(s for p, s in planned.items() if p not in ("denoise", "denoise enqueue"))
        entries.append(CalibrationEntry(engine="one-shot", width=width, height=height, frame_count=22, steps=4,
                                        layers=50, seconds_per_step=ratio * loop / 4, planned_seconds_per_step=loop / 4,
                                        other_seconds=other, planned_other_seconds=other, run=f"run-{ratio}"))
    return entries


def _first_eta(store: HistoryStore) -> float | None:
    request = GenerationRequest("eta", width=864, height=480, frames=56, steps=20).validate()
    recorder = JobRecorder.begin("one-shot", request, None, store=store)
    seen: list[ProgressEvent] = []
    recorder.progress_callback(seen.append)(ProgressEvent("tokenizer", 1, 1, 0.0, 0.0))
    return seen[0].eta


def test_calibrated_seconds_per_step_change_the_eta_and_the_preset_advice(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "history.sqlite")
    assert _first_eta(store) is None            # no past runs, no calibration: no estimate
    uncalibrated = preset_advice(None)
    save_calibration(_entries(1.0), store=store)
    as_planned = _first_eta(store)
    table_as_planned = preset_table(load_calibration(store=store))
    save_calibration(_entries(3.0), store=store)       # a newer selftest: denoising three times slower
    slower = _first_eta(store)
    calibration = load_calibration(store=store)
    request = GenerationRequest("eta", width=864, height=480, frames=56, steps=20).validate()
    assert calibration is not None and abs(calibration.step_ratio(request) - 3.0) < 1e-9
    table_slower = preset_table(calibration)
    assert as_planned is not None and slower is not None
    loop = expected_phases(request, writes_mp4=False)["denoise"]
    assert abs((slower - as_planned) - 2 * loop) < 0.01 * loop      # only the denoise loop tripled
    for preset, row in table_slower.items():
        for seconds, predicted in row.items():
            assert predicted > table_as_planned[preset][seconds]
    advice = preset_advice(calibration)
    assert advice != uncalibrated and "takes here" in advice and "balanced" in advice


def test_a_steps_fixed_part_is_not_scaled_with_the_canvas() -> None:
    """A step of a fixed 0.5 s plus 1 ms per video row, measured at 32x32 and 640x352: a larger
    clip is predicted on that line, not by either canvas's ratio to the cost model (the smallest's
    is nearly all fixed part, and scaled up it would predict many times the real time)."""
    fixed, per_row = 0.5, 0.001
    entries = []
    for width, height in ((32, 32), (640, 352)):
        request = GenerationRequest("c", width=width, height=height, frames=22, steps=4).validate()
        rows = video_latent_t(22) * (width // 32) * (height // 32)
        planned = expected_phases(request, writes_mp4=True)["denoise"] / 4
        entries.append(CalibrationEntry(engine="one-shot", width=width, height=height, frame_count=22, steps=4,
                                        layers=50, seconds_per_step=fixed + per_row * rows,
                                        planned_seconds_per_step=planned, other_seconds=1.0,
                                        planned_other_seconds=1.0))
    calibration = Calibration(tuple(entries))
    clip = GenerationRequest("eta", width=864, height=480, frames=56, steps=20).validate()
    rows = video_latent_t(56) * (864 // 32) * (480 // 32)
    predicted = calibrated_phase_seconds(clip, calibration, writes_mp4=True)["denoise"]
    assert abs(predicted - 20 * (fixed + per_row * rows)) < 1e-6 * predicted
    fewer = GenerationRequest("eta", width=864, height=480, frames=56, steps=20, layers=40).validate()
    assert abs(calibration.seconds_per_step(rows, 40) - (fixed + per_row * rows) * 40 / 50) < 1e-9
    assert abs(calibrated_phase_seconds(fewer, calibration)["denoise"] - predicted * 40 / 50) < 1e-6 * predicted
    # below the smallest canvas measured (fewer rows than any legal request has): the smallest's seconds
    assert abs(calibration.seconds_per_step(1, 50) - (fixed + per_row * entries[0].rows)) < 1e-9


def test_a_simulators_calibration_is_not_a_real_engines(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "history.sqlite")
    entries = [CalibrationEntry(**{**vars(entry), "engine_path": "/venv/bin/h3-sim"}) for entry in _entries(0.01)]
    save_calibration(entries, store=store)
    assert load_calibration(store=store, engine_path="/opt/h3/h3") is None
    assert load_calibration(store=store, engine_path="/other/bin/h3-sim") is not None


def test_the_pause_check_follows_the_engines_capability() -> None:
    class WithPause:
        def generate(self, request, output=None, *, pause=None): ...

    class Without:
        def generate(self, request, output=None, *, cancel=None): ...

    assert takes_pause(WithPause()) and not takes_pause(Without())


class _PauseIgnoringEngine:
    """Takes a `pause` but neither stops its process nor says it paused: the check must fail it."""

    def generate(self, request, output, *, want_frames, want_audio, on_progress, cancel, pause):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            on_progress(ProgressEvent("denoise", 1, request.steps, 0.5, 0.1))
            assert pause.wait_until_resumed(timeout=30)      # runs on through the pause
        finally:
            child.kill()
            child.wait()
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_bytes(b"mp4")
        return GenerationResult(request=request, video_path=Path(output), frames=None, audio=None,
                                width=request.width, height=request.height, frame_count=request.frame_count,
                                seed=0, timings={})

    def close(self) -> None:
        pass


def test_a_pause_the_engine_ignores_fails_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from h3bridge.cancel import CancelToken
    from h3bridge.selftest import runs
    from h3bridge.selftest.facts import Found
    monkeypatch.setattr(runs, "PROCESS_GONE_SECONDS", 0.5)
    context = runs.Context(found=Found(), folder=tmp_path / "run", cancel=CancelToken())
    monkeypatch.setattr(context, "open", lambda kind: _PauseIgnoringEngine())
    request = GenerationRequest(PROMPT, width=640, height=352, frames=22, steps=4).validate()
    check = runs.pause_check(context, EngineKind.ONE_SHOT, request)
    assert check.status is Status.FAIL, check
    assert "paused, yet the engine's processes kept running" in check.detail
    assert "the engine sent no `paused` progress event" in check.detail
    assert check.figures["engine_stopped_while_paused"] is False and check.figures["paused_seconds"] > 0
    assert check.figures["leftovers"] == []          # its process was ended and its clip kept


# ----------------------------------------------------------------------------- Ctrl-C

def test_ctrl_c_leaves_nothing(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    """Ctrl-C during a render: exit 130, the engine gone, no run folder, no calibration."""
    hung = tmp_path / "hung"
    out = tmp_path / "out"
    command = [sys.executable, "-m", "h3bridge", "selftest", "--engine-path", sim_engine(), "--model-dir",
               str(model_dir), "--output-dir", str(out)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                               env={**os.environ, "H3_SIM_HANG_PHASE": "denoise enqueue:1",
                                    "H3_SIM_HANG_NOTICE": str(hung)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not hung.exists():
            assert process.poll() is None, "the selftest ended before the engine hung"
            time.sleep(0.01)
        assert hung.exists(), "the engine never reached the denoise phase"
        engine_pid = int(hung.read_text().split()[0])
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "selftest cancelled" in stderr
    assert not psutil.pid_exists(engine_pid) or psutil.Process(engine_pid).status() == psutil.STATUS_ZOMBIE
    assert list(out.iterdir()) == []          # the run's folder is gone with everything in it
    scratch = f"{WORKDIR_PREFIX}{process.pid}-"     # the engines' temporary folders of that process
    assert [name for name in os.listdir(tempfile.gettempdir()) if name.startswith(scratch)] == []
    assert load_calibration() is None


def test_the_default_runs_budget_is_the_one_the_docs_state() -> None:
    """The budget said before a run starts, for the three local engines, is the docs' figure."""
    plan = make_plan([EngineKind.ONE_SHOT, EngineKind.SESSION, EngineKind.LIBRARY], quick=False)
    minutes = round(plan.budget_seconds() / 60)
    docs = (Path(__file__).resolve().parents[1] / "docs" / "selftest.md").read_text()
    assert f"(about {minutes} minutes: {len(plan.renders())} renders with three engines)" in " ".join(docs.split())
    quick = make_plan([EngineKind.ONE_SHOT, EngineKind.SESSION], quick=True)
    assert [what for _, what, _ in quick.renders()] == ["smallest"] and quick.budget_seconds() < 60


def test_selftest_checks_a_remote_engine(capsys: pytest.CaptureFixture[str], tmp_path: Path, key: str,
                                         model_dir: Path) -> None:  # noqa: F811
    """--remote URL: the remote engine rendered, cancelled and read back like the others; its memory is
    the server's (skipped, saying so) and it calibrates nothing of this machine."""
    server = start_server(tmp_path / "server", model_dir)
    try:
        status, err = _run(capsys, "--engine", "remote", "--remote", server.url, "--engine-path", sim_engine(),
                           "--model-dir", str(model_dir), "--output-dir", str(tmp_path / "out"))
    finally:
        server.stop()
    assert status == 0, err
    report = json.loads((_one_folder(tmp_path / "out") / "report.json").read_text())
    lines = {check["name"]: check for check in report["checks"]}
    assert report["facts"]["engines"] == ["remote"]
    assert lines["remote mid render"]["status"] == "pass"
    assert lines["remote mid memory"]["status"] == "skipped" and "server" in lines["remote mid memory"]["detail"]
    assert [lines[f"remote cancel in {point}"]["status"] for point in ("silent phase", "denoise", "FFmpeg")] \
        == ["pass"] * 3, [lines[f"remote cancel in {point}"] for point in ("silent phase", "denoise", "FFmpeg")]
    pause = lines["remote pause and resume"]        # through the server's job (its processes are the server's)
    assert pause["status"] == "pass", pause
    assert pause["figures"]["paused_seconds"] > 0 and pause["figures"]["leftovers"] == []
    assert lines["calibration"]["status"] == "skipped"


def test_stats_and_doctor_show_the_calibration(capsys: pytest.CaptureFixture[str], model_dir: Path) -> None:  # noqa: F811
    assert cli_main(["stats"]) == 0
    before = capsys.readouterr().out
    assert "calibration: none yet" in before and "the reference Mac (M1 Ultra)" in before
    # measured by a selftest of the simulator: doctor of the simulator reads it (a real h3's would not)
    save_calibration([CalibrationEntry(**{**vars(entry), "engine_path": sim_engine()}) for entry in _entries(2.0)])
    assert cli_main(["stats"]) == 0
    shown = capsys.readouterr().out
    assert "calibration: " in shown and "per step at 640x352 (one-shot engine" in shown
    assert "this machine (selftest calibration)" in shown and "15 s clip" in shown
    cli_main(["doctor", "--json", "--engine-path", sim_engine(), "--model-dir", str(model_dir)])
    speed = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}["speed"]
    assert speed["ok"] and speed["detail"].startswith("calibrated: ") and "takes here" in speed["detail"]


def test_an_output_dir_that_is_a_file_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    status, err = _run(capsys, "--quick", "--output-dir", str(taken))
    assert status == 2
    assert f"--output-dir {taken} is not a folder" in err and "leave --output-dir out" in err
    assert taken.read_text() == "mine"
