"""ComfyUI integration.

`adapter` holds all the logic and imports nothing from ComfyUI (tested in CI
without it). The node modules import `comfy_api`: `nodes` (the core nodes and the
extension, loaded by the repository's root ``__init__.py`` when ComfyUI scans
custom_nodes/), `hex_nodes`, `lora_nodes` and `story_nodes`, which share `shared`.
Importing any of them starts no engine and reads no model.

This folder is also a custom node of its own, for a pip-installed h3bridge (a wheel, no clone):
linked into ComfyUI/custom_nodes (docs/comfyui.md), it has what ComfyUI looks for in one:
`comfy_entrypoint` here, the frontend scripts in WEB_DIRECTORY and the locale files in
`locales/<lang>/` (package data of the wheel).
"""
from __future__ import annotations

from typing import Any

# Relative to this folder, as ComfyUI resolves a custom node's WEB_DIRECTORY.
WEB_DIRECTORY = "./web"


async def comfy_entrypoint() -> Any:
    """The extension of h3bridge.comfy.nodes, imported only when ComfyUI asks for it: importing
    this package must not import comfy_api (the adapter is used without ComfyUI). Absolute, not
    relative: ComfyUI loads a linked custom node under a module name of its own, and the nodes
    must be the installed package's."""
    from h3bridge.comfy.nodes import comfy_entrypoint as nodes_entrypoint
    return await nodes_entrypoint()


__all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
