"""A story rendered on a server and stopped hard (its client SIGKILLed, or the server) resumes by
following the jobs it already submitted: every shot is paid for once (completed server jobs =
shots), and the film is the one an uninterrupted run makes.

Each moment of a kill is reached explicitly, never by timing: in-process, a RemoteEngine stops
dead (a BaseException no handler takes for a cancel, so no job is deleted) at a chosen step of
shot 2; across processes, the server's engine holds a job at a phase (h3-sim's H3_SIM_HOLD_PHASE)
until the test has killed what it kills and releases it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from h3bridge.engines.remote import RemoteEngine
from h3bridge.story import Storyboard, run_story
from h3bridge.story.jobdir import Manifest

from core_helpers import isolated_home  # noqa: F401 (a fixture)
from remote_helpers import KEY, start_server
from server_helpers import model  # noqa: F401  (the module's fixture model)
from story_helpers import CANVAS, assert_same_film, decode_film, write_story

WAIT = 120.0      # a safety net for a loaded machine, never an expected time
THREE_SHOTS = CANVAS + '''
[[shot]]
prompt = "a lighthouse at dusk"
frames = 22

[[shot]]
prompt = "the camera climbs the stairs"
frames = 22
continue = "anchor"

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
    started = start_server(tmp_path_factory.mktemp("story-resume-server"), model)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def reference_film(tmp_path_factory: pytest.TempPathFactory, server) -> tuple[np.ndarray, np.ndarray]:
    """THREE_SHOTS rendered without a kill: the film every resumed run must equal."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    with RemoteEngine(server.url, api_key=KEY) as engine:
        run_story(Storyboard.from_toml(write_story(folder, THREE_SHOTS)), folder / "film.mp4", engine=engine)
    frames, audio, _ = decode_film(folder / "film.mp4")
    return frames, audio


def jobs_on(url: str) -> dict[str, str]:
    """Every job the server holds: id -> status."""
    answer = httpx.get(f"{url}/v1/videos", params={"limit": 100}, headers={"Authorization": f"Bearer {KEY}"},
                       timeout=30)
    assert answer.status_code == 200, answer.text
    return {job["id"]: job["status"] for job in answer.json()["data"]}


def jobs_since(url: str, before: dict[str, str]) -> list[str]:
    """The statuses of the jobs submitted since `before` was taken (whatever their status: a shot
    paid for twice shows even while its second job still runs)."""
    return [status for job_id, status in jobs_on(url).items() if job_id not in before]


def test_a_submission_sent_again_with_its_key_gets_the_same_job(server) -> None:
    body = {"prompt": "a key sent twice", "size": "64x32", "seconds": "1", "seed": 5, "steps": 2}
    headers = {"Authorization": f"Bearer {KEY}", "Idempotency-Key": "h3bridge-test-key-sent-twice"}
    first = httpx.post(f"{server.url}/v1/videos", json=body, headers=headers, timeout=30)
    again = httpx.post(f"{server.url}/v1/videos", json=body, headers=headers, timeout=30)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.json()["id"] == again.json()["id"]
    other = httpx.post(f"{server.url}/v1/videos", json=body, timeout=30,
                       headers={**headers, "Idempotency-Key": "h3bridge-test-another-key"})
    assert other.status_code == 200 and other.json()["id"] != first.json()["id"]


@pytest.mark.parametrize("key", ["", "tab\there", "x" * 256, "caf\u00e9"])
def test_an_unusable_idempotency_key_is_refused_naming_the_header(server, key: str) -> None:
    before = jobs_on(server.url)
    answer = httpx.post(f"{server.url}/v1/videos", json={"prompt": "p", "size": "64x32", "seconds": "1"},
                        headers={"Authorization": f"Bearer {KEY}", "Idempotency-Key": key.encode("utf-8")},
                        timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "Idempotency-Key" and "Idempotency-Key" in error["message"]
    assert set(jobs_on(server.url)) == set(before)      # no job added (earlier ones may finish meanwhile)


class Killed(BaseException):
    """The client process dying: no handler of a cancel runs, so no server job is deleted."""


class DyingEngine(RemoteEngine):
    """A RemoteEngine that dies at one step of the shot whose prompt is `prompt`:
    accepted: the server has accepted the job and the client has not yet written its id down;
    following: its id is written down, the job queued or running;
    completed: the job is completed, nothing downloaded;
    downloaded: the MP4 is downloaded, the shot not yet recorded."""

    def __init__(self, url: str, prompt: str, moment: str) -> None:
        super().__init__(url, api_key=KEY)
        self.prompt, self.moment, self.current = prompt, moment, ""

    def generate(self, request, output=None, **options):
        self.current = request.prompt
        return super().generate(request, output, **options)

    def _die_at(self, moment: str) -> None:
        if self.current == self.prompt and self.moment == moment:
            raise Killed(moment)

    def _submit(self, *args, **options):
        job = super()._submit(*args, **options)
        self._die_at("accepted")
        return job

    def _follow(self, *args, **options):
        self._die_at("following")
        return super()._follow(*args, **options)

    def _download(self, *args, **options):
        self._die_at("completed")
        super()._download(*args, **options)
        self._die_at("downloaded")


@pytest.mark.parametrize("moment", ["accepted", "following", "completed", "downloaded"])
def test_a_client_killed_mid_shot_resumes_by_following_the_job_it_submitted(
        tmp_path: Path, server, reference_film, moment: str) -> None:
    storyboard = Storyboard.from_toml(write_story(tmp_path, THREE_SHOTS))
    before = jobs_on(server.url)
    with DyingEngine(server.url, storyboard.shots[1].prompt, moment) as dying, pytest.raises(Killed):
        run_story(storyboard, tmp_path / "film.mp4", engine=dying)
    manifest = Manifest.from_json((tmp_path / "film.h3story" / "manifest.json").read_text())
    assert set(manifest.shots) == {1}
    notices: list[str] = []
    with RemoteEngine(server.url, api_key=KEY) as engine:
        result = run_story(storyboard, tmp_path / "film.mp4", engine=engine, on_notice=notices.append)
    assert result.rendered == 2 and [shot.reused for shot in result.shots] == [True, False, False]
    assert jobs_since(server.url, before) == ["completed"] * 3, f"{jobs_on(server.url)}; {notices}"
    if moment != "accepted":       # (then it was the server that knew the key, not the manifest)
        assert any(notice.startswith("shot 2: following job ") for notice in notices), notices
    assert Manifest.from_json((tmp_path / "film.h3story" / "manifest.json").read_text()).remote_jobs == {}
    assert_same_film(tmp_path / "film.mp4", reference_film)


def _story_cli(story: Path, film: Path, url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "h3bridge.cli", "story", str(story), "-o", str(film), "--remote", url, *extra]


def _wait_for(condition, what: str, child: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if child is not None:
            assert child.poll() is None, log.read_text() if log is not None else "the client exited"
        assert time.monotonic() < deadline, f"never: {what}" + (f"\n{log.read_text()}" if log is not None else "")
        time.sleep(0.05)


def _pending(manifest_path: Path) -> set[int]:
    if not manifest_path.exists():
        return set()
    return set(Manifest.from_json(manifest_path.read_text()).remote_jobs)


def _held_server(root: Path, model: Path, phase: str):   # noqa: F811
    notice, release = root / "held", root / "release"
    started = start_server(root, model, extra_env={"H3_SIM_HOLD_PHASE": phase, "H3_SIM_HOLD_NOTICE": str(notice),
                                                   "H3_SIM_HOLD_RELEASE": str(release)})
    return started, notice, release


def test_the_story_cli_sigkilled_with_shots_in_flight_pays_for_each_shot_once(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, model: Path, reference_film) -> None:  # noqa: F811
    """Shots 1 and 3 (two chains) submitted at once; the server's engine holds shot 1 in denoise,
    shot 3 waits in its queue; the CLI is SIGKILLed; the hold is released; the same command renders
    the rest, following both jobs."""
    held, notice, release = _held_server(tmp_path_factory.mktemp("story-resume-held"), model, "denoise")
    story, film = write_story(tmp_path, THREE_SHOTS), tmp_path / "film.mp4"
    manifest_path = tmp_path / "film.h3story" / "manifest.json"
    env = {**os.environ, "H3BRIDGE_API_KEY": KEY}
    log = tmp_path / "first-run.log"
    try:
        with open(log, "wb") as output:
            child = subprocess.Popen(_story_cli(story, film, held.url, "--parallel", "2"), stdout=output,
                                     stderr=output, env=env, start_new_session=True)
        try:
            _wait_for(lambda: notice.exists() and _pending(manifest_path) == {1, 3},
                      "shot 1 held on the server with shots 1 and 3 written down", child, log)
        finally:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
        release.touch()
        resumed = subprocess.run(_story_cli(story, film, held.url, "--parallel", "2"), capture_output=True,
                                 text=True, env=env, timeout=WAIT)
        assert resumed.returncode == 0, resumed.stderr
        assert "following job" in resumed.stderr
        statuses = list(jobs_on(held.url).values())
        assert statuses.count("completed") == 3 and len(statuses) == 3, statuses
    finally:
        held.stop()
    assert_same_film(film, reference_film)


def test_a_server_sigkilled_and_restarted_finishes_the_job_the_resumed_story_follows(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, model: Path, reference_film) -> None:  # noqa: F811
    """The server's whole process group (its engine included) is SIGKILLed while it holds shot 1;
    it restarts on the same data directory (its queue puts the interrupted job back); the story
    run again follows that job rather than submitting shot 1 a second time."""
    root = tmp_path_factory.mktemp("story-resume-server-killed")
    held, notice, release = _held_server(root, model, "denoise")
    story, film = write_story(tmp_path, THREE_SHOTS), tmp_path / "film.mp4"
    manifest_path = tmp_path / "film.h3story" / "manifest.json"
    env = {**os.environ, "H3BRIDGE_API_KEY": KEY}
    log = tmp_path / "first-run.log"
    try:
        with open(log, "wb") as output:
            child = subprocess.Popen(_story_cli(story, film, held.url), stdout=output, stderr=output, env=env,
                                     start_new_session=True)
        try:
            _wait_for(lambda: notice.exists() and _pending(manifest_path) == {1},
                      "shot 1 held on the server and written down", child, log)
            assert held.process is not None
            os.killpg(held.process.pid, signal.SIGKILL)
            held.process.wait(30)
            held.url = ""             # (start() below learns the new one)
            child.wait(WAIT)          # the client finds the server gone and stops
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(30)
        assert child.returncode != 0 and not film.exists()
        release.touch()
        held.start()                  # the same data directory: the interrupted job is queued again
        resumed = subprocess.run(_story_cli(story, film, held.url), capture_output=True, text=True, env=env,
                                 timeout=WAIT)
        assert resumed.returncode == 0, resumed.stderr + held.log()
        assert "shot 1: following job " in resumed.stderr
        statuses = list(jobs_on(held.url).values())
        assert statuses.count("completed") == 3 and len(statuses) == 3, statuses
    finally:
        held.stop()
    assert_same_film(film, reference_film)
    assert json.loads(manifest_path.read_text())["remote_jobs"] == {}


class ServerStoppingEngine(RemoteEngine):
    """Stops the server just before shot `prompt` is submitted: the server dies between shots."""

    def __init__(self, server, prompt: str) -> None:
        super().__init__(server.url, api_key=KEY)
        self.server, self.prompt = server, prompt

    def generate(self, request, output=None, **options):
        if request.prompt == self.prompt:
            self.server.stop()
        return super().generate(request, output, **options)


def test_a_dead_server_is_a_refusal_before_the_story_began_and_a_failure_after(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, model: Path) -> None:  # noqa: F811
    """The same dead server exited 2 or 1 depending on whether it died between shots (the next
    submission: 'refused before anything ran') or during one (a poll): once the story has had work
    done it is a failure (exit 1) whichever step meets the dead server; dead from the start, a
    refusal (exit 2)."""
    from h3bridge.errors import RemoteUnreachableError
    story = write_story(tmp_path, THREE_SHOTS)
    dead = "http://127.0.0.1:9"           # the discard port: nothing listens there
    done = subprocess.run(_story_cli(story, tmp_path / "never.mp4", dead), capture_output=True, text=True,
                          env={**os.environ, "H3BRIDGE_API_KEY": KEY}, timeout=WAIT)
    assert done.returncode == 2, done.stderr
    assert "cannot reach the server" in done.stderr
    server = start_server(tmp_path_factory.mktemp("story-dies-between-shots"), model)
    storyboard = Storyboard.from_toml(story)
    try:
        with ServerStoppingEngine(server, storyboard.shots[1].prompt) as engine, \
                pytest.raises(RemoteUnreachableError) as failed:
            run_story(storyboard, tmp_path / "film.mp4", engine=engine)
    finally:
        server.stop()
    assert failed.value.before_start is False, "shot 1 had rendered: the story failed, it was not refused"
    assert set(Manifest.from_json((tmp_path / "film.h3story" / "manifest.json").read_text()).shots) == {1}
