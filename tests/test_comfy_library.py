"""ComfyUI's library mode, adapter side (no ComfyUI needed): the H3 Engine node's settings, the
default mode, and an H3 Generate run on the libh3 double with previews and exact frames.
The node's preview display itself runs in the real server (test_comfy_integration.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from comfy_helpers import fixture_model  # noqa: F401 (fixture)
from core_helpers import sim_engine_path
from double_helpers import double_library_path
from h3bridge import OneShotEngine
from h3bridge.cancel import CancelToken
from h3bridge.comfy import adapter
from h3bridge.errors import LibraryLoadError
from h3bridge.progress import PreviewFrame

SMALL = adapter.GenerateSettings(prompt="a red fox", preset="preview", width=96, height=64,
                                 length_unit="frames", frames=22, steps=3, ssd_streaming="off")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))


def test_library_mode_is_the_default_when_a_library_is_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("H3_LIBRARY", raising=False)
    assert adapter.default_engine_mode() == adapter.ONE_SHOT
    monkeypatch.setenv("H3_LIBRARY", "/somewhere/libh3.dylib")
    assert adapter.default_engine_mode() == adapter.LIBRARY
    assert adapter.LIBRARY in adapter.ENGINE_MODES


def test_library_settings_need_the_library_not_the_h3_program(fixture_model: Path, tmp_path: Path,  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    library = double_library_path()
    monkeypatch.delenv("H3_LIBRARY", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))            # no h3 anywhere
    handle = adapter.check_engine_settings("", str(fixture_model), adapter.LIBRARY, [], library_path=str(library))
    assert handle.engine_path is None and handle.library_path == library and handle.previews
    assert "library engine" in handle.describe()
    with pytest.raises(LibraryLoadError) as missing:
        adapter.check_engine_settings("", str(fixture_model), adapter.LIBRARY, [])
    assert "no libh3 library given" in missing.value.message and "H3_LIBRARY" in missing.value.hint
    wrong = tmp_path / "libh3.dylib"
    wrong.write_bytes(b"!<arch>\n" + b"\0" * 60)
    with pytest.raises(LibraryLoadError, match="static archive"):
        adapter.check_engine_settings("", str(fixture_model), adapter.LIBRARY, [], library_path=str(wrong))


@pytest.mark.parametrize("previews", [True, False])
def test_generate_in_library_mode_shows_previews_and_outputs_exact_frames(fixture_model: Path,  # noqa: F811
                                                                          tmp_path: Path, previews: bool) -> None:
    handle = adapter.check_engine_settings("", str(fixture_model), adapter.LIBRARY, [],
                                           library_path=str(double_library_path()), previews=previews)
    shown: list[PreviewFrame] = []
    outputs = adapter.run_generate(handle, SMALL, adapter.GenerateInputs(), scratch_parent=tmp_path / "scratch",
                                   output_dir=tmp_path / "out", want_image=True, cancel=CancelToken(),
                                   on_preview=shown.append)
    assert [p.step for p in shown] == ([0, 1, 2] if previews else [])
    request = outputs.result.request
    exact = OneShotEngine(sim_engine_path(), fixture_model).generate(request, None, want_audio=False).frames
    assert np.array_equal(outputs.image, adapter.frames_to_image_batch(exact))
    assert "engine: library engine" in outputs.summary and outputs.video_path.is_file()
    adapter.open_engine(handle).close()

