"""Issue 31: a storyboard stops after the current shot (`--stop-after-shot`, SIGUSR1 while it
renders, `stop_after_shot` in the Python API) and resumes later with nothing lost: the shot it
stopped after is kept, nothing else starts, no film is made, and the next run renders only the
rest and makes the film an uninterrupted run makes. Also the storyboard key `background`."""
from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from core_helpers import model_dir, pause_notice, sim_engine_path, sim_invocations, sim_log  # noqa: F401 (fixtures)
from story_helpers import decode_film, run_cli, story_argv, write_story
from test_story_resume import CRASH_STORY, finished_prompts, rendered_prompts

from h3bridge.errors import RequestError
from h3bridge.story.storyboard import Storyboard
from h3bridge.engines.groups import all_stopped, live_group_members


def _default_signals() -> None:
    # A test run in the background inherits SIGINT/SIGTSTP ignored; the child must hear them.
    for signum in (signal.SIGINT, signal.SIGTSTP, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_DFL)


@pytest.fixture(scope="module")
def reference_film(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The film of CRASH_STORY rendered without a stop."""
    folder = tmp_path_factory.mktemp("reference")
    story = write_story(folder, CRASH_STORY)
    done = run_cli(story_argv(story, folder / "film.mp4", sim_engine_path(), model_dir, "--engine", "one-shot"))
    assert done.returncode == 0, done.stderr
    frames, audio, _ = decode_film(folder / "film.mp4")
    return frames, audio


def _assert_film_is(film: Path, reference: tuple[np.ndarray, np.ndarray]) -> None:
    frames, audio, _ = decode_film(film)
    assert frames.shape == reference[0].shape and np.array_equal(frames, reference[0])
    assert np.array_equal(audio, reference[1])


def test_stop_after_shot_renders_one_shot_and_the_next_run_the_rest(tmp_path: Path, model_dir: Path, sim_log: Path,
                                                                    reference_film) -> None:
    story = write_story(tmp_path, CRASH_STORY)
    argv = story_argv(story, tmp_path / "film.mp4", sim_engine_path(), model_dir, "--engine", "one-shot")
    stopped = run_cli(argv + ["--stop-after-shot"])
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped after shot 1" in stopped.stderr and "without --stop-after-shot" in stopped.stderr
    assert rendered_prompts(sim_log, 0) == ["first shot"]
    assert finished_prompts(tmp_path / "film.h3story") == {"first shot"}
    assert not (tmp_path / "film.mp4").exists()
    again = run_cli(argv + ["--stop-after-shot"])          # the next shot the film needs, and stop again
    assert again.returncode == 0 and "stopped after shot 2" in again.stderr, again.stderr
    assert rendered_prompts(sim_log, 1) == ["second shot"]
    resumed = run_cli(argv)
    assert resumed.returncode == 0, resumed.stderr
    assert rendered_prompts(sim_log, 2) == ["third shot"]
    _assert_film_is(tmp_path / "film.mp4", reference_film)


def test_sigusr1_stops_after_the_shot_rendering_now(tmp_path: Path, model_dir: Path, sim_log: Path,
                                                     reference_film) -> None:
    story = write_story(tmp_path, CRASH_STORY)
    argv = story_argv(story, tmp_path / "film.mp4", sim_engine_path(), model_dir, "--engine", "one-shot")
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_default_signals)
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("h3bridge: shot 2/3: denoise"):
            process.send_signal(signal.SIGUSR1)
            break
    rest = process.stderr.read()
    assert process.wait(timeout=120) == 0, "".join(seen) + rest
    assert "stopping after the shot rendering now (SIGUSR1)" in rest and "stopped after shot 2" in rest
    assert finished_prompts(tmp_path / "film.h3story") == {"first shot", "second shot"}   # shot 2 was finished
    assert rendered_prompts(sim_log, 0) == ["first shot", "second shot"]
    assert not (tmp_path / "film.mp4").exists()
    resumed = run_cli(argv)
    assert resumed.returncode == 0, resumed.stderr
    assert rendered_prompts(sim_log, 2) == ["third shot"]
    _assert_film_is(tmp_path / "film.mp4", reference_film)


def test_the_python_api_stops_when_the_event_is_set_from_another_thread(tmp_path: Path, model_dir: Path,
                                                                         sim_log: Path) -> None:
    from h3bridge import OneShotEngine
    from h3bridge.story.runner import run_story

    storyboard = Storyboard.from_toml(write_story(tmp_path, CRASH_STORY))
    stop = threading.Event()

    def progress(report) -> None:
        if report.shot == 1 and report.phase == "denoise":
            stop.set()      # as a UI button would, while shot 1 renders

    with OneShotEngine(sim_engine_path(), model_dir) as engine:
        result = run_story(storyboard, tmp_path / "film.mp4", engine=engine, on_progress=progress,
                           stop_after_shot=stop)
    assert result.stopped_after_shot == 1 and result.output is None and result.summary()["stopped_after_shot"] == 1
    assert [shot.index for shot in result.shots] == [1] and not (tmp_path / "film.mp4").exists()
    assert rendered_prompts(sim_log, 0) == ["first shot"]


def test_the_storyboard_key_background_must_be_true_or_false() -> None:
    with pytest.raises(RequestError) as refused:
        Storyboard.from_dict({"background": "yes", "shot": [{"prompt": "x"}]})
    assert refused.value.field == "background" and "must be true or false" in refused.value.message
    assert "background = true" in (refused.value.hint or "")
    assert Storyboard.from_dict({"background": True, "shot": [{"prompt": "x"}]}).background is True


def test_ctrl_z_pauses_the_story_and_fg_finishes_the_same_film(tmp_path: Path, model_dir: Path, sim_log: Path,
                                                              reference_film) -> None:
    """Ctrl-Z (SIGTSTP) during shot 2 stops its engine and the command; SIGCONT (`fg`) goes on."""
    import psutil

    story = write_story(tmp_path, CRASH_STORY)
    argv = story_argv(story, tmp_path / "film.mp4", sim_engine_path(), model_dir, "--engine", "one-shot")
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_default_signals)
    assert process.stderr is not None
    try:
        for line in process.stderr:
            if line.startswith("h3bridge: shot 2/3: denoise"):
                process.send_signal(signal.SIGTSTP)
                break
        said = pause_notice(process.stderr)
        assert "paused: the engine is stopped where it was and its memory stays in use (resident)" in said, said
        engine = sim_invocations(sim_log)[1]["pid"]
        deadline = time.monotonic() + 60
        while not (all_stopped([psutil.Process(pid) for pid in live_group_members(engine)]) and
                   psutil.Process(process.pid).status() == psutil.STATUS_STOPPED):
            assert time.monotonic() < deadline, "the engine and the command were never both stopped"
            time.sleep(0.02)
        process.send_signal(signal.SIGCONT)
        rest = process.stderr.read()
        assert process.wait(timeout=120) == 0, rest
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
            process.kill()
    assert "h3bridge: resumed" in rest
    assert rendered_prompts(sim_log, 0) == ["first shot", "second shot", "third shot"]     # nothing rendered twice
    _assert_film_is(tmp_path / "film.mp4", reference_film)


def test_a_hosts_storyboard_stopped_after_a_shot_says_so_and_the_next_run_goes_on(tmp_path: Path, model_dir: Path,
                                                                                  sim_log: Path) -> None:
    """H3 Storyboard's Stop after shot (comfy/pause.py sets the event): render_story_text ends with
    StoryStoppedError after the shot rendering, keeps it, writes no film; the same shots again
    render only the rest."""
    from h3bridge import OneShotEngine
    from h3bridge.story.host import StoryStoppedError, render_story_text

    text, defaults = "[22f]\nfirst shot\n\n[22f]\nsecond shot", {"width": 64, "height": 32, "steps": 2}
    stop = threading.Event()
    stop.set()                  # pressed before the first shot finished
    with OneShotEngine(sim_engine_path(), model_dir) as engine:
        with pytest.raises(StoryStoppedError) as stopped:
            render_story_text(text, defaults, engine=engine, jobs_root=tmp_path / "stories", job_name="held",
                              want_frames=False, film_root=tmp_path / "films", stop_after_shot=stop)
        assert stopped.value.shot == 1 and stopped.value.job_dir == tmp_path / "stories" / "held"
        assert "after shot 1" in stopped.value.message and "same shots and job_name" in stopped.value.hint
        assert rendered_prompts(sim_log, 0) == ["first shot"] and not (tmp_path / "films" / "held.mp4").exists()
        done = render_story_text(text, defaults, engine=engine, jobs_root=tmp_path / "stories", job_name="held",
                                 want_frames=False, film_root=tmp_path / "films", stop_after_shot=threading.Event())
    assert rendered_prompts(sim_log, 1) == ["second shot"]
    assert done.video_path == tmp_path / "films" / "held.mp4" and done.video_path.is_file()
