"""ComfyUI integration.

`adapter` holds all the logic and imports nothing from ComfyUI (tested in CI
without it); `nodes` is the only module that imports `comfy_api` and is loaded
by the repository's root ``__init__.py`` when ComfyUI scans custom_nodes/.
Importing either starts no engine and reads no model.
"""
