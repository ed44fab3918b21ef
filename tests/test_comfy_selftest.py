"""The H3 Selftest node (issue 33), called in-process in ComfyUI's own python; skipped elsewhere.
The selftest itself is tested in test_selftest.py.

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfyui/python -m pytest -q tests/test_comfy_selftest.py
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from comfy_helpers import fixture_model, require_comfyui_in_process  # noqa: F401 (fixture)

require_comfyui_in_process()

from h3bridge.comfy import adapter  # noqa: E402
from h3bridge.comfy.selftest_node import SELFTEST_NODES, H3SelftestNode  # noqa: E402


def test_the_node_is_registered_and_every_input_has_a_tooltip() -> None:
    import asyncio

    from h3bridge.comfy.nodes import comfy_entrypoint
    listed = asyncio.run(asyncio.run(comfy_entrypoint()).get_node_list())
    assert H3SelftestNode in listed and SELFTEST_NODES == [H3SelftestNode]
    schema = H3SelftestNode.define_schema()
    assert all(item.tooltip for item in schema.inputs)


def test_the_node_runs_a_quick_selftest_and_returns_its_report(fixture_model: Path, tmp_path: Path,  # noqa: F811
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    simulator = shutil.which("h3-sim")
    if simulator is None:
        pytest.skip("h3-sim is not on PATH")
    monkeypatch.setenv("H3BRIDGE_CACHE_DIR", str(tmp_path / "cache"))     # the report's folder goes there
    handle = adapter.EngineHandle(engine_path=Path(simulator), model_dir=fixture_model, mode=adapter.SESSION)
    output = H3SelftestNode.execute(engine=handle, quick=True, checksums=False)
    report, folder = output.result
    assert report.startswith("# h3bridge selftest report")
    assert "- pass: session smallest render: 32x32, 22 frames" in report
    assert Path(folder).parent == tmp_path / "cache" / "selftest"
    data = json.loads((Path(folder) / "report.json").read_text())
    assert data["facts"]["engines"] == ["session"] and data["ok"] is True
