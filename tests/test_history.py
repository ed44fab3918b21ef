"""The job history (h3bridge/history): what the one-shot and session engines record over h3-sim,
the ETA from past runs, and a broken or locked history file never failing a render."""
from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from core_helpers import fast_request, sim_engine_path
from h3bridge.sim.fixture import write_fixture_model
from h3bridge import CancelToken, EngineError, GenerationCancelled, OneShotEngine, OutputExistsError, ProgressEvent
from h3bridge.engines.session import SessionEngine
from h3bridge.history import HistoryStore, local_device, shape_key
from h3bridge.history import store as store_module
from h3bridge.history.stats import FINISHING
from h3bridge.history.store import CANCELLED, COMPLETED, FAILED, INTERRUPTED, RUNNING, JobEnd, NewJob, history_path
from h3bridge.progress import PHASE_ORDER, WAITING_PHASE

T2VA_PHASES = ["tokenizer", "text encoder", "refine text", "precompute AdaLN", "load transformer core",
               "denoise enqueue", "denoise", "audio VAE", "video VAE load", "FFmpeg"]


@pytest.fixture(scope="module")
def sim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny fixture model for h3-sim (h3bridge/sim/fixture.py)."""
    return write_fixture_model(tmp_path_factory.mktemp("model") / "MiniMax-H3")


@pytest.fixture(autouse=True)
def _private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The session's h3 gets its HOME in the cache directory (session_home): a private one here.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "home" / "cache"))


@pytest.fixture(params=["one-shot", "session"])
def engine(request: pytest.FixtureRequest, sim_model: Path):
    if request.param == "one-shot":
        yield OneShotEngine(sim_engine_path(), sim_model)
    else:
        with SessionEngine(sim_engine_path(), sim_model) as session:
            yield session


def engine_name(engine) -> str:
    return "session" if isinstance(engine, SessionEngine) else "one-shot"


def only_job(store: HistoryStore | None = None):
    rows = (store or HistoryStore()).recent_jobs()
    assert len(rows) == 1, rows
    return rows[0]


def history_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "h3bridge.history" and record.levelno == logging.WARNING]


# ----------------------------------------------------------------------------- recording


def test_conftest_points_every_test_at_a_history_file_of_its_own(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = history_path()
    assert path is not None and path.name == "history.sqlite"
    assert Path(tmp_path_factory.getbasetemp()) in path.parents


def test_a_completed_job_is_recorded_with_its_request_device_and_phases(engine, tmp_path: Path) -> None:
    request = fast_request("a red fox runs through snow", seed=7)
    output = tmp_path / "out" / "fox.mp4"
    result = engine.generate(request, output)
    row = only_job()
    assert row.outcome == COMPLETED and row.status() == COMPLETED and row.message is None
    assert row.engine == engine_name(engine) and row.engine_path == str(engine.engine_path)
    assert row.device == local_device() and row.device.memory_bytes and row.device.memory_bytes > 0
    assert row.shape == shape_key(request) == "96x64 22f 2 steps"
    assert row.request["prompt"] == "a red fox runs through snow" and row.request["seed"] == 7
    assert row.request["frame_count"] == 22 and row.output == str(output)
    assert row.pid == os.getpid() and row.finished_at is not None and row.finished_at >= row.started_at
    # Every upstream phase the job ran, in the order it ran, with the engine's own seconds.
    assert [p for p in row.phases if p in PHASE_ORDER] == T2VA_PHASES
    for phase in T2VA_PHASES:
        assert row.phases[phase] == pytest.approx(result.timings[phase])
    assert all(seconds >= 0 for seconds in row.phases.values()) and FINISHING in row.phases
    assert row.total_seconds is not None and row.total_seconds >= sum(result.timings[p] for p in T2VA_PHASES)
    assert row.waited_seconds == 0.0


def test_a_failed_job_is_recorded_with_h3s_message_and_the_phases_it_ran(engine, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_FAIL_PHASE", "audio VAE")
    monkeypatch.setenv("H3_SIM_FAIL_MESSAGE", "Metal command buffer failed: simulated")
    with pytest.raises(EngineError) as raised:
        engine.generate(fast_request(), tmp_path / "fail.mp4")
    row = only_job()
    assert row.outcome == FAILED and row.error_type == type(raised.value).__name__
    assert row.message == raised.value.message and "Metal command buffer failed: simulated" in row.message
    assert row.engine_message == raised.value.engine_message == "Metal command buffer failed: simulated"
    # Timed from the progress events: every phase up to the one it failed in, none after it.
    assert list(row.phases) == T2VA_PHASES[:T2VA_PHASES.index("audio VAE") + 1]
    assert all(seconds >= 0 for seconds in row.phases.values())
    assert sum(row.phases.values()) <= row.total_seconds


def test_a_cancelled_job_is_recorded_as_cancelled(engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_SIM_HANG_PHASE", "denoise")      # hold the engine inside the loop
    token = CancelToken()

    def on_progress(event: ProgressEvent) -> None:
        if event.phase == "denoise":
            threading.Thread(target=token.cancel).start()
    with pytest.raises(GenerationCancelled):
        engine.generate(fast_request(), tmp_path / "cancelled.mp4", on_progress=on_progress, cancel=token)
    row = only_job()
    assert row.outcome == CANCELLED and row.error_type == "GenerationCancelled" and row.message
    assert list(row.phases)[-1] == "denoise" and "load transformer core" in row.phases
    assert FINISHING not in row.phases


def test_a_refused_request_leaves_no_row(tmp_path: Path, sim_model: Path) -> None:
    engine = OneShotEngine(sim_engine_path(), sim_model)
    existing = tmp_path / "existing.mp4"
    existing.write_bytes(b"the user's clip")
    with pytest.raises(OutputExistsError):
        engine.generate(fast_request(), existing)
    with pytest.raises(Exception):
        engine.generate(fast_request(frames=23), tmp_path / "x.mp4")
    assert HistoryStore().recent_jobs() == []
    assert existing.read_bytes() == b"the user's clip"


def test_waiting_for_the_engine_is_recorded_apart_from_the_phases(tmp_path: Path, sim_model: Path) -> None:
    from h3bridge.engines.lock import engine_lock
    engine = OneShotEngine(sim_engine_path(), sim_model)
    waiting = threading.Event()
    results: list[object] = []

    def on_progress(event: ProgressEvent) -> None:
        if event.phase == WAITING_PHASE:
            waiting.set()

    def render() -> None:
        results.append(engine.generate(fast_request(), tmp_path / "w.mp4", on_progress=on_progress))
    with engine_lock():
        worker = threading.Thread(target=render)
        worker.start()
        assert waiting.wait(30)
    worker.join(60)
    assert results
    row = only_job()
    assert row.outcome == COMPLETED and row.waited_seconds > 0 and WAITING_PHASE not in row.phases


def test_a_job_whose_process_died_shows_as_interrupted(tmp_path: Path) -> None:
    store = HistoryStore()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    job_id = store.start_job(NewJob(engine="one-shot", device=local_device(), shape="96x64 22f 2 steps",
                                    request={"prompt": "x"}, pid=int(dead.stdout), pid_started=1.0))
    mine = store.start_job(NewJob(engine="one-shot", device=local_device(), shape="96x64 22f 2 steps",
                                  request={"prompt": "y"}, pid=os.getpid(),
                                  pid_started=__import__("psutil").Process().create_time()))
    statuses = {row.id: row.status() for row in store.recent_jobs()}
    assert statuses == {job_id: INTERRUPTED, mine: RUNNING}


def test_the_history_keeps_the_newest_jobs_and_drops_older_ones_with_their_phases(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "history.sqlite", keep_jobs=5)
    ids = []
    for index in range(12):
        job = NewJob(engine="one-shot", device=local_device(), shape="96x64 22f 2 steps", request={"prompt": str(index)})
        if index % 2:
            ids.append(store.add_job(job, JobEnd(outcome=COMPLETED, phases={"denoise": 1.0}, total_seconds=1.0)))
        else:
            job_id = store.start_job(job)
            store.finish_job(job_id, JobEnd(outcome=FAILED, phases={"denoise": 2.0}, total_seconds=2.0))
            ids.append(job_id)
    rows = store.recent_jobs(limit=100)
    assert [row.id for row in rows] == ids[:-6:-1]
    assert all(row.phases for row in rows)
    with sqlite3.connect(store.path) as connection:
        assert connection.execute("SELECT COUNT(DISTINCT job_id) FROM job_phases").fetchone() == (5,)


def test_a_creation_lock_that_cannot_be_made_is_history_unavailable(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only cache folder refuses the lock file beside the history (root ignores chmod, so
    the refusal is made here): the job gets the history's own error, which a render survives."""
    def refuse(path: str, **_: object) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(store_module, "FileLock", refuse)
    store = HistoryStore(tmp_path / "history.sqlite")
    with pytest.raises(store_module.HistoryUnavailable, match="cannot use the job history .*Permission denied"):
        store.start_job(NewJob(engine="one-shot", device=local_device(), shape="s", request={}))


def test_history_path_env_empty_turns_the_history_off(tmp_path: Path, sim_model: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(store_module.HISTORY_PATH_ENV, "")
    assert history_path() is None
    OneShotEngine(sim_engine_path(), sim_model).generate(fast_request(), tmp_path / "off.mp4")
    assert (tmp_path / "off.mp4").is_file() and history_warnings(caplog) == []
    assert not (tmp_path / "home" / "cache" / "history.sqlite").exists()


# ----------------------------------------------------------------------------- ETA from past runs

def _past_run(store: HistoryStore, shape: str, phases: dict[str, float], *, engine: str = "one-shot",
              device=None) -> None:
    store.add_job(NewJob(engine=engine, device=device or local_device(), shape=shape, request={"prompt": "past"}),
                  JobEnd(outcome=COMPLETED, phases=phases, total_seconds=sum(phases.values())))


def _etas(engine, tmp_path: Path, name: str) -> list[tuple[str, float | None]]:
    seen: list[tuple[str, float | None]] = []
    engine.generate(fast_request(), tmp_path / name, on_progress=lambda e: seen.append((e.phase, e.eta)))
    return seen


def test_progress_carries_an_eta_only_once_the_shape_has_run_here(tmp_path: Path, sim_model: Path) -> None:
    engine = OneShotEngine(sim_engine_path(), sim_model)
    first = _etas(engine, tmp_path, "first.mp4")
    assert first and all(eta is None for _, eta in first)         # no past runs: no estimate
    second = _etas(engine, tmp_path, "second.mp4")                # the first run is a past run now
    assert all(eta is not None and eta >= 0 for _, eta in second)
    assert [eta for _, eta in second] == sorted((eta for _, eta in second), reverse=True)   # never grows
    other_shape = []
    engine.generate(fast_request(frames=39), tmp_path / "other.mp4", on_progress=lambda e: other_shape.append(e.eta))
    assert other_shape and all(eta is None for eta in other_shape)


def test_the_eta_is_the_past_runs_seconds_still_to_go(tmp_path: Path, sim_model: Path) -> None:
    """Past runs of 100 s of text encoder and 300 s of denoising (medians over three): when the
    denoise loop starts, the text encoder is behind and the loop and the rest are ahead."""
    store = HistoryStore()
    shape = shape_key(fast_request())
    for scale in (1.0, 2.0, 0.5):      # medians are the 1.0 run's
        _past_run(store, shape, {"tokenizer": 1.0 * scale, "text encoder": 100.0 * scale,
                                 "denoise enqueue": 290.0 * scale, "denoise": 10.0 * scale, "audio VAE": 5.0 * scale,
                                 "FFmpeg": 4.0 * scale, FINISHING: 2.0 * scale})
    _past_run(store, shape, {"text encoder": 1000.0}, device=type(local_device())("Apple M9 Ultra", 2**40))
    events: dict[str, list[float]] = {}

    def on_progress(event: ProgressEvent) -> None:
        events.setdefault(event.phase, []).append(event.eta)
    OneShotEngine(sim_engine_path(), sim_model).generate(fast_request(), tmp_path / "eta.mp4", on_progress=on_progress)
    # 2 steps: "denoise enqueue" 0/2 starts the loop: 300 s loop (enqueue + the final denoise
    # record, weighed as one) + audio VAE 5 + FFmpeg 4 + finishing 2 remain.
    assert events["denoise enqueue"][0] == pytest.approx(311.0)
    assert events["denoise enqueue"][1] == pytest.approx(161.0)
    assert events["audio VAE"][0] == pytest.approx(11.0)
    assert events["FFmpeg"][-1] == pytest.approx(2.0)


# ----------------------------------------------------------------------------- broken or locked files

def _render_despite_history(tmp_path: Path, sim_model: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.set_level(logging.WARNING, logger="h3bridge.history")
    output = tmp_path / "still-rendered.mp4"
    result = OneShotEngine(sim_engine_path(), sim_model).generate(fast_request(), output)
    assert result.video_path == output and output.stat().st_size > 0
    return history_warnings(caplog)


def test_corrupt_bytes_are_skipped_with_one_warning_and_kept(tmp_path: Path, sim_model: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    path = history_path()
    junk = b"these are not the bytes of an SQLite database\n" * 200
    path.write_bytes(junk)
    [warning] = _render_despite_history(tmp_path, sim_model, caplog)
    assert str(path) in warning and "damaged" in warning and "fix: move that file away" in warning
    assert path.read_bytes() == junk


def test_another_programs_database_is_skipped_with_one_warning_and_untouched(tmp_path: Path, sim_model: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    path = history_path()
    with sqlite3.connect(path) as theirs:
        theirs.execute("CREATE TABLE notes (text TEXT)")
        theirs.execute("INSERT INTO notes VALUES ('mine')")
    theirs.close()
    before = path.read_bytes()
    [warning] = _render_despite_history(tmp_path, sim_model, caplog)
    assert "is not an h3bridge job history" in warning and "notes" in warning
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_a_newer_schema_is_skipped_with_one_warning(tmp_path: Path, sim_model: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    path = history_path()
    HistoryStore().forget_job(0)       # creates an empty history of ours
    with sqlite3.connect(path) as connection:
        connection.execute(f"PRAGMA user_version = {store_module.SCHEMA_VERSION + 1}")
    connection.close()
    [warning] = _render_despite_history(tmp_path, sim_model, caplog)
    assert "newer h3bridge" in warning


def test_a_folder_in_its_place_is_skipped_with_one_warning(tmp_path: Path, sim_model: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    path = history_path()
    path.mkdir()
    (path / "keep.txt").write_text("mine")
    [warning] = _render_despite_history(tmp_path, sim_model, caplog)
    assert "is a folder" in warning
    assert [p.name for p in path.iterdir()] == ["keep.txt"]


LOCK_HOLDER = r"""
import sqlite3, sys
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "exclusive-mode":
    connection.execute("PRAGMA locking_mode = EXCLUSIVE")
connection.execute("BEGIN EXCLUSIVE")
connection.execute("INSERT INTO jobs (started_at, engine, device, shape, request, outcome) "
                   "VALUES (0, 'holder', 'd', 's', '{}', 'running')")
print("locked", flush=True)
sys.stdin.readline()          # hold the lock until the test says so
connection.execute("ROLLBACK")
"""


@pytest.mark.parametrize("how", ["transaction", "exclusive-mode"])
def test_a_locked_history_is_skipped_with_one_warning(tmp_path: Path, sim_model: Path,
                                                      caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Another process holds an exclusive lock on the history (a `sqlite3` shell left in a
    transaction): the render waits the busy timeout at most once, then goes on unrecorded."""
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_SECONDS", 0.3)
    store = HistoryStore()
    _past_run(store, "another shape", {"tokenizer": 1.0})      # the file exists, WAL, ours
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(store.path), how],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        [warning] = _render_despite_history(tmp_path, sim_model, caplog)
        assert "locked by another program" in warning
    finally:
        holder.communicate("go\n", timeout=30)
    assert holder.returncode == 0
    assert [row.shape for row in store.recent_jobs()] == ["another shape"]     # nothing half-written


# ----------------------------------------------------------------------------- the overall fraction

def _fractions(engine, tmp_path: Path, name: str) -> list[tuple[str, int, float]]:
    seen: list[tuple[str, int, float]] = []
    engine.generate(fast_request(), tmp_path / name, overwrite=True,
                    on_progress=lambda e: seen.append((e.phase, e.done, e.fraction)))
    return seen


def _first(events: list[tuple[str, int, float]], phase: str) -> float:
    return next(fraction for seen, _, fraction in events if seen == phase)


def test_the_overall_fraction_is_the_past_runs_split_not_upstreams(tmp_path: Path, sim_model: Path) -> None:
    """Issue 30: the demo said "FFmpeg (overall 99%)" with most of its time still to go: the
    fraction was weighed by upstream's costs, where FFmpeg is 1 % of a job, while h3-sim spends
    its time starting and encoding. With past runs of the shape, the fraction is theirs: here 1 s
    before the first progress record, 3 s of phases before FFmpeg, FFmpeg 6 s, 1 s finishing."""
    engine = OneShotEngine(sim_engine_path(), sim_model)
    no_history = _fractions(engine, tmp_path, "first.mp4")
    assert _first(no_history, "FFmpeg") > 0.9            # upstream's split: FFmpeg is the last 1 %
    store = HistoryStore()
    shape = shape_key(fast_request())
    phases = {"tokenizer": 0.5, "text encoder": 0.5, "denoise enqueue": 1.0, "audio VAE": 0.5, "video VAE load": 0.5,
              "FFmpeg": 6.0, FINISHING: 1.0}
    for past in HistoryStore().completed_jobs(shape=shape):
        store.forget_job(past.id)                      # only the runs below count
    for _ in range(3):
        store.add_job(NewJob(engine="one-shot", device=local_device(), shape=shape, request={"prompt": "past"}),
                      JobEnd(outcome=COMPLETED, phases=phases, total_seconds=sum(phases.values()) + 1.0))
    weighed = _fractions(engine, tmp_path, "second.mp4")
    whole = 1.0 + sum(phases.values())
    assert _first(weighed, "tokenizer") == pytest.approx(1.0 / whole, abs=1e-9)      # the start is behind
    assert _first(weighed, "FFmpeg") == pytest.approx((1.0 + 3.0) / whole, abs=1e-9)
    assert weighed[-1][2] == pytest.approx((whole - 1.0) / whole, abs=1e-9)          # finishing still ahead
    assert [f for _, _, f in weighed] == sorted(f for _, _, f in weighed)              # never goes back


def test_the_fraction_before_ffmpeg_is_the_split_the_engine_really_had(tmp_path: Path, sim_model: Path) -> None:
    """h3-sim for real, twice: when the second run reaches FFmpeg, its overall fraction is the
    share of the first run's time (as recorded: its run less FFmpeg and finishing) that came
    before FFmpeg, to within 1e-6 (float rounding of the recorded seconds); the two runs' own
    speeds do not enter it."""
    engine = OneShotEngine(sim_engine_path(), sim_model)
    _fractions(engine, tmp_path, "first.mp4")
    first = only_job()
    run = first.total_seconds - (first.waited_seconds or 0.0)
    before_ffmpeg = run - first.phases["FFmpeg"] - first.phases[FINISHING]
    second = _fractions(engine, tmp_path, "second.mp4")
    assert _first(second, "FFmpeg") == pytest.approx(before_ffmpeg / run, abs=1e-6)
