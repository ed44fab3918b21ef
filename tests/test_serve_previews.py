"""`h3bridge serve --engine library --previews` as a real child process (the libh3 double): its
event streams carry the denoise previews to RemoteEngine and to ComfyUI's remote mode, equal to
what the library engine gives locally; /health says so; the flags are refused where they cannot
work, and a preview VAE that does not fit the device refuses the start.

The test holds the server's engine lock while it submits, so the job waits (phase "waiting for the
engine") until its event stream is open: the stream then follows the job from its first step. Every server has its own lock, folders and free port under tmp_path; HOME is temporary."""
from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from h3bridge import LibraryEngine, RemoteEngine
from h3bridge.cli.main import main
from h3bridge.engines.lock import engine_lock
from h3bridge.progress import WAITING_PHASE

from core_helpers import fast_request, isolated_home, model_dir  # noqa: F401 (fixtures)
from double_helpers import assert_streamed_previews_match, double_library_path, local_previews
from server_helpers import KEY, ServerProcess, isolated_env

WAIT = 120.0       # a safety net for a loaded machine, never an expected time


@pytest.fixture(autouse=True)
def _home(isolated_home: Path) -> None:
    """Every test here with its own HOME and cache."""


def library_server(tmp_path: Path, model: Path, *extra: str) -> ServerProcess:
    return ServerProcess(tmp_path / "data", model, tmp_path / "logs", engine="library",
                         extra_args=["--library-path", str(double_library_path()), *extra],
                         env=isolated_env(tmp_path / "server"))


def render_while_the_engine_waits(server: ServerProcess, render, progress: list) -> object:
    """Run `render()` in a thread while this test holds the server's engine lock; let go once the
    job's progress says it waits for the engine (its stream is open by then). Its result, or raise."""
    out: list = []

    def run() -> None:
        try:
            out.append(render())
        except BaseException as error:     # re-raised in the test's thread
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    with engine_lock(path=Path(server.env["H3BRIDGE_LOCK_PATH"])):
        thread.start()
        waited = threading.Event()
        deadline_thread = threading.Timer(WAIT, waited.set)
        deadline_thread.start()
        try:
            while not waited.is_set() and not any(getattr(e, "phase", None) == WAITING_PHASE for e in list(progress)):
                if not thread.is_alive():
                    break
                waited.wait(0.02)
        finally:
            deadline_thread.cancel()
        assert any(getattr(e, "phase", None) == WAITING_PHASE for e in progress), \
            f"the job never reported waiting for the engine: {progress[:5]}\n{server.log()}"
    thread.join(WAIT)
    assert not thread.is_alive(), f"the render did not finish\n{server.log()}"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


@pytest.mark.timeout(300)
def test_serve_engine_library_previews_reach_remote_engine_equal_to_local(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    request = fast_request(seed=21)
    local = local_previews(request, model_dir)
    with library_server(tmp_path, model_dir, "--previews") as server:
        health = httpx.get(f"{server.url}/health", timeout=10).json()
        assert (health["engine"], health["previews"]) == ("library", True)
        previews: list = []
        progress: list = []
        with RemoteEngine(server.url, api_key=KEY) as remote:
            result = render_while_the_engine_waits(server, lambda: remote.generate(
                request, tmp_path / "clip.mp4", want_frames=False, want_audio=False,
                on_progress=progress.append, on_preview=previews.append), progress)
    assert Path(result.video_path).exists()
    assert_streamed_previews_match(local, previews)


@pytest.mark.timeout(300)
def test_comfy_remote_mode_receives_a_served_library_engines_previews(
        tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from h3bridge.comfy import adapter
    monkeypatch.setenv("H3BRIDGE_API_KEY", KEY)
    settings = adapter.GenerateSettings(prompt="a red fox", preset="preview", width=96, height=64,
                                        length_unit="frames", frames=22, ssd_streaming="auto")
    previews: list = []
    progress: list = []
    with library_server(tmp_path, model_dir, "--previews") as server:
        handle = adapter.check_engine_settings("", "", adapter.REMOTE, [], remote_url=server.url)
        outputs = render_while_the_engine_waits(server, lambda: adapter.run_generate(
            handle, settings, adapter.GenerateInputs(), scratch_parent=tmp_path / "scratch",
            output_dir=tmp_path / "out", want_image=False, on_progress=progress.append,
            on_preview=previews.append), progress)
    assert outputs.video_path.exists()
    assert previews and all(p.image.shape == (64, 96, 3) for p in previews)
    steps = [p.step for p in previews]      # the newest when the node's stream lags, the last one always
    assert steps == sorted(set(steps)) and steps[-1] == previews[-1].total_steps - 1


def test_a_server_without_previews_says_so_and_streams_none(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    with library_server(tmp_path, model_dir) as server:
        assert httpx.get(f"{server.url}/health", timeout=10).json()["previews"] is False
        previews: list = []
        with RemoteEngine(server.url, api_key=KEY) as remote:
            remote.generate(fast_request(seed=3), tmp_path / "clip.mp4", want_frames=False, want_audio=False,
                            on_preview=previews.append)
    assert previews == []


@pytest.mark.parametrize("flags, named, fix", [
    (["--previews"], "--previews needs --engine library", "add --engine library --library-path PATH"),
    (["--engine", "one-shot", "--previews"], "--previews needs --engine library", "add --engine library --library-path PATH"),
    (["--engine", "oneshot", "--previews"], "--previews needs --engine library", "add --engine library --library-path PATH"),
    (["--library-path", "/nowhere/libh3.dylib"], "--library-path chooses the library engine's files, and the engine "
                                                 "is session", "add --engine library, or drop --library-path"),
    (["--h3-dir", "/nowhere"], "--h3-dir chooses the library engine's files, and the engine is session",
     "add --engine library --library-path PATH (or set $H3_LIBRARY), or drop --h3-dir"),
])
def test_library_flags_without_the_library_engine_are_refused(tmp_path: Path, model_dir: Path, flags: list[str],  # noqa: F811
                                                              named: str, fix: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["serve", "--model-dir", str(model_dir), "--data-dir", str(tmp_path / "data"), "--port", "0", *flags])
    err = capsys.readouterr().err
    assert status == 2, err
    assert named in err and fix in err
    assert not (tmp_path / "data").exists()      # refused before anything started


def test_previews_that_fit_no_job_on_the_device_refuse_the_start(tmp_path: Path, model_dir: Path,  # noqa: F811
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The plan at start is made with the library's own device (the double's h3_device, whose working
    set says 1 MiB) and the preview VAE: nothing fits, so the server does not start."""
    monkeypatch.setenv("H3_SIM_RECOMMENDED_WORKING_SET", "1048576")
    status = main(["serve", "--engine", "library", "--library-path", str(double_library_path()), "--previews",
                   "--model-dir", str(model_dir), "--data-dir", str(tmp_path / "data"), "--port", "0"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "--previews: no job fits this device with the preview VAE loaded" in err
    assert "of 1.0 MiB usable (Apple M5 Max" in err, err     # planned on the device h3_device reported
    assert not (tmp_path / "data").exists()
