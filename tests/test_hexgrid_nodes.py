"""The H3 Hex Grid / H3 Hex Merge ComfyUI nodes, called in-process. Needs ComfyUI importable, so
it runs in ComfyUI's own python (torch, comfy_api) with the checkout on sys.path; skipped otherwise.
The logic is tested in test_hexgrid.py, the nodes inside a running server in test_comfy_integration.py.

    cd /work/main && COMFYUI_DIR=/tmp/comfy-bed/ComfyUI /tmp/comfy-bed/venv/bin/python -m pytest -q \
        tests/test_hexgrid_nodes.py

(`python -m pytest` from the checkout puts h3bridge on sys.path; that python needs pytest,
hypothesis and pytest-timeout besides requirements.txt.) In the project's venv (no torch) this
module skips, also when collected with test_comfy_integration.py, which runs there."""
from __future__ import annotations


import numpy as np
import pytest

from comfy_helpers import require_comfyui_in_process  # noqa: E402

torch = require_comfyui_in_process()

from h3bridge.comfy.hex_nodes import HEX_NODES, H3HexGridNode, H3HexMergeNode  # noqa: E402
from h3bridge.errors import RequestError  # noqa: E402
from h3bridge.hexgrid.grid import hex_grid  # noqa: E402


def test_every_input_has_a_tooltip_and_the_nodes_are_registered() -> None:
    import asyncio

    from h3bridge.comfy.nodes import comfy_entrypoint
    listed = asyncio.run(asyncio.run(comfy_entrypoint()).get_node_list())
    assert all(node in listed for node in HEX_NODES)
    for node in HEX_NODES:
        schema = node.define_schema()
        assert all(item.tooltip for item in schema.inputs), node


def test_grid_node_outputs_masks_preview_and_the_grid() -> None:
    masks, preview, grid = H3HexGridNode.execute(width=480, height=240, resolution=0, overlap=8).result
    assert grid is hex_grid(480, 240, 0, 8)
    assert masks.shape == (len(grid), 240, 480) and torch.all(masks.sum(dim=0) == 1)
    assert preview.shape == (1, 240, 480, 3) and 0 <= float(preview.min()) and float(preview.max()) <= 1
    with pytest.raises(RequestError, match="^resolution 3") as refused:        # once, when the node runs
        H3HexGridNode.execute(width=1344, height=768, resolution=3, overlap=2)
    assert type(refused.value).__qualname__ == "Request error" and type(refused.value).__module__ == "builtins"


def test_merge_node_blends_image_batches_and_passes_one_audio_through() -> None:
    grid = hex_grid(480, 240, 0, 8)
    video = torch.rand((2, 240, 480, 3))
    audio = {"waveform": torch.zeros((1, 2, 64000)), "sample_rate": 32000}
    merged, sound = H3HexMergeNode.execute(cells=grid, images={"image_0": video, "image_1": video},
                                           audio={"audio_0": audio}).result
    assert torch.allclose(merged, video, atol=1 / 255) and sound["waveform"] is audio["waveform"]
    with pytest.raises(RequestError, match="512x240 but the grid is 480x240"):
        H3HexMergeNode.execute(cells=grid, images={"image_0": torch.rand((2, 240, 512, 3))})
    mixed = H3HexMergeNode.execute(cells=grid, images={"image_0": video, "image_1": 1 - video}).result[0]
    assert not torch.allclose(mixed, video)
    assert np.isfinite(mixed.numpy()).all()
