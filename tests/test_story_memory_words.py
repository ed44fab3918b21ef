"""`h3bridge story`'s memory refusal says its fix in the storyboard's keys (issue 20 item 2): the
settings go into the storyboard, so `--ssd-streaming` (a generate flag the story command does not
take) is the wrong word. The suggestion is fed back to show it is itself a valid fix."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from core_helpers import sim_engine_path, sim_invocations, sim_log  # noqa: F401 (fixture)
from h3bridge.cli.main import main
from h3bridge.model.memory import MachineFacts
from h3bridge.sim.fixture import write_fixture_model
from h3bridge.story import Storyboard, plan_story

STORY = '''width = {width}
height = {height}

[[shot]]
prompt = "a lighthouse at dusk"
frames = 56

[[shot]]
prompt = "the camera climbs the stairs"
frames = {long_frames}
continue = "anchor"
'''


@pytest.fixture(scope="module")
def realistic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The released tensor shapes as sparse files: real sizes for the memory plan, no disk used."""
    return write_fixture_model(tmp_path_factory.mktemp("real") / "MiniMax-H3", realistic=True, ref2va=False)


def _apply_fix(text: str, fix: str) -> str:
    """The storyboard with the refusal's fix applied as a user would: the top-level settings before
    the first [[shot]], a shot's own setting in that shot's table (replacing its length)."""
    top = re.search(r"set (.+?) at the top of the storyboard", fix)
    if top:
        text = "\n".join(part.strip() for part in top.group(1).split(",")) + "\n" + text
    shot = re.search(r"set (frames = \d+) in shot (\d+)'s \[\[shot\]\] table", fix)
    if shot:
        blocks = text.split("[[shot]]")
        number = int(shot.group(2))
        blocks[number] = re.sub(r"frames = \d+", shot.group(1), blocks[number])
        text = "[[shot]]".join(blocks)
    assert top or shot, fix
    return text


@pytest.mark.parametrize("memory_gb, canvas, long_frames", [
    (24, (864, 480), 56),       # SSD streaming alone fits
    (24, (1344, 768), 362),     # streaming and more: fewer layers, a smaller render canvas or frames
])
def test_a_story_memory_refusal_names_storyboard_keys_and_the_fix_works(
        memory_gb: int, canvas: tuple[int, int], long_frames: int, realistic: Path, tmp_path: Path,
        sim_log: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    machine = MachineFacts.mac(memory_gb, "Apple M4 Pro")
    monkeypatch.setattr(MachineFacts, "detect", classmethod(lambda cls: machine))
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))
    text = STORY.format(width=canvas[0], height=canvas[1], long_frames=long_frames)
    story = tmp_path / "story.toml"
    story.write_text(text)
    capsys.readouterr()
    status = main(["story", str(story), "--quiet", "--engine-path", str(sim_engine_path()),
                   "--model-dir", str(realistic)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "does not fit" in err and "ssd_streaming = true" in err, err
    assert "--ssd-streaming" not in err and "--layers" not in err and "--render-width" not in err, err
    assert "--force" in err and "force=True" not in err, err
    assert sim_invocations(sim_log) == [] and not (tmp_path / "story.mp4").exists()

    fixed = tmp_path / "fixed.toml"
    fixed.write_text(_apply_fix(text, err.split("fix:", 1)[1]))
    plan = plan_story(Storyboard.from_toml(fixed), realistic, machine=machine)
    assert plan.memory_plan.fits, fixed.read_text()
