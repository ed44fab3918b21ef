"""Takes: `generate --takes N` (N clips, their seeds, the contact sheet, --json), a warm engine's
one load for N takes, the Python API, and storyboards with takes, --pick and resume.

Engine starts are counted with h3-sim's H3_SIM_LOG (one line per process) and denoises with its
H3_SIM_DENOISE_LOG (one line per finished denoise, in whichever process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core_helpers import fast_request, model_dir, sim_engine_path, sim_invocations  # noqa: F401
from h3bridge import GenerationCancelled, RequestError, SessionEngine, generate_takes
from h3bridge.media.decode import decode_frames_at, decode_video_frames
from h3bridge.media.png import image_from_png
from h3bridge.media.sheet import GAP, GLYPH_HEIGHT, LABEL_SCALE, draw_text, frame_indices, thumbnail
from h3bridge.story import Storyboard, run_story
from h3bridge.story.jobdir import Manifest

FAST_FLAGS = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2"]


@pytest.fixture
def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(engine starts log, denoises log) for every h3-sim this test runs."""
    starts, denoises = tmp_path / "starts.jsonl", tmp_path / "denoises.jsonl"
    monkeypatch.setenv("H3_SIM_LOG", str(starts))
    monkeypatch.setenv("H3_SIM_DENOISE_LOG", str(denoises))
    return starts, denoises


def denoised(log: Path) -> list[dict]:
    return sim_invocations(log)      # the same one-JSON-object-per-line format


def cli(*args: str, model: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "h3bridge.cli", *args, "--engine-path", str(sim_engine_path()),
               "--model-dir", str(model)]
    return subprocess.run(command, capture_output=True, text=True, env=dict(os.environ), timeout=180)


# ----------------------------------------------------------------------------- generate --takes

def test_three_takes_on_a_warm_session_load_once(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    starts, denoises = counted
    output = tmp_path / "clips" / "fox.mp4"
    done = cli("generate", "-p", "a red fox", *FAST_FLAGS, "--seed", "5", "--takes", "3", "--engine", "session",
               "-o", str(output), "--json", model=model_dir)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    takes = [tmp_path / "clips" / f"fox.take{n}.mp4" for n in (1, 2, 3)]
    sheet = tmp_path / "clips" / "fox.takes.png"
    assert [t["video_path"] for t in summary["takes"]] == [str(path) for path in takes]
    assert [t["take"] for t in summary["takes"]] == [1, 2, 3]
    assert [t["seed"] for t in summary["takes"]] == summary["seeds"] == [5, 6, 7]
    assert summary["contact_sheet"] == str(sheet)
    assert all(path.is_file() for path in takes) and sheet.is_file() and not output.exists()
    # one engine process, three denoises in it, one per seed
    assert len(sim_invocations(starts)) == 1
    assert [entry["seed"] for entry in denoised(denoises)] == [5, 6, 7]
    assert len({entry["pid"] for entry in denoised(denoises)}) == 1
    # the seeds make different clips
    first = [decode_video_frames(path, 22, 96, 64) for path in takes]
    assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[1], first[2])
    # the sheet: per take its label over its frames (PNG is lossless: exactly what was drawn)
    picture = image_from_png(sheet.read_bytes())
    label_h = GLYPH_HEIGHT * LABEL_SCALE
    indices = frame_indices(22)
    row_h = label_h + GAP + thumbnail(first[0][0]).shape[0] + GAP
    for number, (path, seed) in enumerate(zip(takes, (5, 6, 7))):
        top = GAP + number * row_h
        mask = draw_text(f"take {number + 1}  seed {seed}")
        label = picture[top:top + label_h, GAP:GAP + mask.shape[1]]
        assert np.array_equal(label.max(axis=2) > 128, mask), f"take {number + 1}'s label"
        for column, frame in enumerate(decode_frames_at(path, indices)):
            thumb = thumbnail(frame)
            y, x = top + label_h + GAP, GAP + column * (thumb.shape[1] + GAP)
            assert np.array_equal(picture[y:y + thumb.shape[0], x:x + thumb.shape[1]], thumb)


def test_one_shot_takes_start_the_engine_once_per_take(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    starts, denoises = counted
    done = cli("generate", "-p", "a red fox", *FAST_FLAGS, "--seed", "3,9,12", "-o", str(tmp_path / "c.mp4"),
               "--quiet", model=model_dir)
    assert done.returncode == 0, done.stderr
    assert len(sim_invocations(starts)) == 3
    assert [entry["seed"] for entry in denoised(denoises)] == [3, 9, 12]
    assert "take 2: " in done.stderr and "c.take2.mp4 (seed 9)" in done.stderr
    assert (tmp_path / "c.takes.png").is_file()


@pytest.mark.parametrize(("flags", "said", "fix"), [
    (["--takes", "2", "--seed", "3,9,12"], "--takes 2 but --seed lists 3 seeds", "--takes 3"),
    (["--takes", "0"], "argument --takes", "at least 1"),
    (["--takes", "21"], "argument --takes", "at most 20"),
    (["--seed", "3,x"], "argument --seed", "separated by commas"),
    (["--takes", "2", "--parallel", "2"], "--parallel 2 needs --remote URL", "add --remote URL"),
    (["--takes", "2", "--seed", "18446744073709551615"], "18446744073709551616", "--seed 18446744073709551614"),
])
def test_bad_takes_are_refused_before_any_engine_starts(model_dir: Path, tmp_path: Path, counted, flags: list[str],  # noqa: F811
                                                        said: str, fix: str) -> None:
    starts, _ = counted
    done = cli("generate", "-p", "x", *FAST_FLAGS, *flags, "-o", str(tmp_path / "c.mp4"), model=model_dir)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and fix in done.stderr, done.stderr
    assert sim_invocations(starts) == [] and list(tmp_path.glob("c*")) == []


def test_a_taken_take_name_is_refused_before_anything_renders(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    starts, _ = counted
    (tmp_path / "c.take2.mp4").write_bytes(b"mine")
    done = cli("generate", "-p", "x", *FAST_FLAGS, "--takes", "3", "-o", str(tmp_path / "c.mp4"), model=model_dir)
    assert done.returncode == 2 and "c.take2.mp4 already exists" in done.stderr and "--overwrite" in done.stderr
    assert sim_invocations(starts) == [] and (tmp_path / "c.take2.mp4").read_bytes() == b"mine"
    assert sorted(path.name for path in tmp_path.glob("c*")) == ["c.take2.mp4"]
    os.mkfifo(tmp_path / "d.takes.png")       # never replaced, even with --overwrite
    done = cli("generate", "-p", "x", *FAST_FLAGS, "--takes", "2", "--overwrite", "-o", str(tmp_path / "d.mp4"),
               model=model_dir)
    assert done.returncode == 2 and "d.takes.png already exists and is a named pipe" in done.stderr
    assert sim_invocations(starts) == []


def test_python_api_returns_every_take(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    starts, denoises = counted
    started: list[tuple[int, int]] = []
    with SessionEngine(sim_engine_path(), model_dir) as engine:
        result = generate_takes(engine, fast_request(seed=40), tmp_path / "a.mp4", takes=2, want_frames=True,
                                on_take=lambda take, seed: started.append((take, seed)))
    assert started == [(1, 40), (2, 41)] and result.seeds == [40, 41]
    assert [take.seed for take in result.takes] == [40, 41] and result.take(2) is result.takes[1]
    assert [take.video_path for take in result.takes] == [tmp_path / "a.take1.mp4", tmp_path / "a.take2.mp4"]
    assert result.contact_sheet == tmp_path / "a.takes.png" and result.sheet is not None
    assert np.array_equal(image_from_png(result.contact_sheet.read_bytes()), result.sheet)
    assert len(sim_invocations(starts)) == 1 and len(denoised(denoises)) == 2
    with pytest.raises(RequestError) as caught:
        result.take(3)
    assert caught.value.field == "pick" and "1 to 2" in caught.value.hint
    with pytest.raises(RequestError) as caught:
        generate_takes(engine, fast_request(), None, takes=2, seeds=[1, 2, 3])
    assert caught.value.field == "takes"
    with pytest.raises(RequestError) as caught:
        generate_takes(engine, fast_request(), None, takes=2, parallel=2)
    assert caught.value.field == "parallel" and "RemoteEngine" in caught.value.hint


# ----------------------------------------------------------------------------- storyboards

STORY = """width = 96
height = 64
frames = 22
steps = 2
seed = 7

[[shot]]
prompt = "a lighthouse at dusk"
takes = 3

[[shot]]
prompt = "the stairs, going up"
continue = "anchor"

[[shot]]
prompt = "the sea from the top"
takes = 2
"""


def story_cli(story: Path, *args: str, model: Path) -> subprocess.CompletedProcess:
    return cli("story", str(story), "-o", str(story.with_suffix(".mp4")), "--json", "--quiet", *args, model=model)


def test_story_takes_and_a_repick_that_renders_nothing(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    starts, denoises = counted
    story = tmp_path / "film.toml"
    story.write_text(STORY)
    done = story_cli(story, model=model_dir)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["rendered_takes"] == 6 and [len(shot["takes"]) for shot in summary["shots"]] == [3, 1, 2]
    assert [shot["pick"] for shot in summary["shots"]] == [1, 1, 1]
    board = Storyboard.from_toml(story)
    assert [t["seed"] for t in summary["shots"][0]["takes"]] == [board.seed_for(1) + n for n in range(3)]
    assert len(sim_invocations(starts)) == 1 and len(denoised(denoises)) == 6     # one warm session
    takes = [Path(t["video_path"]) for shot in summary["shots"] for t in shot["takes"]]
    assert all(path.is_file() and path.parent == tmp_path / "film.h3story" for path in takes)

    # picking another take of shot 3 (a cut) renders nothing: no engine starts, no denoise
    done = story_cli(story, "--pick", "3=2", model=model_dir)
    assert done.returncode == 0, done.stderr
    repicked = json.loads(done.stdout)
    assert repicked["rendered_takes"] == 0 and repicked["assembled"] and repicked["shots"][2]["pick"] == 2
    assert len(sim_invocations(starts)) == 1 and len(denoised(denoises)) == 6
    take2 = Path(summary["shots"][2]["takes"][1]["video_path"])
    assert repicked["shots"][2]["video_path"] == str(take2)
    # the film's last 22 frames are shot 3's take 2, not its take 1 (within H.264's error)
    film = decode_video_frames(tmp_path / "film.mp4", repicked["film_frames"], 96, 64).astype(int)[-22:]
    errors = [np.abs(film - decode_video_frames(Path(t["video_path"]), 22, 96, 64).astype(int)).mean()
              for t in summary["shots"][2]["takes"]]
    assert errors[1] < 8 < errors[0], errors       # (test_story.py: < 8 after two encodings at this size)
    manifest = Manifest.from_json((tmp_path / "film.h3story" / "manifest.json").read_text())
    assert manifest.picks == {3: 2}
    # the contact sheet in the job folder: a row per take of shots 1 and 3 (5 rows), the picks marked
    sheet = tmp_path / "film.h3story" / "takes.png"
    assert summary["contact_sheet"] == repicked["contact_sheet"] == str(sheet)
    picture = image_from_png(sheet.read_bytes())
    row_h = GLYPH_HEIGHT * LABEL_SCALE + GAP + 64 + GAP
    assert picture.shape[0] == GAP + 5 * row_h
    rows = [(1, 1), (1, 2), (1, 3), (3, 1), (3, 2)]
    for row, (shot, take) in enumerate(rows):
        seed = board.seed_for(shot) + take - 1
        picked = take == (1 if shot == 1 else 2)
        region, mask = _row_label(picture, row, row_h, f"shot {shot}  take {take}  seed {seed}"
                                  + ("  picked" if picked else ""))
        assert np.array_equal(region.max(axis=2) > 128, mask), (shot, take)

    # the pick is kept: the same command again renders and assembles nothing
    again = json.loads(story_cli(story, model=model_dir).stdout)
    assert again["rendered_takes"] == 0 and not again["assembled"] and again["shots"][2]["pick"] == 2

    # shot 2 anchors on shot 1: picking shot 1's take 2 renders shot 2 again (its start frame
    # changed), from that take's last frame, and nothing else
    done = story_cli(story, "--pick", "1=2", model=model_dir)
    assert done.returncode == 0, done.stderr
    followed = json.loads(done.stdout)
    assert followed["rendered_takes"] == 1 and [shot["reused"] for shot in followed["shots"]] == [True, False, True]
    assert len(denoised(denoises)) == 7 and denoised(denoises)[-1]["seed"] == board.seed_for(2)
    manifest = Manifest.from_json((tmp_path / "film.h3story" / "manifest.json").read_text())
    shot1_take2 = manifest.shots[1]
    assert shot1_take2.seed == board.seed_for(1) + 1 and manifest.shots[2].continued_from == shot1_take2.last_frame_sha256
    # back to take 1: shot 2's earlier render is found again, nothing renders
    back = json.loads(story_cli(story, "--pick", "1=1", model=model_dir).stdout)
    assert back["rendered_takes"] == 0 and len(denoised(denoises)) == 7


def test_a_pick_the_story_does_not_have_is_refused_in_flags(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    starts, _ = counted
    story = tmp_path / "film.toml"
    story.write_text(STORY)
    for flags, said, fix in ((["--pick", "3=5"], "--pick 3=5: shot 3 has takes 1 to 2", "e.g. --pick 3=2"),
                             (["--pick", "2=2"], "shot 2 has one take", "add takes = 2"),
                             (["--pick", "9=1"], "the story has shots 1 to 3", "e.g. --pick 3=1"),
                             (["--pick", "3"], "is not SHOT=TAKE", "--pick 2=3")):
        done = story_cli(story, *flags, model=model_dir)
        assert done.returncode == 2 and said in done.stderr and fix in done.stderr, done.stderr
    assert sim_invocations(starts) == [] and not (tmp_path / "film.h3story").exists()


@pytest.mark.parametrize("value", ["0", "21", '"3"', "2.5", "true"])
def test_storyboard_takes_must_be_a_count(tmp_path: Path, value: str) -> None:
    for text in (f"takes = {value}\n[[shot]]\nprompt = \"x\"\n", f"[[shot]]\nprompt = \"x\"\ntakes = {value}\n"):
        story = tmp_path / "s.toml"
        story.write_text(text)
        with pytest.raises(RequestError) as caught:
            Storyboard.from_toml(story)
        assert caught.value.field == "takes" and "takes = 3" in caught.value.hint


class CancelAfter:
    """An engine that cancels the story once `count` clips are finished (a kill between takes)."""

    def __init__(self, inner, count: int) -> None:
        self.inner, self.count = inner, count

    @property
    def capabilities(self):
        return self.inner.capabilities

    @property
    def model_dir(self):
        return self.inner.model_dir

    def check_supported(self, request) -> None:
        self.inner.check_supported(request)

    def generate(self, *args, **kwargs):
        if self.count == 0:
            raise GenerationCancelled("stopped between takes")
        self.count -= 1
        return self.inner.generate(*args, **kwargs)

    def close(self) -> None:
        self.inner.close()


def test_resume_keeps_finished_takes(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    _, denoises = counted
    story = tmp_path / "film.toml"
    story.write_text(STORY)
    board = Storyboard.from_toml(story)
    with SessionEngine(sim_engine_path(), model_dir) as session:
        with pytest.raises(GenerationCancelled):
            run_story(board, tmp_path / "film.mp4", engine=CancelAfter(session, 2))
        assert len(denoised(denoises)) == 2
        manifest = Manifest.from_json((tmp_path / "film.h3story" / "manifest.json").read_text())
        assert sorted(record.seed for record in manifest.takes.values()) == [board.seed_for(1), board.seed_for(1) + 1]
        result = run_story(board, tmp_path / "film.mp4", engine=session)
    # the two finished takes are kept; the other four are rendered
    assert [take.reused for take in result.shots[0].takes] == [True, True, False]
    assert result.rendered_takes == 4 and len(denoised(denoises)) == 6
    assert sorted(entry["seed"] for entry in denoised(denoises)[2:]) == sorted(
        [board.seed_for(1) + 2, board.seed_for(2), board.seed_for(3), board.seed_for(3) + 1])
    assert result.output is not None and result.output.is_file()


def _row_label(picture: np.ndarray, row: int, row_h: int, text: str) -> tuple[np.ndarray, np.ndarray]:
    """(the label region of sheet row `row`, the mask `text` draws there)."""
    top, mask = GAP + row * row_h, draw_text(text)
    label_h = GLYPH_HEIGHT * LABEL_SCALE
    return picture[top:top + label_h, GAP:GAP + mask.shape[1]], mask


def test_a_storys_contact_sheet_marks_the_take_the_film_uses(model_dir: Path, tmp_path: Path, counted) -> None:  # noqa: F811
    """The storyboard's sheet (takes.png in the job folder, the IMAGE the node shows) says which take
    of each shot is in the film: its label ends "picked", drawn in the accent colour, and a frame of
    that colour runs round its row; another pick renders nothing and moves the mark."""
    from h3bridge import OneShotEngine
    from h3bridge.media.sheet import ACCENT, INK
    from h3bridge.story.host import render_story_text
    _, denoises = counted
    text, defaults = "[22f]\nfirst shot\n\n[22f]\nsecond shot", {"width": 64, "height": 32, "steps": 2}
    with OneShotEngine(sim_engine_path(), model_dir) as engine:
        def sheet_for(picks: str) -> np.ndarray:
            done = render_story_text(text, defaults, engine=engine, jobs_root=tmp_path / "stories", job_name="film",
                                     want_frames=False, film_root=tmp_path / "films", takes=2, picks=picks)
            assert done.sheet is not None and done.sheet_rows == 4
            assert np.array_equal(image_from_png((tmp_path / "stories" / "film" / "takes.png").read_bytes()),
                                  done.sheet)
            return done.sheet

        first = sheet_for("1=2")
        seeds = [entry["seed"] for entry in denoised(denoises)]
        assert len(seeds) == 4
        row_h = GLYPH_HEIGHT * LABEL_SCALE + GAP + 32 + GAP        # 64x32 frames are drawn at their size
        expected = [(1, 1, False), (1, 2, True), (2, 1, True), (2, 2, False)]
        for row, (shot, take, picked) in enumerate(expected):
            words = f"shot {shot}  take {take}  seed {seeds[row]}" + ("  picked" if picked else "")
            region, mask = _row_label(first, row, row_h, words)
            colour = ACCENT if picked else INK
            assert np.array_equal(np.all(region == colour, axis=2), mask), f"shot {shot} take {take}'s label"
            top = GAP + row * row_h
            # the frame: the accent at the outer edge of the gaps round a picked row (left and above);
            # just above a row that follows a picked one, that row's frame (its bottom line)
            assert np.array_equal(first[top - GAP, GAP + 2], ACCENT) == picked, row
            assert np.array_equal(first[top + 3, 0], ACCENT) == picked, row
            after_picked = row > 0 and expected[row - 1][2] and not picked
            assert np.array_equal(first[top - 1, GAP + 2], ACCENT) == after_picked, row

        again = sheet_for("1=1")
        assert len(denoised(denoises)) == 4         # (shot 2 is a cut: another pick of shot 1 renders nothing)
        for row, picked in enumerate((True, False)):
            region, mask = _row_label(again, row, row_h, f"shot 1  take {row + 1}  seed {seeds[row]}"
                                      + ("  picked" if picked else ""))
            assert np.array_equal(np.all(region == (ACCENT if picked else INK), axis=2), mask), row
