"""ComfyUI entry point: cloning this repository into ComfyUI/custom_nodes/ installs the
h3bridge node pack (category "MiniMax-H3 (h3.c)"). ComfyUI imports this file as a
package and calls `comfy_entrypoint`; nothing here starts an engine or reads a model.
"""
from importlib.util import find_spec

# The pack's frontend extension (labels on H3 Prompt's text boxes), served by ComfyUI.
WEB_DIRECTORY = "./h3bridge/comfy/web"

# Only inside ComfyUI: other importers of this directory as a package (pytest collects
# the repository root as one, since it holds this file) have no comfy_api to load.
if find_spec("comfy_api") is not None:
    from .h3bridge.comfy.nodes import comfy_entrypoint

    __all__ = ["comfy_entrypoint", "WEB_DIRECTORY"]
