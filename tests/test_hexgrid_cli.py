"""`h3bridge hexgrid`: draws the tiling to a PNG atomically, refuses bad flags and existing files."""
from __future__ import annotations

import os
from pathlib import Path

import av
import numpy as np
import pytest

from h3bridge.cli.main import main
from h3bridge.hexgrid.draw import draw_tiling
from h3bridge.hexgrid.grid import hex_grid

from core_helpers import not_regular_outputs


def _read_png(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return next(container.decode(video=0)).to_ndarray(format="rgb24")


def test_hexgrid_draws_the_tiling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "out" / "tiling.png"
    assert main(["hexgrid", "--width", "480", "--height", "240", "--resolution", "1", "--overlap", "4",
                 "-o", str(output)]) == 0
    picture = _read_png(output)
    expected = np.rint(draw_tiling(hex_grid(480, 240, 1, 4)) * 255).astype(np.uint8)
    assert np.array_equal(picture, expected)
    assert "resolution 1, 842 cells (12 pentagons)" in capsys.readouterr().err
    assert [p.name for p in output.parent.iterdir()] == ["tiling.png"]        # no temporary left


def test_hexgrid_never_overwrites_without_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "tiling.png"
    output.write_bytes(b"mine")
    args = ["hexgrid", "--width", "480", "--height", "240", "-o", str(output)]
    assert main(args) == 2
    assert output.read_bytes() == b"mine"
    assert capsys.readouterr().err.rstrip().endswith("fix: choose another name, or allow overwriting (--overwrite)")
    assert main([*args, "--overwrite"]) == 0
    assert _read_png(output).shape == (240, 480, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiling.png"]


@pytest.mark.parametrize("flags, words", [
    (["--resolution", "3"], "use resolution 0..2 for 1344x768"),
    (["--overlap", "80"], "use an overlap of 0..74 px"),
    (["--width", "64", "--height", "32"], "too small for an H3 grid"),
])
def test_hexgrid_refuses_unusable_settings_before_drawing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          flags: list[str], words: str) -> None:
    output = tmp_path / "tiling.png"
    sizes = [] if "--width" in flags else ["--width", "1344", "--height", "768"]
    assert main(["hexgrid", *sizes, *flags, "-o", str(output)]) == 2
    assert words in capsys.readouterr().err and not output.exists()


def test_hexgrid_wants_a_png_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hexgrid", "--width", "480", "--height", "240", "-o", str(tmp_path / "t.jpg")]) == 2
    assert "end the name in .png" in capsys.readouterr().err


def test_hexgrid_refuses_a_frame_too_big_for_memory_before_computing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19 item 9: 40000x20000 tried to allocate tens of GiB."""
    from h3bridge.cli import hexgrid as hexgrid_cli
    monkeypatch.setattr(hexgrid_cli, "hex_grid", lambda *args: pytest.fail("the grid was computed"))
    assert main(["hexgrid", "--width", "40000", "--height", "20000", "-o", str(tmp_path / "t.png")]) == 2
    err = capsys.readouterr().err
    assert "would take at least 53.6 GiB" in err and "the limit is" in err and "fix: use a frame of about" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["file-parent", "sys"])
def test_an_unwritable_output_is_found_before_the_grid_is_computed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    from h3bridge.cli import hexgrid as hexgrid_cli
    monkeypatch.setattr(hexgrid_cli, "hex_grid", lambda *args: pytest.fail("the grid was computed first"))
    if where == "file-parent":
        (tmp_path / "notes").write_text("a file, not a folder")
        output = tmp_path / "notes" / "t.png"
    else:
        output = Path("/sys/h3bridge-hexgrid-test.png")       # read-only even for root
        if os.access("/sys", os.W_OK) and not Path("/sys/class").is_dir():
            pytest.skip("no read-only /sys here")
    assert main(["hexgrid", "--width", "480", "--height", "240", "-o", str(output)]) == 2
    err = capsys.readouterr().err
    assert f"--output {output}: cannot write in the folder {output.parent}" in err
    assert "Errno" not in err and "fix: choose an --output in a folder you can write to" in err


def test_hexgrid_says_what_it_is_doing_while_it_works(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A fine grid takes half a minute; without a terminal `hexgrid` printed nothing until the end.
    The layout is held here until a progress line has appeared while it runs (bounded wait)."""
    import sys
    import time

    from h3bridge.cli import hexgrid as hexgrid_cli
    monkeypatch.setattr(hexgrid_cli, "PROGRESS_LINE_SECONDS", 0.01)
    real = hexgrid_cli.hex_grid

    def slow_grid(*args, **kwargs):
        deadline = time.monotonic() + 60
        while " s)" not in sys.stderr.getvalue():
            assert time.monotonic() < deadline, "no progress line while the grid was laid out"
            time.sleep(0.01)
        return real(*args, **kwargs)

    monkeypatch.setattr(hexgrid_cli, "hex_grid", slow_grid)
    assert main(["hexgrid", "--width", "256", "--height", "128", "-o", str(tmp_path / "grid.png")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "h3bridge: hexgrid: laying out the resolution 0 cells over 256x128"
    assert lines[1].startswith("h3bridge: hexgrid: laying out the resolution 0 cells over 256x128 (")
    assert any(line.startswith("h3bridge: hexgrid: drawing ") for line in lines)
    assert lines[-1].startswith("wrote ")


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_an_output_that_is_not_a_regular_file_is_refused_before_the_grid_and_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, overwrite: list[str]) -> None:
    """A device node, FIFO, folder or dangling link named by -o: exit 2 naming what it is, before the
    grid is computed, whatever --overwrite says; nothing is written or replaced (issue 29)."""
    from h3bridge.cli import hexgrid as hexgrid_cli
    monkeypatch.setattr(hexgrid_cli, "hex_grid", lambda *args: pytest.fail("the grid was computed"))
    made = not_regular_outputs(tmp_path, ".png")
    names, folder = list(made.values()), made["folder"]
    before = {path: os.lstat(path) for path in names}
    for path in names:
        assert main(["hexgrid", "--width", "480", "--height", "240", "-o", str(path), *overwrite]) == 2, path
        err = capsys.readouterr().err
        assert f"--output {path} already exists and is a" in err and "Traceback" not in err, err
    for path, info in before.items():
        assert (os.lstat(path).st_mode, os.lstat(path).st_ino) == (info.st_mode, info.st_ino)
    assert sorted(tmp_path.iterdir()) == sorted(names) and list(folder.iterdir()) == []
