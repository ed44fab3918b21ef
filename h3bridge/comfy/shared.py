"""What every H3 node module shares: the category, the H3_ENGINE socket type, how library errors
reach ComfyUI's error panel, ComfyUI's folders and the running prompt, text on a node.

Below nodes.py and the hex / LoRA / story node modules (which nodes.py registers), so none of
them imports another. Imports ComfyUI; the logic stays in `adapter` and the library.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np
import torch

import comfy.model_management
import folder_paths
from comfy_api.latest import io

from ..errors import GenerationCancelled, H3BridgeError
from ..takes import MAX_TAKES
from . import adapter

CATEGORY = "MiniMax-H3 (h3.c)"
H3Engine = io.Custom("H3_ENGINE")

_F = TypeVar("_F", bound=Callable[..., Any])


# The inputs and output the rendering nodes (H3 Generate, H3 Storyboard) share, declared once so
# their name, type, range and place stay one; each node says in its tooltip what they do there.

def takes_input(tooltip: str) -> io.Int.Input:
    """`takes`: how many takes to render (1..MAX_TAKES); optional, so older workflows still load."""
    return io.Int.Input("takes", default=1, min=1, max=MAX_TAKES, optional=True, tooltip=tooltip)


def takes_output(tooltip: str) -> io.Image.Output:
    """`takes`: the contact sheet as an IMAGE batch, one picture per take."""
    return io.Image.Output(display_name="takes", tooltip=tooltip)


def background_input(what: str) -> io.Boolean.Input:
    """`background`: render `what` ("every shot") at background priority (engines/priority.py)."""
    return io.Boolean.Input(
        "background", default=False, optional=True, advanced=True,
        tooltip=f"Render {what} at background priority (Linux: nice 19 and idle I/O; macOS: the background QoS "
                "band), so the machine stays responsive; a warm engine started at normal priority is lowered "
                "and stays so until it restarts. Local engines only: a remote engine renders at its server's "
                "priority.")


def user_facing_errors(function: _F) -> _F:
    """Let library errors reach ComfyUI's error panel as one sentence, the library's message and
    fix, without a traceback through our internals (`shown_as`)."""
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except GenerationCancelled:
            # The user pressed Cancel: report it as ComfyUI's own interruption.
            comfy.model_management.throw_exception_if_processing_interrupted()
            raise
        except H3BridgeError as error:
            adapter.in_node_words(error, {})      # a fix the library gave as data, said with the nodes' inputs
            error.__class__ = shown_as(type(error))
            raise error.with_traceback(None) from None
    return wrapper  # type: ignore[return-value]


@functools.cache
def shown_as(error_class: type[H3BridgeError]) -> type[H3BridgeError]:
    """`error_class` as ComfyUI's error panel names it: the panel reads "<module>.<class>: <message>"
    (execution.py full_type_name), and a custom node's module is its whole folder path
    (`/…/custom_nodes/h3bridge.h3bridge.errors.RequestError: …`). This subclass is named in words
    ("Request error") in builtins, which ComfyUI names without a module: "Request error: …".
    Still an instance of the library's class."""
    name = error_class.__name__
    words = "".join(" " + letter if letter.isupper() and index and name[index - 1].islower() else letter
                    for index, letter in enumerate(name)).lower().capitalize()
    return type(error_class.__name__, (error_class,), {"__module__": "builtins", "__qualname__": words})


def model_roots() -> list[Path]:
    """ComfyUI/models/h3 (and any extra_model_paths.yaml `h3:` entries)."""
    # Idempotent and order-keeping: appended once, so `h3:` entries from extra_model_paths.yaml
    # (loaded before custom nodes) keep their place, their `is_default` included.
    folder_paths.add_model_folder_path(adapter.MODEL_FOLDER,
                                       os.path.join(folder_paths.models_dir, adapter.MODEL_FOLDER))
    return [Path(p) for p in folder_paths.get_folder_paths(adapter.MODEL_FOLDER)]


def work_dir(name: str) -> Path:
    return Path(folder_paths.get_temp_directory()) / "h3bridge" / name


def to_numpy(tensor: Any) -> np.ndarray:
    return tensor.detach().cpu().numpy() if isinstance(tensor, torch.Tensor) else np.asarray(tensor)


def running_prompt() -> dict | None:
    """The API prompt being executed, for `fingerprint_inputs` (which ComfyUI calls
    without the PROMPT hidden input). None when it cannot be known."""
    try:
        from server import PromptServer   # ComfyUI's top-level server module
        running, _queued = PromptServer.instance.prompt_queue.get_current_queue_volatile()
    except Exception:   # noqa: BLE001 - any failure just means "unknown"
        return None
    return running[0][2] if len(running) == 1 else None


def notice_on_node(node_id: str | None) -> Callable[[str], None]:
    """Text shown on the node itself (ComfyUI's progress text, under its widgets)."""
    def show(text: str) -> None:
        try:
            from server import PromptServer   # ComfyUI's top-level server module
            PromptServer.instance.send_progress_text(text, node_id)
        except Exception:   # noqa: BLE001 - no server (scripted use): the summary output still says it
            pass
    return show


__all__ = ["CATEGORY", "H3Engine", "model_roots", "notice_on_node", "running_prompt", "shown_as", "to_numpy",
           "user_facing_errors", "work_dir"]
