"""Crash-resume: the `story` CLI SIGKILLed at random points, then run again.

Kill points are chosen by a seeded RNG among the CLI's own progress lines (one per shot and
engine phase, the shot's "done" right after its manifest write, the assembly), so the kills land
in every phase of every shot and between them, never by timing. After each kill the run is
repeated; every run may be killed again, the last of a cycle runs to the end. Checked: no shot
the manifest recorded as finished is rendered again (h3-sim's own log of its invocations, one per
shot with --one-shot); every shot's files, frames and audio are identical to an uninterrupted
run's; and the film is that run's film: the same shots joined, every frame, the identical audio.

The film's pixels are not compared bit for bit: PyAV's libx264 does not encode identical frames
to identical bytes from one encode to the next (measured: 5 encodes of the same 864x480 frames,
5 different streams; at this test's 64x32, a few in a thousand), so an uninterrupted run's film
differs from itself. What resuming must keep exact is checked exactly: the shots (the engine's
frames and audio, by the manifest's digests, and the files), the film's make-up, its frame
count, and its audio (AAC encodes reproducibly)."""
from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from core_helpers import model_dir, sim_engine_path, sim_invocations, sim_log  # noqa: F401 (fixtures)
from story_helpers import CANVAS, decode_film, run_cli, story_argv, write_story

# The smallest story with all three joins' machinery: a cut start, an anchor, a tail (a tail needs
# 56-frame shots on both sides).
CRASH_STORY = CANVAS + '''
[[shot]]
prompt = "first shot"
frames = 22

[[shot]]
prompt = "second shot"
frames = 56
continue = "anchor"

[[shot]]
prompt = "third shot"
frames = 56
continue = "tail"
'''
PROMPTS = ["first shot", "second shot", "third shot"]
KILLS = 20
KILLS_PER_CYCLE = 10


def finished_prompts(job_dir: Path) -> set[str]:
    manifest = job_dir / "manifest.json"
    if not manifest.exists():
        return set()
    return {PROMPTS[shot["index"] - 1] for shot in json.loads(manifest.read_text())["shots"]}


def manifest(job_dir: Path) -> dict:
    return json.loads((job_dir / "manifest.json").read_text())


def assert_same_shots(job_dir: Path, reference_job_dir: Path) -> None:
    """Every shot as the uninterrupted run made it: the engine's frames and audio (the manifest's
    digests of them), and its clip and last frame, byte for byte."""
    fields = ("index", "key", "seed", "frames_sha256", "audio_sha256", "frame_count", "audio_samples")
    shots, reference_shots = manifest(job_dir)["shots"], manifest(reference_job_dir)["shots"]
    assert [{f: shot[f] for f in fields} for shot in shots] == [{f: shot[f] for f in fields} for shot in reference_shots]
    for shot, reference in zip(shots, reference_shots):
        for name in ("video", "last_frame"):
            assert (job_dir / shot[name]).read_bytes() == (reference_job_dir / reference[name]).read_bytes(), \
                f"shot {shot['index']}'s {name} differs from the uninterrupted run's"


def assert_same_film(film: Path, job_dir: Path, reference_job_dir: Path, reference_frames: np.ndarray,
                     reference_audio: np.ndarray) -> None:
    """`film` is the uninterrupted run's film, encoded again: the same shots, whole, the same sound."""
    import hashlib
    frames, audio, _ = decode_film(film)
    assert frames.shape == reference_frames.shape, "the film's frames differ from the uninterrupted run's"
    assert np.array_equal(audio, reference_audio), "the film's audio differs from the uninterrupted run's"
    record, reference = manifest(job_dir)["film"], manifest(reference_job_dir)["film"]
    assert (record["shot_keys"], record["frames"], record["samples"]) == \
        (reference["shot_keys"], reference["frames"], reference["samples"])
    assert record["sha256"] == hashlib.sha256(film.read_bytes()).hexdigest(), "the film is not the one published"


def rendered_prompts(log: Path, since: int) -> list[str]:
    return [entry["argv"][entry["argv"].index("-p") + 1] for entry in sim_invocations(log)[since:]]


def run_until_line(argv: list[str], kill_after: int | None) -> tuple[bool, str]:
    """Run the CLI; SIGKILL it as its `kill_after`-th stderr line arrives. (killed, last line)."""
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    last = ""
    killed = False
    assert process.stderr is not None
    for number, line in enumerate(process.stderr, 1):
        last = line.strip()
        if kill_after is not None and number == kill_after:
            process.kill()
            killed = True
            break
    process.stderr.close()
    status = process.wait(timeout=120)
    if not killed:
        assert status == 0, f"the story failed: {last}"
    return killed, last


# A fixed amount of work (20 kills, each a fresh CLI process, then the runs that finish the film),
# no timing: about 90 s on an idle 2-core machine, over 300 s (the suite's default) on a loaded one.
@pytest.mark.timeout(1200)
def test_sigkill_at_random_points_then_resume(tmp_path: Path, model_dir: Path, sim_log: Path,
                                             monkeypatch) -> None:
    started = time.monotonic()
    monkeypatch.setenv("H3_SIM_TIME_SCALE", "0")      # no simulated phase durations: only the work
    rng = random.Random(12)
    engine = sim_engine_path()
    story = write_story(tmp_path, CRASH_STORY)
    reference_run = run_cli(story_argv(story, tmp_path / "reference.mp4", engine, model_dir, "--engine", "one-shot"))
    assert reference_run.returncode == 0, reference_run.stderr
    lines_per_shot = len(reference_run.stderr.splitlines()) / len(PROMPTS)
    reference_frames, reference_audio, _ = decode_film(tmp_path / "reference.mp4")
    reference_job_dir = tmp_path / "reference.h3story"
    assert rendered_prompts(sim_log, 0) == PROMPTS

    kills: list[str] = []
    cycle = 0
    while len(kills) < KILLS:
        cycle += 1
        film, job_dir = tmp_path / f"film-{cycle}.mp4", tmp_path / f"film-{cycle}.h3story"
        argv = story_argv(story, film, engine, model_dir, "--engine", "one-shot")
        in_cycle = 0
        while True:
            finished = finished_prompts(job_dir)
            before = len(sim_invocations(sim_log))
            remaining = len(PROMPTS) - len(finished)
            kill_after = None
            if in_cycle < KILLS_PER_CYCLE and len(kills) < KILLS:
                kill_after = rng.randint(1, max(1, round(lines_per_shot * remaining + 2)))
            killed, last = run_until_line(argv, kill_after)
            again = rendered_prompts(sim_log, before)
            assert not set(again) & finished, f"finished shots rendered again: {set(again) & finished}"
            assert len(again) == len(set(again)), f"a shot rendered twice in one run: {again}"
            if film.exists():          # published only whole, never a partial film under its name
                assert_same_film(film, job_dir, reference_job_dir, reference_frames, reference_audio)
            if not killed:
                break
            kills.append(last)
            in_cycle += 1
        assert_same_shots(job_dir, reference_job_dir)
        assert_same_film(film, job_dir, reference_job_dir, reference_frames, reference_audio)
        assert finished_prompts(job_dir) == set(PROMPTS)
        # nothing half-written stays behind: the runs after a kill cleared what it left
        assert not [p.name for p in job_dir.iterdir() if p.name.startswith(".") and p.name != ".lock"]
        assert not list(tmp_path.glob(f".{film.stem}.partial-*"))
    phases = sorted({line.split(": ")[-1].split(" (")[0] for line in kills})
    print(f"{len(kills)} kills in {cycle} cycles, {time.monotonic() - started:.1f} s; phases hit: {phases}")
    assert len(kills) >= KILLS


def test_ctrl_c_stops_cleanly_and_the_next_run_resumes(tmp_path: Path, model_dir: Path, sim_log: Path) -> None:
    """SIGINT while shot 2 renders: exit 130 saying how to resume, shot 1 kept, no engine left
    running, nothing posing as a shot or a film; the same command then renders shots 2-3 only."""
    import signal

    from h3bridge.engines.process import live_group_members
    story = write_story(tmp_path, CRASH_STORY)
    argv = story_argv(story, tmp_path / "film.mp4", sim_engine_path(), model_dir, "--engine", "one-shot")
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line.startswith("h3bridge: shot 2/3: denoise"):
            process.send_signal(signal.SIGINT)
            break
    rest = process.stderr.read()
    status = process.wait(timeout=60)
    assert status == 130, "".join(seen) + rest
    assert "run the same command again to resume" in rest
    engines = [entry["pid"] for entry in sim_invocations(sim_log)]
    assert len(engines) == 2 and all(live_group_members(pid) == [] for pid in engines)
    assert finished_prompts(tmp_path / "film.h3story") == {"first shot"}
    assert not (tmp_path / "film.mp4").exists()
    assert not list((tmp_path / "film.h3story").glob("shot-002-*.mp4"))
    resumed = run_cli(argv)
    assert resumed.returncode == 0, resumed.stderr
    assert rendered_prompts(sim_log, 2) == ["second shot", "third shot"]
