"""The H3 Model node: a choice of the model folders installed under ComfyUI/models/h3 (registered
with folder_paths by `model_roots`), whose path feeds H3 Engine's (or H3 LoRA's) model_dir. H3
Engine's own model_dir text input stays as it was: a name or a typed path still works.

Only translates; the listing and the missing-model message (with the exact download command and
the size) live in `adapter`.
"""
from __future__ import annotations

from comfy_api.latest import io

from . import adapter
from .shared import CATEGORY, model_roots, user_facing_errors


class H3ModelNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        installed = adapter.installed_models(model_roots())
        return io.Schema(
            node_id="H3Model",
            display_name="H3 Model",
            category=CATEGORY,
            # No path here: the description is the same on every machine (and in the locale files);
            # the folder and the command for this install are in the message when none is installed.
            description=f"Pick a MiniMax-H3 model installed under ComfyUI/models/{adapter.MODEL_FOLDER}/ and connect "
                        "model_dir to H3 Engine's model_dir (typing a name or a path there works too). With none "
                        "installed, running the graph says the download command for this install "
                        f"({adapter.SIZES_IN_SHORT}).",
            # Nothing installed: the one option says so (not a model name that looks installed).
            inputs=[io.Combo.Input("model", options=installed or [adapter.NO_MODEL_INSTALLED],
                                   tooltip=f"The model folders in ComfyUI/models/{adapter.MODEL_FOLDER}/ (each holds "
                                           "FL2VA/ and, for reference jobs, Ref2VA/); refresh the page after a download.")],
            outputs=[io.String.Output(display_name="model_dir",
                                      tooltip="The model folder's path, for H3 Engine's or H3 LoRA's model_dir.")],
        )

    @classmethod
    def validate_inputs(cls, model: str) -> bool | str:
        try:
            adapter.check_model_choice(model, model_roots())
        except Exception as error:        # noqa: BLE001 - shown under the input, with its fix
            return str(error)
        return True

    @classmethod
    @user_facing_errors
    def execute(cls, model: str) -> io.NodeOutput:
        return io.NodeOutput(str(adapter.check_model_choice(model, model_roots())))


MODEL_NODES: list[type[io.ComfyNode]] = [H3ModelNode]

__all__ = ["H3ModelNode", "MODEL_NODES"]
