"""Storyboards against h3-sim with fixture models: parsing and the whole-story check, a 4-shot
story (anchor, cut, tail) end to end with its film probed by PyAV, resume after edits and
damage, review (--redo, --only), the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from h3bridge import ModelError, OneShotEngine, RequestError, SessionEngine
from h3bridge.geometry import FPS, SAMPLE_RATE
from h3bridge.media.decode import decode_audio, decode_video_frames
from h3bridge.sim.fixture import write_fixture_model
from h3bridge.story import Continuation, Manifest, Storyboard, plan_story, run_story, tail_frames

from core_helpers import model_dir, sim_engine_path, sim_invocations, sim_log  # noqa: F401 (fixtures)
from story_helpers import FOUR_SHOTS, CANVAS, decode_film, run_cli, story_argv, write_story


class Recording:
    """An Engine that hands every request to `inner` and keeps what it returned (the engine's
    own frames, before any encoding of ours)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.results = []

    @property
    def capabilities(self):
        return self.inner.capabilities

    @property
    def model_dir(self):
        return self.inner.model_dir

    def check_supported(self, request) -> None:
        self.inner.check_supported(request)

    def generate(self, request, output=None, **options):
        result = self.inner.generate(request, output, **options)
        self.results.append(result)
        return result

    def close(self) -> None:
        self.inner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def prompts_rendered(log: Path) -> list[str]:
    return [entry["argv"][entry["argv"].index("-p") + 1] for entry in sim_invocations(log)]


# ----------------------------------------------------------------------------- the storyboard


def test_toml_defaults_apply_to_every_shot_and_seeds_are_stable(tmp_path: Path) -> None:
    story = Storyboard.from_toml(write_story(tmp_path))
    assert [shot.continuation for shot in story.shots] == [Continuation.CUT, Continuation.ANCHOR,
                                                           Continuation.CUT, Continuation.TAIL]
    request = story.base_request(2)
    assert (request.width, request.height, request.steps, request.frame_count) == (64, 32, 2, 22)
    # derived from the story's seed and the position: the same when another shot changes
    edited = Storyboard.from_toml(write_story(tmp_path, FOUR_SHOTS.replace("the open sea", "a storm"), "b.toml"))
    assert [story.seed_for(i) for i in (1, 2, 3, 4)] == [edited.seed_for(i) for i in (1, 2, 3, 4)]
    assert len({story.seed_for(i) for i in (1, 2, 3, 4)}) == 4
    explicit = Storyboard.from_dict({"seed": 1, "shot": [{"prompt": "a", "seed": 77}, {"prompt": "b"}]})
    assert explicit.seed_for(1) == 77 and explicit.seed_for(2) != 77
    # a shot's own length replaces the story's (frames vs seconds)
    mixed = Storyboard.from_dict({"seconds": 2.0, "shot": [{"prompt": "a", "frames": 22}, {"prompt": "b"}]})
    assert mixed.base_request(1).frame_count == 22 and mixed.base_request(2).frame_count == 56


@pytest.mark.parametrize("text, message", [
    (CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\ncontinue = "anchor"\n', "no shot before it"),
    (CANVAS + '[[shot]]\nprompt = "a"\nframse = 22\n', "unknown key 'framse'"),
    (CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n[[shot]]\nprompt = "b"\ncontinue = "fade"\n', "'fade'"),
    (CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n[[shot]]\nprompt = "b"\nframes = 56\ncontinue = "tail"\n',
     "has only 22 frames"),
    (CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n[[shot]]\nprompt = "b"\nframes = 23\n', "shot 2: frames=23"),
    (CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n[[shot]]\nprompt = "b"\nframes = 22\nwidth = 96\n',
     "shot 2 is 96x32, but the film is 64x32"),
    (CANVAS + '[[shot]]\nprompt = "a"\nframes = 56\n[[shot]]\nprompt = "b"\nframes = 22\ncontinue = "tail"\n',
     "shot 2: the tail of shot 1 (continue = \"tail\"): a video soundtrack needs at least 56 output frames"),
    ('[[shot]]\nprompt = "a"\ntail_seconds = 1\n', "tail_seconds=1 must be"),
    ("width = 64\n", "no shots"),
])
def test_every_shot_is_checked_before_anything_runs(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(RequestError) as caught:
        plan_story(Storyboard.from_toml(write_story(tmp_path, text)))
    assert message in str(caught.value)
    assert caught.value.hint


def test_default_tail_is_the_shortest_legal_reference_of_two_seconds() -> None:
    # 2 s is 48 frames; upstream trims reference videos to 5 + 17n and needs 2 s of soundtrack
    assert tail_frames(2.0) == 56 and tail_frames(3.0) == 73


def test_tail_without_ref2va_is_refused_before_the_first_shot(tmp_path: Path, sim_log: Path) -> None:
    model = write_fixture_model(tmp_path / "FL2VA-only", ref2va=False)
    story = Storyboard.from_toml(write_story(tmp_path))
    with OneShotEngine(sim_engine_path(), model) as engine, pytest.raises(ModelError) as caught:
        run_story(story, tmp_path / "film.mp4", engine=engine)
    assert 'shot 4: continue = "tail"' in caught.value.message and "Ref2VA" in caught.value.message
    assert "download the Ref2VA/" in caught.value.hint
    assert sim_invocations(sim_log) == []          # nothing rendered
    assert not (tmp_path / "film.h3story" / "manifest.json").exists()


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def four_shots(tmp_path_factory: pytest.TempPathFactory, model_dir: Path):
    """The 4-shot story rendered once for the module, one-shot (one h3-sim run per shot), with
    the engine's own results kept: (folder, story, result, engine results, h3-sim log)."""
    folder = tmp_path_factory.mktemp("four-shots")
    story = Storyboard.from_toml(write_story(folder))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("H3_SIM_LOG", str(folder / "sim-log.jsonl"))
        with Recording(OneShotEngine(sim_engine_path(), model_dir)) as engine:
            result = run_story(story, folder / "film.mp4", engine=engine)
    return folder, story, result, engine.results, folder / "sim-log.jsonl"


def test_four_shot_story_end_to_end(four_shots) -> None:
    folder, story, result, shots, log = four_shots
    film_path = folder / "film.mp4"
    assert [r.frame_count for r in shots] == [56, 22, 56, 56] and result.rendered == 4
    # shot 2 anchors on shot 1: its first frame IS shot 1's last frame, before any encoding
    assert np.array_equal(shots[1].frames[0], shots[0].frames[-1])
    assert not np.array_equal(shots[2].frames[0], shots[1].frames[-1])       # a cut is independent
    argv = [entry["argv"] for entry in sim_invocations(log)]
    assert "--first-frame" in argv[1] and "--first-frame" not in argv[2]
    # shot 4 conditions on shot 3's last 56 frames (as its MP4 holds them) with their sound
    # (--ref-video, not --ref-silent-video)
    tail = Path(argv[3][argv[3].index("--ref-video") + 1])
    tail_video = decode_video_frames(tail, 56, 64, 32).astype(int)
    shot3 = decode_video_frames(result.shots[2].video_path, 56, 64, 32).astype(int)
    assert np.abs(tail_video - shot3).mean() < 1.5
    tail_audio = decode_audio(tail)
    end = 56 * SAMPLE_RATE // FPS
    assert abs(tail_audio.shape[1] - end) <= 1024
    reference = shots[2].audio[:, end - end:end]
    assert np.corrcoef(tail_audio[0, 2000:end - 2000], reference[0, 2000:end - 2000])[0, 1] > 0.95

    frames, audio, chapters = decode_film(film_path)
    expected_frames = 56 + 22 + 56 + 56 - 1       # the anchor's repeated frame is dropped
    assert frames.shape == (expected_frames, 32, 64, 3) and result.film_frames == expected_frames
    assert abs(audio.shape[1] - expected_frames * SAMPLE_RATE / FPS) <= 1024     # one AAC frame of padding
    assert [c["metadata"]["title"].split(":")[0] for c in chapters] == ["Shot 1", "Shot 2", "Shot 3", "Shot 4"]
    # the film is the shots in order: shot 2 starts at its second frame
    shot1 = decode_video_frames(result.shots[0].video_path, 56, 64, 32)
    shot2 = decode_video_frames(result.shots[1].video_path, 22, 64, 32)
    expected = np.concatenate([shot1, shot2[1:]]).astype(int)
    candidates = [("shot1", 54), ("shot1", 55), ("shot2", 0), ("shot2", 1), ("shot2", 2)]
    for film_index, source in ((55, ("shot1", 55)), (56, ("shot2", 1)), (57, ("shot2", 2))):
        errors = {c: np.abs(frames[film_index].astype(int) - (shot1 if c[0] == "shot1" else shot2)[c[1]]).mean()
                  for c in candidates}
        assert min(errors, key=errors.get) == source, (film_index, errors)
    assert np.abs(frames[:77].astype(int) - expected).mean() < 8      # within H.264 at 64x32
    # no jump in the sound at the joins beyond the crossfade: nowhere near a join does the signal
    # step further than it does inside the shots
    joins = [56 + 21, 56 + 21 + 56]                       # cut and tail joins (the anchor join is shot 1|2)
    joins = [56] + joins
    step = np.abs(np.diff(audio[:, :expected_frames * SAMPLE_RATE // FPS], axis=1)).max(axis=0)
    near = np.zeros(step.shape, bool)
    for join in joins:
        at = join * SAMPLE_RATE // FPS
        near[at - 3000:at + 3000] = True
    near[:2048] = True     # the encoder's start
    inside = step[~near].max()
    at_joins = step[near[:len(step)] & (np.arange(len(step)) > 2048)].max()
    assert at_joins <= inside * 1.25, (at_joins, inside)

    manifest = Manifest.from_json((folder / "film.h3story" / "manifest.json").read_text())
    import hashlib
    for index, shot in enumerate(shots, 1):
        record = manifest.shots[index]
        assert record.frames_sha256 == hashlib.sha256(shot.frames.tobytes()).hexdigest()
        assert record.audio_sha256 == hashlib.sha256(shot.audio.tobytes()).hexdigest()
        assert record.seed == story.seed_for(index) and record.engine["kind"] == "Recording"
    assert manifest.film is not None and manifest.film.frames == expected_frames


def test_hard_joins_when_asked(tmp_path: Path, model_dir: Path) -> None:
    """crossfade_cuts = false: the cut's sound changes in one sample; with the crossfade it does not."""
    text = CANVAS + '[[shot]]\nprompt = "low"\nframes = 22\n[[shot]]\nprompt = "high"\nframes = 22\n'
    steps = {}
    for fade in ("true", "false"):
        story = Storyboard.from_toml(write_story(tmp_path, f"crossfade_cuts = {fade}\n" + text, f"{fade}.toml"))
        with OneShotEngine(sim_engine_path(), model_dir) as engine:
            result = run_story(story, tmp_path / f"{fade}.mp4", engine=engine)
        unfaded = result.shots[0].video_path, result.shots[1].video_path
        joined = np.concatenate([decode_audio(unfaded[0])[:, :22 * 4000 // 3], decode_audio(unfaded[1])], axis=1)
        film = decode_audio(tmp_path / f"{fade}.mp4")
        at = 22 * SAMPLE_RATE // FPS
        steps[fade] = np.abs(film[:, at - 1500:at + 1500] - joined[:, at - 1500:at + 1500]).max()
    assert steps["false"] < 0.05 < steps["true"]      # hard: the plain concatenation; faded: mixed


def test_warm_session_is_used_and_a_second_run_renders_nothing(tmp_path: Path, model_dir: Path) -> None:
    story = Storyboard.from_toml(write_story(tmp_path, CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n'
                                            '[[shot]]\nprompt = "b"\nframes = 22\ncontinue = "anchor"\n'))
    with SessionEngine(sim_engine_path(), model_dir) as session:
        first = run_story(story, tmp_path / "film.mp4", engine=session)
        again = run_story(story, tmp_path / "film.mp4", engine=session)
        assert session.starts == 1          # one warm h3 for both shots
    assert first.rendered == 2 and again.rendered == 0 and not again.assembled
    manifest = json.loads((tmp_path / "film.h3story" / "manifest.json").read_text())
    assert {shot["engine"]["kind"] for shot in manifest["shots"]} == {"SessionEngine"}


# ----------------------------------------------------------------------------- resume and review


@pytest.fixture
def rendered(four_shots, tmp_path: Path, sim_log: Path):
    """A private copy of the rendered 4-shot story (its storyboard, film and job directory)."""
    import shutil
    folder = four_shots[0]
    for name in ("story.toml", "film.mp4"):
        shutil.copy2(folder / name, tmp_path / name)
    shutil.copytree(folder / "film.h3story", tmp_path / "film.h3story")
    return tmp_path / "story.toml", tmp_path / "film.mp4"


def _rerun(story_path: Path, film: Path, model_dir: Path, **options):
    notices: list[str] = []
    with OneShotEngine(sim_engine_path(), model_dir) as engine:
        result = run_story(Storyboard.from_toml(story_path), film, engine=engine, on_notice=notices.append, **options)
    return result, notices


def test_editing_shot_3_renders_shots_3_and_4_only(rendered, model_dir: Path, sim_log: Path) -> None:
    story_path, film = rendered
    before = film.read_bytes()
    story_path.write_text(FOUR_SHOTS.replace("the open sea", "the open sea under a storm"))
    result, _ = _rerun(story_path, film, model_dir)
    assert prompts_rendered(sim_log) == ["the open sea under a storm", "waves break on the rocks"]
    assert [shot.reused for shot in result.shots] == [True, True, False, False]
    assert result.assembled and film.read_bytes() != before
    # editing shot 2 (anchored on 1; shot 3 is a cut): shot 2 alone
    sim_log.unlink()
    story_path.write_text(story_path.read_text().replace("climbs the stairs", "climbs the spiral stairs"))
    _rerun(story_path, film, model_dir)
    assert prompts_rendered(sim_log) == ["the camera climbs the spiral stairs"]


def test_undoing_an_edit_takes_the_earlier_takes_again(rendered, model_dir: Path, sim_log: Path) -> None:
    """Takes are kept by content (issue 20 item 1): editing shot 3 (which shot 4 continues from) and
    undoing the edit renders nothing the second time: shots 3 and 4 are their first takes again."""
    story_path, film = rendered
    job_dir = film.parent / "film.h3story"
    first_takes = json.loads((job_dir / "manifest.json").read_text())["shots"]
    story_path.write_text(FOUR_SHOTS.replace("the open sea", "the open sea under a storm"))
    _rerun(story_path, film, model_dir)
    assert prompts_rendered(sim_log) == ["the open sea under a storm", "waves break on the rocks"]
    sim_log.unlink()
    story_path.write_text(FOUR_SHOTS)                          # the edit undone
    result, notices = _rerun(story_path, film, model_dir)
    assert sim_invocations(sim_log) == [] and [shot.reused for shot in result.shots] == [True] * 4
    manifest = json.loads((job_dir / "manifest.json").read_text())
    assert manifest["shots"] == first_takes and result.assembled       # the film is made of them again
    assert len(manifest["takes"]) == 6 and all(Path(job_dir / take["video"]).is_file() for take in manifest["takes"])
    assert [shot.video_path.name for shot in result.shots] == [take["video"] for take in first_takes]
    # and the edit again: its takes are kept as well
    story_path.write_text(FOUR_SHOTS.replace("the open sea", "the open sea under a storm"))
    sim_log.unlink(missing_ok=True)
    _rerun(story_path, film, model_dir)
    assert sim_invocations(sim_log) == []


def test_a_corrupted_shot_file_is_detected_and_redone(rendered, model_dir: Path, sim_log: Path) -> None:
    story_path, film = rendered
    reference = decode_film(film)
    job_dir = film.parent / "film.h3story"
    shots_before = json.loads((job_dir / "manifest.json").read_text())["shots"]
    video = sorted(job_dir.glob("shot-003-*.mp4"))[0]
    original = video.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF
    video.write_bytes(bytes(data))
    result, notices = _rerun(story_path, film, model_dir)
    assert prompts_rendered(sim_log) == ["the open sea"]          # shot 3 only: the engine is deterministic,
    assert any("shot 3" in n and "checksum" in n for n in notices)  # so shot 4's tail input is unchanged
    # Shot 3 is made again exactly; the film, encoded again, holds the same frames and sound. Its
    # pixels are not compared bit for bit: PyAV's libx264 does not encode identical frames to
    # identical bytes every time (see test_story_resume.py).
    shots_after = json.loads((job_dir / "manifest.json").read_text())["shots"]
    digests = ("frames_sha256", "audio_sha256", "video_sha256", "last_frame_sha256")
    assert [[shot[d] for d in digests] for shot in shots_after] == [[shot[d] for d in digests] for shot in shots_before]
    assert video.read_bytes() == original
    frames, audio, _ = decode_film(film)
    assert frames.shape == reference[0].shape and np.array_equal(audio, reference[1])


def test_redo_rerolls_one_shot_and_what_continues_from_it(rendered, model_dir: Path, sim_log: Path) -> None:
    story_path, film = rendered
    result, _ = _rerun(story_path, film, model_dir, redo=1, redo_seed=99)
    assert prompts_rendered(sim_log) == ["a lighthouse at dusk", "the camera climbs the stairs"]  # 2 anchors on 1
    argv = sim_invocations(sim_log)[0]["argv"]
    assert argv[argv.index("--seed") + 1] == "99" and result.shots[0].seed == 99
    sim_log.unlink()
    again, _ = _rerun(story_path, film, model_dir)          # the re-rolled seed is kept
    assert sim_invocations(sim_log) == [] and again.shots[0].seed == 99
    # the first take is still there for comparison
    assert len(list((film.parent / "film.h3story").glob("shot-001-*.mp4"))) == 2


def test_only_renders_up_to_shot_n(tmp_path: Path, model_dir: Path, sim_log: Path) -> None:
    story_path = write_story(tmp_path)
    result, _ = _rerun(story_path, tmp_path / "film.mp4", model_dir, only=2)
    assert len(sim_invocations(sim_log)) == 2 and result.output is None
    assert not (tmp_path / "film.mp4").exists() and all(s.video_path.exists() for s in result.shots)


def test_existing_film_not_made_by_the_job_is_kept(tmp_path: Path, model_dir: Path, sim_log: Path) -> None:
    from h3bridge import OutputExistsError
    (tmp_path / "film.mp4").write_bytes(b"mine")
    with pytest.raises(OutputExistsError):
        _rerun(write_story(tmp_path), tmp_path / "film.mp4", model_dir)
    assert (tmp_path / "film.mp4").read_bytes() == b"mine" and sim_invocations(sim_log) == []


# ----------------------------------------------------------------------------- the CLI


def test_cli_story_json_summary_and_resume(tmp_path: Path, model_dir: Path, sim_log: Path) -> None:
    story = write_story(tmp_path, CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n'
                                           '[[shot]]\nprompt = "b"\nframes = 22\ncontinue = "anchor"\n')
    argv = story_argv(story, tmp_path / "film.mp4", sim_engine_path(), model_dir, "--json")
    done = run_cli(argv)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["film_frames"] == 43 and summary["rendered"] == 2 and summary["assembled"]
    assert "shot 2/2" in done.stderr and "ETA" in done.stderr
    again = run_cli(argv)
    assert json.loads(again.stdout)["rendered"] == 0 and "kept from the job directory" in again.stderr


def test_cli_resume_says_up_to_date_once(tmp_path: Path, model_dir: Path, sim_log: Path) -> None:
    story = write_story(tmp_path, CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n')
    argv = story_argv(story, tmp_path / "film.mp4", sim_engine_path(), model_dir, "--quiet")
    assert run_cli(argv).returncode == 0
    again = run_cli(argv)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("is up to date") == 1, again.stderr
    assert f"kept {tmp_path / 'film.mp4'}: 22 frames" in again.stderr


def test_cli_refusals_name_flags_and_exit_2(tmp_path: Path, model_dir: Path, sim_log: Path) -> None:
    story = write_story(tmp_path)
    bad = run_cli(story_argv(story, tmp_path / "f.mp4", sim_engine_path(), model_dir, "--redo", "9"))
    assert bad.returncode == 2 and "--redo 9" in bad.stderr and "1 to 4" in bad.stderr
    seed = run_cli(story_argv(story, tmp_path / "f.mp4", sim_engine_path(), model_dir, "--seed", "3"))
    assert seed.returncode == 2 and "--redo" in seed.stderr
    broken = write_story(tmp_path, "width = \n", "broken.toml")
    syntax = run_cli(story_argv(broken, tmp_path / "f.mp4", sim_engine_path(), model_dir))
    assert syntax.returncode == 2 and "not valid TOML" in syntax.stderr
    assert sim_invocations(sim_log) == []


def test_the_docs_storyboard_example_is_a_valid_story() -> None:
    import re
    page = (Path(__file__).resolve().parent.parent / "docs" / "storyboards.md").read_text()
    [toml] = re.findall(r"```toml\n(.*?)```", page, flags=re.S)
    import tomllib
    story = Storyboard.from_dict(tomllib.loads(toml))
    plan = plan_story(story)
    assert [s.continuation.value for s in plan.shots] == ["cut", "anchor", "tail", "cut"]
    assert plan.shot(3).tail_frames == 56


# ----------------------------------------------------------------------------- shots as text (the node's input)


def test_shots_as_text_blocks() -> None:
    from h3bridge.story.text import storyboard_from_text
    story = storyboard_from_text("[22f]\nA lighthouse\nat dusk\n\n[56f anchor seed=3]\nstairs\n\n"
                                 "[2.5s tail tail_seconds=2.5]\nsea\n\nno settings here",
                                 {"width": 64, "height": 32})
    assert [s.prompt for s in story.shots] == ["A lighthouse at dusk", "stairs", "sea", "no settings here"]
    assert [s.continuation.value for s in story.shots] == ["cut", "anchor", "tail", "cut"]
    assert story.seed_for(2) == 3 and story.base_request(3).frame_count == 73 and story.shots[2].tail_seconds == 2.5
    with pytest.raises(RequestError, match="'slowly' in \\[5s slowly\\]"):
        storyboard_from_text("[5s slowly]\nx")
    with pytest.raises(RequestError, match="no prompt"):
        storyboard_from_text("[5s]")


def test_host_text_story_resumes_and_streams_arrays(tmp_path: Path, model_dir: Path, sim_log: Path) -> None:
    from h3bridge.story.host import render_story_text
    text = "[22f]\nfirst\n\n[22f anchor]\nsecond"
    defaults = {"width": 64, "height": 32, "steps": 2}
    with OneShotEngine(sim_engine_path(), model_dir) as engine:
        first = render_story_text(text, defaults, engine=engine, fallback=None, jobs_root=tmp_path,
                                  job_name="film-1", want_frames=True)
        assert not (tmp_path / "film-1" / ".lock").exists()        # nothing hidden stays (issue 30)
        again = render_story_text(text, defaults, engine=engine, fallback=None, jobs_root=tmp_path,
                                  job_name="film-1", want_frames=False)
        with pytest.raises(RequestError, match="job name"):
            render_story_text(text, defaults, engine=engine, fallback=None, jobs_root=tmp_path,
                              job_name="../elsewhere", want_frames=False)
    assert len(sim_invocations(sim_log)) == 2 and again.result.rendered == 0 and again.frames is None
    assert first.frames.shape == (43, 32, 64, 3) and first.audio.shape == (2, 43 * SAMPLE_RATE // FPS)
    frames, audio, _ = decode_film(first.video_path)
    assert frames.shape == first.frames.shape
    assert np.abs(frames.astype(int) - first.frames).mean() < 8          # the film is these frames, encoded once
    assert np.array_equal(first.audio, again.audio)


def test_a_host_that_saves_the_film_itself_gets_it_in_its_temporary_folder_once(
        tmp_path: Path, model_dir: Path, sim_log: Path) -> None:
    """ComfyUI's Save Video keeps the film: the story writes it to the host's temp folder, not a
    second copy beside the job folder in output (issue 30); shots stay in the job folder."""
    from h3bridge.story.host import render_story_text
    output, temp = tmp_path / "output", tmp_path / "temp"
    with OneShotEngine(sim_engine_path(), model_dir) as engine:
        done = render_story_text("[22f]\nfirst", {"width": 64, "height": 32, "steps": 2}, engine=engine,
                                 fallback=None, jobs_root=output, job_name="film-2", want_frames=False,
                                 film_root=temp)
        assert done.video_path == temp / "film-2.mp4" and done.video_path.is_file()
        assert [p.name for p in output.rglob("*.mp4")] == [p.name for p in (output / "film-2").glob("shot-*.mp4")]
        done.video_path.unlink()         # ComfyUI empties its temp folder at start: assembled again, not rendered
        again = render_story_text("[22f]\nfirst", {"width": 64, "height": 32, "steps": 2}, engine=engine,
                                  fallback=None, jobs_root=output, job_name="film-2", want_frames=False,
                                  film_root=temp)
    assert again.video_path.is_file() and again.result.rendered == 0 and len(sim_invocations(sim_log)) == 1


def test_default_engine_is_the_warm_shared_session(tmp_path: Path, model_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from h3bridge import shared_session
    monkeypatch.setenv("H3_BIN", str(sim_engine_path()))
    monkeypatch.setenv("H3_MODEL_DIR", str(model_dir))
    story = Storyboard.from_dict({"width": 64, "height": 32, "steps": 2,
                                  "shot": [{"prompt": "one line", "frames": 22},
                                           {"prompt": "two\nlines", "frames": 22, "continue": "anchor"}]})
    notices: list[str] = []
    try:
        result = run_story(story, tmp_path / "film.mp4", on_notice=notices.append)
    finally:
        shared_session().close()
    manifest = Manifest.from_json((tmp_path / "film.h3story" / "manifest.json").read_text())
    # the warm session by default; the multi-line prompt (h3's session reads one line) runs one-shot
    assert [manifest.shots[i].engine["kind"] for i in (1, 2)] == ["SessionEngine", "OneShotEngine"]
    assert any("one-shot instead" in n for n in notices) and result.rendered == 2


def test_memory_plan_of_the_most_demanding_shot_is_checked_first(model_dir: Path) -> None:
    from h3bridge import MemoryPlanError
    from h3bridge.model.memory import MachineFacts
    story = Storyboard.from_dict({"width": 1344, "height": 768, "shot": [
        {"prompt": "short", "frames": 22}, {"prompt": "long", "frames": 362}, {"prompt": "again", "frames": 22}]})
    eight_gb = MachineFacts.mac(8)
    with pytest.raises(MemoryPlanError) as caught:
        plan_story(story, model_dir, machine=eight_gb)
    assert caught.value.message.startswith("shot 2 (the story's most demanding)") and caught.value.hint
    forced = plan_story(story, model_dir, machine=eight_gb, force=True)
    assert forced.most_demanding == 2 and not forced.memory_plan.fits
    short = Storyboard.from_dict({"width": 1344, "height": 768, "shot": [{"prompt": "short", "frames": 22}]})
    assert plan_story(short, model_dir, machine=eight_gb).memory_plan.fits


def test_changing_only_the_joins_reassembles_without_rendering(rendered, model_dir: Path, sim_log: Path) -> None:
    story_path, film = rendered
    before = film.read_bytes()
    story_path.write_text("crossfade_frames = 0\n" + story_path.read_text())
    result, _ = _rerun(story_path, film, model_dir)
    assert result.rendered == 0 and result.assembled and film.read_bytes() != before
    assert sim_invocations(sim_log) == []


def test_chapters_file_for_a_pyav_without_chapter_writing(rendered, tmp_path: Path) -> None:
    """The fallback file is FFmpeg's FFMETADATA: ffmpeg embeds it and the chapters read back."""
    import subprocess

    from h3bridge.story.assemble import write_chapters_file
    _, film = rendered
    chapters = [(0, 56, "Shot 1: a = b; #1"), (56, 189, "Shot 2: done")]
    path = write_chapters_file(film, chapters)
    assert path.name == "film.mp4.chapters.txt"
    out = tmp_path / "embedded.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-i", str(film), "-i", str(path), "-map", "0", "-map_metadata", "1",
                    "-map_chapters", "1", "-codec", "copy", str(out)], check=True)
    read = decode_film(out)[2]
    assert [c["metadata"]["title"] for c in read] == ["Shot 1: a = b; #1", "Shot 2: done"]
    assert [round(float(c["start"] * c["time_base"]) * FPS) for c in read] == [0, 56]
