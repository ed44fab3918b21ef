"""What a storyboard and its job folder may hold (issue 19 items 3, 7 and 8): special files are never
read, only the job folder's own files count, a refused storyboard leaves no job folder, and
whatever a storyboard holds, only the project's own errors come out."""
from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3bridge import OneShotEngine, RequestError
from h3bridge.errors import DiskError, H3BridgeError, OutputExistsError
from h3bridge.story import Storyboard, plan_story, run_story
from h3bridge.story import jobdir as jobdir_module
from h3bridge.story.jobdir import file_sha256
from h3bridge.story.storyboard import REQUEST_KEYS, SHOT_KEYS, STORY_KEYS

from core_helpers import model_dir, not_regular_outputs, sim_engine_path, sim_invocations, sim_log  # noqa: F401 (fixtures)
from story_helpers import CANVAS, write_story

pytestmark = pytest.mark.timeout(120)     # on the old code, a FIFO hung these forever

ONE_SHOT = CANVAS + '[[shot]]\nprompt = "a lighthouse"\nframes = 22\n'


def special(path: Path, what: str) -> Path:
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


# ----------------------------------------------------------------------------- special files


@pytest.mark.parametrize("what", ["fifo", "dev-zero"])
def test_a_first_frame_that_is_a_fifo_or_a_device_is_refused_not_hashed(tmp_path: Path, what: str) -> None:
    special(tmp_path / "start.png", what)
    story = Storyboard.from_toml(write_story(tmp_path, CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n'
                                                               'first_frame = "start.png"\n'))
    with pytest.raises(RequestError) as caught:
        plan_story(story)
    assert caught.value.field == "first_frame" and "start.png" in caught.value.message
    assert "not a file" in caught.value.message


def test_a_storyboard_path_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    fifo = special(tmp_path / "story.toml", "fifo")
    with pytest.raises(RequestError, match=r"named pipe \(FIFO\), not a file") as caught:
        Storyboard.from_toml(fifo)
    assert caught.value.field == "storyboard" and caught.value.hint


@pytest.fixture
def rendered_once(tmp_path: Path, model_dir: Path):  # noqa: F811
    """A one-shot story rendered into tmp_path/film.mp4: (story path, film, job folder, its manifest)."""
    story = write_story(tmp_path, ONE_SHOT)
    with OneShotEngine(sim_engine_path(), model_dir) as engine:
        run_story(Storyboard.from_toml(story), tmp_path / "film.mp4", engine=engine)
    folder = tmp_path / "film.h3story"
    return story, tmp_path / "film.mp4", folder, json.loads((folder / "manifest.json").read_text())


def _resume(story: Path, film: Path, model_dir: Path):  # noqa: F811
    notices: list[str] = []
    with OneShotEngine(sim_engine_path(), model_dir) as engine:
        result = run_story(Storyboard.from_toml(story), film, engine=engine, on_notice=notices.append)
    return result, notices


def _plant(folder: Path, manifest: dict, **fields: str) -> None:
    manifest["shots"][0].update(fields)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("field", ["video", "last_frame"])
@pytest.mark.parametrize("what", ["fifo", "dev-zero"])
def test_a_planted_manifest_naming_a_fifo_or_device_is_redone_not_hung_on(
        rendered_once, model_dir: Path, sim_log: Path, field: str, what: str) -> None:  # noqa: F811
    story, film, folder, manifest = rendered_once
    planted = special(folder / f"planted-{field}", what)
    _plant(folder, manifest, **{field: planted.name})
    result, notices = _resume(story, film, model_dir)
    assert [shot.reused for shot in result.shots] == [False] and len(sim_invocations(sim_log)) == 1
    kind = "a named pipe (FIFO)" if what == "fifo" else "a symbolic link"
    assert any(f"planted-{field} is {kind}" in notice for notice in notices), notices


def test_only_the_job_folders_own_files_count(rendered_once, tmp_path: Path, model_dir: Path,  # noqa: F811
                                               sim_log: Path) -> None:  # noqa: F811
    """A shot's video given as an absolute path to a real clip elsewhere, with its sha256, was
    used in the film; so was a link from inside the folder to it."""
    story, film, folder, manifest = rendered_once
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = Path(shutil.copy2(folder / manifest["shots"][0]["video"], elsewhere / "clip.mp4"))
    for video in (str(outside), f"../elsewhere/{outside.name}"):
        _plant(folder, dict(manifest, shots=[dict(manifest["shots"][0])]), video=video,
               video_sha256=file_sha256(outside))
        result, notices = _resume(story, film, model_dir)
        assert not result.shots[0].reused, video
        assert any("is not a file of the job folder" in notice for notice in notices), notices
        manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "linked.mp4").symlink_to(outside)
    _plant(folder, manifest, video="linked.mp4", video_sha256=file_sha256(outside))
    result, notices = _resume(story, film, model_dir)
    assert not result.shots[0].reused and any("linked.mp4 is a symbolic link" in n for n in notices), notices
    assert len(sim_invocations(sim_log)) == 3


# ----------------------------------------------------------------------------- nothing left behind


@pytest.mark.parametrize("text", [
    CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\ncontinue = "anchor"\n',
    CANVAS + '[[shot]]\nprompt = "a"\nframes = 22\n[[shot]]\nprompt = "b"\nframes = 23\n',
    CANVAS + '[[shot]]\nprompt = "a"\nseconds = nan\n',
])
def test_a_refused_storyboard_leaves_no_job_folder(tmp_path: Path, model_dir: Path, text: str) -> None:  # noqa: F811
    story = Storyboard.from_toml(write_story(tmp_path, text))
    with OneShotEngine(sim_engine_path(), model_dir) as engine, pytest.raises(RequestError):
        run_story(story, tmp_path / "film.mp4", engine=engine)
    assert not (tmp_path / "film.h3story").exists()


def test_an_existing_film_refusal_leaves_no_job_folder(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    (tmp_path / "film.mp4").write_bytes(b"mine")
    with OneShotEngine(sim_engine_path(), model_dir) as engine, pytest.raises(OutputExistsError):
        run_story(Storyboard.from_toml(write_story(tmp_path, ONE_SHOT)), tmp_path / "film.mp4", engine=engine)
    assert not (tmp_path / "film.h3story").exists() and (tmp_path / "film.mp4").read_bytes() == b"mine"


def test_a_full_disk_leaves_no_job_folder(tmp_path: Path, model_dir: Path, sim_log: Path,  # noqa: F811
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(jobdir_module, "write_atomically", full)
    with OneShotEngine(sim_engine_path(), model_dir) as engine, pytest.raises(DiskError) as caught:
        run_story(Storyboard.from_toml(write_story(tmp_path, ONE_SHOT)), tmp_path / "film.mp4", engine=engine)
    assert "No space left on device" in caught.value.message and caught.value.hint
    assert len(sim_invocations(sim_log)) == 1          # the shot ran; nothing of it is left
    assert not (tmp_path / "film.h3story").exists() and not (tmp_path / "film.mp4").exists()


# ----------------------------------------------------------------------------- storyboard keys


def _suggested(hint: str) -> str:
    """The `key = value` a hint suggests, as a TOML line."""
    return re.search(r'e\.g\. (\w+ = ("[^"]*"|\S+))', hint).group(1)


@pytest.mark.parametrize("line, key", [
    ("title = {a = 1}", "title"),
    ("crossfade_frames = 100000000", "crossfade_frames"),
])
def test_bad_story_settings_are_refused_in_storyboard_words_with_a_valid_fix(tmp_path: Path, line: str,
                                                                             key: str) -> None:
    with pytest.raises(RequestError) as caught:
        Storyboard.from_toml(write_story(tmp_path, line + "\n" + ONE_SHOT))
    error = caught.value
    assert error.field == key and error.message.startswith(f"{key} = ") and "--" not in str(error)
    fixed = _suggested(error.hint or "")
    assert fixed.startswith(f"{key} = ")
    plan_story(Storyboard.from_toml(write_story(tmp_path, fixed + "\n" + ONE_SHOT, "fixed.toml")))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "{}", "[1]", "1" * 5000])
def test_seconds_that_is_not_a_number_is_refused_not_a_traceback(tmp_path: Path, value: str) -> None:
    text = CANVAS + f'[[shot]]\nprompt = "a"\nseconds = {value}\n[[shot]]\nprompt = "b"\nframes = 22\n'
    with pytest.raises(RequestError) as caught:
        plan_story(Storyboard.from_toml(write_story(tmp_path, text)))
    assert "seconds" in str(caught.value) and caught.value.hint


# ----------------------------------------------------------------------------- fuzzing

_WORDS = st.sampled_from(["anchor", "tail", "cut", "preview", "balanced", "match", "max", "x.png", ""])
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-5, 400),
    st.integers(4300, 4400).map(lambda digits: 10**digits),          # past str()'s 4300-digit limit
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), _WORDS)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                       max_leaves=4)
_SHOT = st.dictionaries(st.sampled_from([*SHOT_KEYS, "bogus"]), _VALUES, max_size=5)
_TOP = st.dictionaries(st.sampled_from([*STORY_KEYS, "preset", *REQUEST_KEYS]), _VALUES, max_size=4)
_STORY = st.builds(lambda top, shots: {**top, "shot": shots}, _TOP,
                   st.one_of(st.lists(_SHOT, min_size=1, max_size=3), _VALUES))


def _only_our_errors(action) -> None:
    try:
        action()
    except H3BridgeError as error:
        str(error)          # its message can be shown
    # anything else (TypeError, ValueError, OverflowError, ...) fails the test


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(_STORY)
def test_whatever_a_storyboard_holds_only_storyboard_errors_come_out(data: dict) -> None:
    _only_our_errors(lambda: plan_story(Storyboard.from_dict(data, "/nonexistent"), check_files=False))


def _toml(value: object) -> str:
    """A TOML literal for a fuzzed value (TOML has no null: an empty inline table instead)."""
    if value is None:
        return "{}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if value.bit_length() < 64 else "9" * (value.bit_length() * 3 // 10)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return "{" + ", ".join(f"{json.dumps(str(key))} = {_toml(item)}" for key, item in value.items()) + "}"


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(_TOP, st.lists(_SHOT, min_size=1, max_size=3))
def test_whatever_a_storyboard_file_holds_only_storyboard_errors_come_out(tmp_path_factory: pytest.TempPathFactory,
                                                                          top: dict, shots: list) -> None:
    lines = [f"{key} = {_toml(value)}" for key, value in top.items()]
    for shot in shots:
        lines += ["[[shot]]", *(f"{json.dumps(key)} = {_toml(value)}" for key, value in shot.items())]
    path = tmp_path_factory.mktemp("fuzz") / "story.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, ValueError):
        pass             # a file that is not TOML must be refused in the storyboard's words too
    _only_our_errors(lambda: plan_story(Storyboard.from_toml(path), check_files=False))


# ----------------------------------------------------------------------------- the film's name


def _not_regular_outputs(tmp_path: Path) -> list[Path]:
    """What a film must never be written over, --overwrite or not."""
    return list(not_regular_outputs(tmp_path, ".mp4").values())


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_film_name_that_is_not_a_regular_file_is_refused_before_any_shot(
        tmp_path: Path, model_dir: Path, sim_log: Path, overwrite: bool) -> None:  # noqa: F811
    """With overwrite, a FIFO, device node or link at the film's name was replaced by the film after
    every shot had rendered (issue 29): refused before anything renders, and left as it was."""
    story = Storyboard.from_toml(write_story(tmp_path, ONE_SHOT))
    names = _not_regular_outputs(tmp_path)
    before = {path: os.lstat(path) for path in names}
    for path in names:
        with OneShotEngine(sim_engine_path(), model_dir) as engine, pytest.raises(OutputExistsError) as caught:
            run_story(story, path, engine=engine, overwrite=overwrite)
        assert f"the output {path} already exists and is a" in caught.value.message
    assert sim_invocations(sim_log) == []
    assert {path: (os.lstat(path).st_mode, os.lstat(path).st_ino) for path in names} == \
        {path: (info.st_mode, info.st_ino) for path, info in before.items()}
    assert sorted(tmp_path.iterdir()) == sorted([*names, tmp_path / "story.toml"])     # no job folder either


def test_story_o_that_is_not_a_regular_file_exits_2_even_with_overwrite(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    from story_helpers import run_cli, story_argv
    names = _not_regular_outputs(tmp_path)
    for path in names:
        done = run_cli(story_argv(write_story(tmp_path, ONE_SHOT), path, sim_engine_path(), model_dir,
                                  "--overwrite", "--quiet"))
        assert done.returncode == 2 and "already exists and is a" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert sorted(tmp_path.iterdir()) == sorted([*names, tmp_path / "story.toml"])


def test_a_damaged_manifest_set_aside_never_replaces_one_set_aside_before(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two unreadable manifests in the same second: the second was renamed over the first."""
    from h3bridge.story.jobdir import MANIFEST_NAME, JobDir
    monkeypatch.setattr(jobdir_module.time, "strftime", lambda pattern: "20260101-000000")
    for text in ("first damaged", "second damaged"):
        (tmp_path / MANIFEST_NAME).write_text(text)
        with JobDir(tmp_path) as jobs:
            jobs.load()
            assert jobs.damaged_manifest is not None and jobs.damaged_manifest.read_text() == text
    kept = sorted(p.read_text() for p in tmp_path.glob(f"{MANIFEST_NAME}.damaged-*"))
    assert kept == ["first damaged", "second damaged"] and not (tmp_path / MANIFEST_NAME).exists()
