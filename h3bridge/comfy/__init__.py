"""ComfyUI integration.

`adapter` holds all the logic and imports nothing from ComfyUI (tested in CI
without it). The node modules import `comfy_api`: `nodes` (the core nodes and the
extension, loaded by the repository's root ``__init__.py`` when ComfyUI scans
custom_nodes/), `hex_nodes`, `lora_nodes` and `story_nodes`, which share `shared`.
Importing any of them starts no engine and reads no model.
"""
