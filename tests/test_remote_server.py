"""RemoteEngine end to end against a real `h3bridge serve` child process over h3-sim: the clip
and its frames come back exactly as the local engine makes them, uploads go as multipart, the
server's refusals and auth failures arrive typed with its words, a cancel deletes the server's
job, and the CLI (`generate --remote`) and the ComfyUI adapter's remote mode render through it.

Each server runs on a free loopback port in its own process group (killed at teardown) with its
own data, cache and engine-lock folders; readiness is its "listening on" line, then /health."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from h3bridge import (
    CancelToken,
    GenerationCancelled,
    OneShotEngine,
    RemoteAuthError,
    RemoteEngine,
    RequestError,
)
from h3bridge.cli.main import main
from h3bridge.comfy import adapter
from h3bridge.media.decode import decode_audio, decode_video_frames
from h3bridge.sim.fixture import write_fixture_model

from core_helpers import fast_request, make_image, sim_engine_path, wait_until
from remote_helpers import KEY, key, ServerProcess, get, start_server  # noqa: F401 (key: a fixture)

@pytest.fixture(scope="module")
def sim_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture_model(tmp_path_factory.mktemp("remote-model") / "MiniMax-H3")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sim_model: Path) -> ServerProcess:
    running = start_server(tmp_path_factory.mktemp("serve"), sim_model, extra_args=("--max-upload-mb", "1"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def hanging_server(tmp_path_factory: pytest.TempPathFactory, sim_model: Path) -> ServerProcess:
    """A server whose engine stops progressing in the denoise loop, so a job is running when cancelled."""
    root = tmp_path_factory.mktemp("serve-hang")
    running = start_server(root, sim_model, extra_env={"H3_SIM_HANG_PHASE": "denoise enqueue:1",
                                                       "H3_SIM_HANG_NOTICE": str(root / "hung.pid")})
    yield running
    running.stop()




# ----------------------------------------------------------------------------- the engine

def test_remote_and_local_engines_give_the_same_clip(server: ServerProcess, key: str, tmp_path: Path,
                                                     sim_model: Path) -> None:
    request = fast_request(seed=7)
    events = []
    with RemoteEngine(server.url) as remote:
        result = remote.generate(request, tmp_path / "remote" / "fox.mp4", on_progress=events.append)
    local = OneShotEngine(sim_engine_path(), sim_model).generate(request, tmp_path / "local.mp4", want_frames=False)
    assert result.video_path.is_file() and sorted(p.name for p in result.video_path.parent.iterdir()) == ["fox.mp4"]
    # h3-sim is deterministic: the same request renders the same frames and soundtrack on both paths.
    local_frames = decode_video_frames(local.video_path, request.frame_count, request.width, request.height)
    assert result.frames.shape == (22, 64, 96, 3)
    assert np.array_equal(result.frames, local_frames)
    assert np.array_equal(result.audio, decode_audio(local.video_path))
    assert result.seed == 7
    # Progress came from the server: its engine's phases, then the download.
    phases = [event.phase for event in events]
    assert phases[-1] == "download" and any(phase not in ("download", "queued on the server") for phase in phases)
    fractions = [event.fraction for event in events]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_a_first_frame_goes_up_as_an_upload(server: ServerProcess, key: str, tmp_path: Path) -> None:
    first = make_image(tmp_path / "first.png", size="96x64", color="green")
    result = RemoteEngine(server.url).generate(fast_request(first_frame=first), tmp_path / "anchored.mp4",
                                               want_frames=False, want_audio=False)
    assert result.video_path.stat().st_size > 0


def test_an_upload_over_the_servers_limit_is_refused_with_its_message(server: ServerProcess, key: str,
                                                                      tmp_path: Path) -> None:
    noise = np.random.default_rng(1).integers(0, 256, (768, 1344, 3), dtype=np.uint8)
    from h3bridge.media.references import write_png
    big = write_png(noise, tmp_path / "big.png")
    assert big.stat().st_size > 1024 * 1024
    with pytest.raises(RequestError) as caught:
        RemoteEngine(server.url).generate(fast_request(first_frame=big), tmp_path / "out" / "a.mp4")
    # The server's words, verbatim (it names the upload as the client sent it, never its own path).
    assert caught.value.message == "the input_reference upload ('big.png') is over this server's limit of 1 MiB"
    assert caught.value.field == "input_reference" and caught.value.before_start
    assert not (tmp_path / "out").exists()


def test_a_wrong_key_is_refused_and_named(server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_API_KEY", "not-the-key")
    with pytest.raises(RemoteAuthError) as caught:
        RemoteEngine(server.url).generate(fast_request(), tmp_path / "a.mp4")
    assert caught.value.status == 401 and "H3BRIDGE_API_KEY" in caught.value.hint
    assert "not-the-key" not in str(caught.value) and not (tmp_path / "a.mp4").exists()


def test_cancel_deletes_the_servers_job(hanging_server: ServerProcess, key: str, tmp_path: Path) -> None:
    cancel = CancelToken()
    seen_ids: list[str] = []

    def on_progress(event) -> None:
        if event.phase == "denoise enqueue":       # the server's engine is running the job
            cancel.cancel()

    engine = RemoteEngine(hanging_server.url, poll_interval=0.1)
    original = engine._submit

    def submit(*args, **options):
        job = original(*args, **options)
        seen_ids.append(job.id)
        return job

    engine._submit = submit   # only to learn the job's id
    with pytest.raises(GenerationCancelled):
        engine.generate(fast_request(), tmp_path / "a.mp4", on_progress=on_progress, cancel=cancel)
    # By the time generate has raised, the server has deleted the job.
    assert get(hanging_server, f"/v1/videos/{seen_ids[0]}").status_code == 404
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- the CLI and ComfyUI

def test_generate_remote_end_to_end(server: ServerProcess, key: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "cli" / "fox.mp4"
    capsys.readouterr()
    status = main(["generate", "-p", "a red fox", "--width", "96", "--height", "64", "--frames", "22",
                   "--steps", "2", "--quiet", "--json", "--remote", server.url, "-o", str(output)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["video_path"] == str(output) and summary["frame_count"] == 22 and output.stat().st_size > 0
    assert KEY not in captured.out + captured.err


def test_ctrl_c_on_generate_remote_deletes_the_servers_job(hanging_server: ServerProcess, tmp_path: Path) -> None:
    env = dict(os.environ, H3BRIDGE_API_KEY=KEY, H3BRIDGE_CACHE_DIR=str(tmp_path / "cache"))
    before = {job["id"] for job in get(hanging_server, "/v1/videos").json()["data"]}
    process = subprocess.Popen(
        [sys.executable, "-m", "h3bridge.cli", "generate", "-p", "a red fox", "--width", "96", "--height", "64",
         "--frames", "22", "--steps", "2", "--remote", hanging_server.url, "-o", str(tmp_path / "out" / "a.mp4")],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # SIGINT as a terminal delivers it: a runner started in the background hands its children an
        # ignored SIGINT, and the CLI rightly keeps a signal its caller ignores (the client then never
        # stopped: a 60 s timeout in a backgrounded fresh-clone run).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Wait (on the server's own report, not a clock) until the job is in the engine's denoise loop.
        def running() -> list[dict]:
            return [job for job in get(hanging_server, "/v1/videos").json()["data"]
                    if job["id"] not in before and job["status"] == "in_progress" and job.get("phase") == "denoise enqueue"]
        assert wait_until(lambda: running(), timeout=60)
        [job] = running()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 130
    finally:
        if process.poll() is None:
            process.kill()
    assert "cancelled" in process.stderr.read()
    assert get(hanging_server, f"/v1/videos/{job['id']}").status_code == 404
    assert not (tmp_path / "out").exists()


def test_generate_remote_refusal_exits_2_with_the_servers_words(server: ServerProcess, key: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    noise = np.random.default_rng(2).integers(0, 256, (768, 1344, 3), dtype=np.uint8)
    from h3bridge.media.references import write_png
    big = write_png(noise, tmp_path / "big.png")
    capsys.readouterr()
    status = main(["generate", "-p", "a fox", "--width", "96", "--height", "64", "--frames", "22", "--quiet",
                   "--first-frame", str(big), "--remote", server.url, "-o", str(tmp_path / "a.mp4")])
    err = capsys.readouterr().err
    assert status == 2 and "is over this server's limit of 1" in err and not (tmp_path / "a.mp4").exists()


def test_the_comfy_remote_mode_renders_on_the_server(server: ServerProcess, key: str, tmp_path: Path) -> None:
    handle = adapter.check_engine_settings("", "", adapter.REMOTE, [], remote_url=server.url)
    settings = adapter.GenerateSettings(prompt="a red fox", preset="preview", width=96, height=64,
                                        length_unit="frames", frames=22)
    outputs = adapter.run_generate(handle, settings, adapter.GenerateInputs(), scratch_parent=tmp_path / "scratch",
                                   output_dir=tmp_path / "out", want_image=True)
    assert outputs.video_path.is_file() and outputs.image.shape == (22, 64, 96, 3)
    assert KEY not in repr(handle) + outputs.summary


def test_story_remote_renders_every_shot_on_the_server(server: ServerProcess, key: str, tmp_path: Path,
                                                       sim_model: Path) -> None:
    """`story --remote URL`: the shots render on the server (the anchor's frame goes up as a
    multipart first frame), the film is assembled here, and a second run keeps both shots without
    asking the server again. Shot 1 is the clip this machine makes; the anchor is shot 1's last
    frame as decoded from the server's MP4 (the Videos API carries no exact frames), so shot 2
    starts from that frame."""
    from story_helpers import CANVAS, decode_film, run_cli, story_argv, write_story
    story = write_story(tmp_path, CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n'
                                           '[[shot]]\nprompt = "b"\nframes = 22\ncontinue = "anchor"\n')
    before = len(get(server, "/v1/videos").json()["data"])
    remote_argv = [sys.executable, "-m", "h3bridge.cli", "story", str(story), "-o", str(tmp_path / "remote.mp4"),
                   "--job-dir", str(tmp_path / "remote-job"), "--json", "--remote", server.url]
    done = run_cli(remote_argv)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["rendered"] == 2 and summary["film_frames"] == 43
    assert len(get(server, "/v1/videos").json()["data"]) == before + 2
    local = run_cli(story_argv(story, tmp_path / "local.mp4", sim_engine_path(), sim_model, "--engine", "one-shot",
                               "--job-dir", str(tmp_path / "local-job"), "--only", "1"))
    assert local.returncode == 0, local.stderr
    [remote_shot_1] = (tmp_path / "remote-job").glob("shot-001-*.mp4")
    [local_shot_1] = (tmp_path / "local-job").glob("shot-001-*.mp4")
    assert remote_shot_1.read_bytes() == local_shot_1.read_bytes()
    film, _, chapters = decode_film(tmp_path / "remote.mp4")
    shot_1 = decode_video_frames(remote_shot_1, 22, 64, 32)
    assert len(film) == 43 and len(chapters) == 2
    manifest = json.loads((tmp_path / "remote-job" / "manifest.json").read_text())
    anchor = manifest["shots"][1]["request"]["first_frame"]
    import av
    with av.open(anchor) as image:
        anchor_rgb = next(image.decode(video=0)).to_ndarray(format="rgb24")
    assert np.array_equal(anchor_rgb, shot_1[-1])
    again = run_cli(remote_argv)
    assert again.returncode == 0 and json.loads(again.stdout)["rendered"] == 0
    assert len(get(server, "/v1/videos").json()["data"]) == before + 2


def test_story_remote_refuses_local_engine_flags(tmp_path: Path) -> None:
    from story_helpers import CANVAS, run_cli, write_story
    story = write_story(tmp_path, CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n')
    done = run_cli([sys.executable, "-m", "h3bridge.cli", "story", str(story), "-o", str(tmp_path / "f.mp4"),
                    "--model-dir", str(tmp_path), "--remote", "http://127.0.0.1:9"])
    assert done.returncode == 2 and "--model-dir" in done.stderr and "--remote" in done.stderr
    assert not (tmp_path / "f.mp4").exists()


def test_a_server_killed_mid_job_leaves_no_engine_once_stopped(tmp_path: Path, sim_model: Path) -> None:
    """The test servers' teardown (server_helpers.ServerProcess.stop): a server SIGKILLed while its
    engine hangs leaves that engine running, in its own process group; stopping the server takes its
    engine lock once, whose orphan recovery stops the engine, so no test leaves one behind."""
    import httpx
    import psutil
    from h3bridge.engines.process import live_group_members
    notice = tmp_path / "hung.pid"
    server = start_server(tmp_path, sim_model, extra_env={"H3_SIM_HANG_PHASE": "denoise enqueue:1",
                                                          "H3_SIM_HANG_NOTICE": str(notice)})
    try:
        with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
            http.post("/videos", json={"prompt": "a fox", "size": "96x64", "num_frames": 22,
                                       "steps": 2}).raise_for_status()
        assert wait_until(notice.exists, timeout=60)
        engines = [child for child in psutil.Process(server.process.pid).children(recursive=True)
                   if "h3-sim" in " ".join(child.cmdline()[:2])]
        assert engines
        server.kill()
        assert all(child.is_running() for child in engines)      # the crash left the engine behind
    finally:
        server.stop()
    assert all(wait_until(lambda pid=child.pid: live_group_members(pid) == []) for child in engines)


def test_sigterm_mid_job_stops_the_servers_engine_and_requeues_the_job(tmp_path: Path, sim_model: Path) -> None:
    """`h3bridge serve` stopped with SIGTERM (Ctrl-C, launchd, systemd) while its engine renders:
    the server stops that engine's process group before it exits (uvicorn re-raises the signal
    after its own shutdown, so this happens in the server's shutdown, not after it), and the job
    is queued again for the next start."""
    import httpx
    import psutil
    from h3bridge.engines.process import live_group_members
    notice = tmp_path / "hung.pid"
    server = start_server(tmp_path, sim_model, extra_env={"H3_SIM_HANG_PHASE": "denoise enqueue:1",
                                                          "H3_SIM_HANG_NOTICE": str(notice)})
    with httpx.Client(base_url=server.api, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
        job = http.post("/videos", json={"prompt": "a fox", "size": "96x64", "num_frames": 22,
                                         "steps": 2}).raise_for_status().json()
    assert wait_until(notice.exists, timeout=60)
    engines = [child.pid for child in psutil.Process(server.process.pid).children(recursive=True)
               if "h3-sim" in " ".join(child.cmdline()[:2])]
    assert engines
    os.killpg(server.process.pid, signal.SIGTERM)
    server.process.wait(60)
    # Looked at before server.stop(), whose engine-lock takeover would stop a leftover itself.
    left_running = [pid for pid in engines if live_group_members(pid)]
    server.stop()
    assert left_running == []
    restarted = start_server(tmp_path, sim_model)
    try:
        with httpx.Client(base_url=restarted.api, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
            assert http.get(f"/videos/{job['id']}").json()["status"] in ("queued", "in_progress", "completed")
    finally:
        restarted.stop()
