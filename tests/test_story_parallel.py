"""`h3bridge story --remote URL --parallel N` and run_story(parallel=N): independent shots render
at once on `h3bridge serve`, continuing shots wait for the shot they continue, and the film is the
one a serial run makes (frames and samples); a run killed with shots in flight resumes.

Every server is a child on a free loopback port with folders of its own (remote_helpers), every
film and job folder is under tmp_path and HOME is a temporary folder: safe under pytest-xdist."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from h3bridge.engines.remote import RemoteEngine
from h3bridge.errors import GenerationCancelled, RemoteError, RequestError
from h3bridge.story import Storyboard, run_story
from h3bridge.story.jobdir import Manifest
from h3bridge.story.runner import MAX_PARALLEL, StoryProgress, story_chains

from core_helpers import isolated_home  # noqa: F401 (a fixture)
from remote_helpers import KEY, start_server
from server_helpers import model  # noqa: F401  (the module's fixture model)
from story_helpers import CANVAS, FOUR_SHOTS, assert_same_film, decode_film, write_story

WAIT = 120.0      # a safety net for a loaded machine, never an expected time

# Shots 1-2 and 3-4 are two chains (a cut at 3); 5 is a chain of its own.
FIVE_SHOTS = FOUR_SHOTS + '''
[[shot]]
prompt = "a gull over the harbour"
frames = 22
continue = "cut"
'''


@pytest.fixture(autouse=True)
def _home(isolated_home: Path) -> None:
    """Every test here with its own HOME and cache."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model: Path):   # noqa: F811
    started = start_server(tmp_path_factory.mktemp("story-parallel-server"), model)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def serial_film(tmp_path_factory: pytest.TempPathFactory, server) -> tuple[np.ndarray, np.ndarray]:
    """FIVE_SHOTS rendered shot after shot on the server: the film every parallel run must equal."""
    folder = tmp_path_factory.mktemp("serial")
    storyboard = Storyboard.from_toml(write_story(folder, FIVE_SHOTS))
    with RemoteEngine(server.url, api_key=KEY) as engine:
        result = run_story(storyboard, folder / "film.mp4", engine=engine, parallel=1)
    assert result.rendered == 5
    frames, audio, _ = decode_film(folder / "film.mp4")
    return frames, audio


class GatedEngine(RemoteEngine):
    """A RemoteEngine that holds shot 1 back until shot 3 (after a cut) has started: a serial run
    would wait here forever (the bounded wait fails the test); a parallel one goes on at once.
    Neither of the two returns before the other has reported progress, so the story's progress
    has them in flight together at that report (no timing involved). It records when each shot
    starts and ends, to check that continuing shots wait."""

    def __init__(self, url: str, first: str, after_cut: str) -> None:
        super().__init__(url, api_key=KEY)
        self.first, self.after_cut = first, after_cut
        self.cut_started = threading.Event()
        self.reported = {first: threading.Event(), after_cut: threading.Event()}
        self.log: list[tuple[str, str]] = []
        self._guard = threading.Lock()

    def generate(self, request, output=None, **options):
        prompt = request.prompt
        with self._guard:
            self.log.append(("start", prompt))
        if prompt == self.after_cut:
            self.cut_started.set()
        if prompt == self.first:
            assert self.cut_started.wait(WAIT), "the shot after the cut never started while shot 1 was in flight"
        if prompt in self.reported:
            report = options.get("on_progress")

            def reported(event) -> None:
                if report is not None:
                    report(event)
                self.reported[prompt].set()
            options["on_progress"] = reported
        result = super().generate(request, output, **options)
        if prompt in self.reported:
            other = self.after_cut if prompt == self.first else self.first
            assert self.reported[other].wait(WAIT), f"{other!r} never reported progress"
        with self._guard:
            self.log.append(("end", prompt))
        return result


def test_chains_cut_at_every_cut() -> None:
    storyboard = Storyboard.from_toml(write_story(Path(os.environ["HOME"]), FIVE_SHOTS))
    from h3bridge.story.plan import plan_story
    chains = story_chains(plan_story(storyboard).shots)
    assert [[shot.index for shot in chain] for chain in chains] == [[1, 2], [3, 4], [5]]


def test_parallel_shots_render_at_once_and_make_the_serial_film(tmp_path: Path, server, serial_film) -> None:
    storyboard = Storyboard.from_toml(write_story(tmp_path, FIVE_SHOTS))
    prompts = [shot.prompt for shot in storyboard.shots]
    engine = GatedEngine(server.url, first=prompts[0], after_cut=prompts[2])
    reports: list[StoryProgress] = []
    with engine:
        result = run_story(storyboard, tmp_path / "film.mp4", engine=engine, parallel=3,
                           on_progress=reports.append)
    assert result.rendered == 5 and [shot.index for shot in result.shots] == [1, 2, 3, 4, 5]
    assert_same_film(tmp_path / "film.mp4", serial_film)
    # continuing shots started only once the shot they continue had ended
    order = engine.log
    for before, after in ((0, 1), (2, 3)):
        assert order.index(("end", prompts[before])) < order.index(("start", prompts[after]))
    # the progress showed shots 1 and 3 in flight together
    assert any({1, 3} <= {shot.shot for shot in report.in_flight} for report in reports)
    fractions = [report.fraction for report in reports]
    assert fractions[-1] == 1.0 and all(0.0 <= value <= 1.0 for value in fractions)


def test_a_failing_shot_stops_the_others_and_keeps_what_finished(tmp_path: Path, server) -> None:
    storyboard = Storyboard.from_toml(write_story(tmp_path, FIVE_SHOTS))
    prompts = [shot.prompt for shot in storyboard.shots]

    class FailsShotThree(GatedEngine):
        def generate(self, request, output=None, **options):
            if request.prompt == prompts[2]:
                self.cut_started.set()
                self.reported[prompts[2]].set()      # (shot 1 does not wait for a shot that failed)
                raise RemoteError("the server failed the job", url=self.base_url, engine_message="boom")
            return super().generate(request, output, **options)

    with FailsShotThree(server.url, first=prompts[0], after_cut=prompts[2]) as engine, \
            pytest.raises(RemoteError, match="the server failed the job"):
        run_story(storyboard, tmp_path / "film.mp4", engine=engine, parallel=2)
    assert not (tmp_path / "film.mp4").exists()
    manifest_path = tmp_path / "film.h3story" / "manifest.json"
    if manifest_path.exists():        # shot 1 may have finished before the failure stopped it
        manifest = Manifest.from_json(manifest_path.read_text())
        assert 3 not in manifest.shots and 4 not in manifest.shots


def test_cancel_stops_every_shot_in_flight(tmp_path: Path, server) -> None:
    from h3bridge.cancel import CancelToken
    storyboard = Storyboard.from_toml(write_story(tmp_path, FIVE_SHOTS))
    cancel = CancelToken()

    def cancel_once_two_are_in_flight(report: StoryProgress) -> None:
        if len(report.in_flight) >= 2:
            cancel.cancel()

    prompts = [shot.prompt for shot in storyboard.shots]
    # (GatedEngine: shots 1 and 3 are reported in flight together, whatever the machine's load)
    with GatedEngine(server.url, first=prompts[0], after_cut=prompts[2]) as engine, pytest.raises(GenerationCancelled):
        run_story(storyboard, tmp_path / "film.mp4", engine=engine, parallel=3,
                  on_progress=cancel_once_two_are_in_flight, cancel=cancel)
    assert not (tmp_path / "film.mp4").exists()


@pytest.mark.parametrize("parallel", [0, -1, MAX_PARALLEL + 1, 2.5, True, "2"])
def test_parallel_out_of_bounds_is_refused(tmp_path: Path, parallel: object) -> None:
    storyboard = Storyboard.from_toml(write_story(tmp_path, FIVE_SHOTS))
    with pytest.raises(RequestError) as refused:
        run_story(storyboard, tmp_path / "film.mp4", engine=RemoteEngine("http://127.0.0.1:9"), parallel=parallel)
    assert refused.value.field == "parallel" and f"1 to {MAX_PARALLEL}" in str(refused.value)
    assert not (tmp_path / "film.h3story").exists()


def test_parallel_on_a_local_engine_is_refused(tmp_path: Path) -> None:
    from h3bridge.engines.oneshot import OneShotEngine
    storyboard = Storyboard.from_toml(write_story(tmp_path, FIVE_SHOTS))
    engine = OneShotEngine.__new__(OneShotEngine)       # never started: the refusal comes first
    with pytest.raises(RequestError) as refused:
        run_story(storyboard, tmp_path / "film.mp4", engine=engine, parallel=2)
    assert refused.value.field == "parallel" and "RemoteEngine" in refused.value.hint
    assert not (tmp_path / "film.h3story").exists()


def _cli(*argv: str, env: dict[str, str] | None = None, timeout: float = WAIT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "h3bridge.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "H3BRIDGE_API_KEY": KEY, **(env or {})})


def test_cli_refuses_parallel_without_remote(tmp_path: Path) -> None:
    story = write_story(tmp_path, FIVE_SHOTS)
    done = _cli("story", str(story), "--parallel", "3")
    assert done.returncode == 2
    assert "--parallel 3 needs --remote URL" in done.stderr and "add --remote URL" in done.stderr
    done = _cli("story", str(story), "--remote", "http://127.0.0.1:9", "--parallel", "0")
    assert done.returncode == 2 and f"from 1 to {MAX_PARALLEL}" in done.stderr
    assert not (tmp_path / "story.h3story").exists()


def test_cli_parallel_killed_with_shots_in_flight_resumes_to_the_serial_film(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, model: Path, server,   # noqa: F811
        serial_film) -> None:
    """Shot 4 (a tail: the only shot with reference audio) hangs on a server of its own (its one
    worker then holds the shots queued behind it); the CLI is SIGKILLed once shot 4's engine has
    gone silent, with shot 4 and others in flight. The same command on a working server then
    renders only what is missing and makes the serial film."""
    hang_notice = tmp_path / "hung"
    hanging = start_server(tmp_path_factory.mktemp("story-parallel-hang"), model,
                           extra_env={"H3_SIM_HANG_PHASE": "audio VAE encoder", "H3_SIM_HANG_NOTICE": str(hang_notice)})
    story = write_story(tmp_path, FIVE_SHOTS)
    film = tmp_path / "film.mp4"
    manifest_path = tmp_path / "film.h3story" / "manifest.json"
    argv = [sys.executable, "-m", "h3bridge.cli", "story", str(story), "-o", str(film), "--parallel", "2"]
    env = {**os.environ, "H3BRIDGE_API_KEY": KEY}
    try:
        with open(tmp_path / "first-run.log", "wb") as log:
            child = subprocess.Popen([*argv, "--remote", hanging.url], stdout=log, stderr=log, env=env,
                                     start_new_session=True)
        try:
            deadline = time.monotonic() + WAIT
            while True:
                recorded = set()
                if manifest_path.exists():
                    recorded = set(Manifest.from_json(manifest_path.read_text()).shots)
                if hang_notice.exists() and 3 in recorded:     # (shot 4 starts after 3 is recorded)
                    break
                assert child.poll() is None, (tmp_path / "first-run.log").read_text()
                assert time.monotonic() < deadline, f"recorded {recorded}: {(tmp_path / 'first-run.log').read_text()}"
                time.sleep(0.05)
            os.killpg(child.pid, signal.SIGKILL)
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
    finally:
        hanging.stop()
    recorded = set(Manifest.from_json(manifest_path.read_text()).shots)     # as the kill left it
    assert 3 in recorded and 4 not in recorded and not film.exists()
    resumed = _cli("story", str(story), "-o", str(film), "--parallel", "2", "--remote", server.url)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{5 - len(recorded)} shot(s) rendered, {len(recorded)} kept" in resumed.stderr
    assert_same_film(film, serial_film)


def test_cli_progress_names_every_shot_in_flight(tmp_path: Path, server) -> None:
    story = write_story(tmp_path, CANVAS + "".join(f'\n[[shot]]\nprompt = "shot {n}"\nframes = 22\n' for n in (1, 2, 3)))
    done = _cli("story", str(story), "--remote", server.url, "--parallel", "3")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "shots in flight:" in line]
    assert lines, done.stderr
    # every shot's progress was shown, each line saying which shots were in flight
    for shot in (1, 2, 3):
        assert any(line.startswith(f"h3bridge: shot {shot}/3: ") for line in lines), done.stderr
