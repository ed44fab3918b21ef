"""The H3 Storyboard ComfyUI node: shots as text, rendered by h3bridge.story (the logic is there).

Translates only: node inputs to the story's defaults, the film to VIDEO / AUDIO / IMAGE.
Registered by H3BridgeExtension in nodes.py.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from comfy_api.latest import InputImpl, io, ui

import comfy.model_management
import comfy.utils
import folder_paths

from ..cancel import CancelToken
from ..request import DEFAULT_HEIGHT, DEFAULT_SEED, DEFAULT_WIDTH, MAX_SEED, PRESETS
from ..story.host import render_story_text
from ..story.plan import StoryMemoryError
from ..story.storyboard import DEFAULT_CROSSFADE_FRAMES
from ..takes import MAX_TAKES
from . import adapter
from .pause import RUNNING_JOBS
from ..fixes import Fix, said
from .shared import (CATEGORY, H3Engine, background_input, notice_on_node, running_prompt, takes_input, takes_output,
                     user_facing_errors)

IMAGE_OUTPUT_INDEX = 2
EXAMPLE_SHOTS = ("[5s]\nA lighthouse on a cliff at dusk, waves breaking below\n\n"
                 "[5s anchor]\nThe camera climbs the lighthouse's spiral stairs\n\n"
                 "[8s tail]\nThe lamp turns, its beam sweeping over a stormy sea")


def stories_folder() -> Path:
    """In ComfyUI's output folder, not its temp folder (emptied at start): a story resumes after a restart."""
    return Path(folder_paths.get_output_directory()) / "h3bridge" / "stories"


def films_folder() -> Path:
    """The film itself goes to ComfyUI's temp folder: Save Video keeps the one copy in output (it was
    written twice, issue 30); after a restart empties temp, Run again assembles it from the kept shots."""
    return Path(folder_paths.get_temp_directory()) / "h3bridge" / "stories"


class H3StoryboardNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3Storyboard",
            display_name="H3 Storyboard",
            category=CATEGORY,
            description="Render chained shots into one film longer than H3's 15 s. Queueing the same storyboard "
                        "again resumes it: finished shots are kept; edited shots and the ones continuing from "
                        "them are rendered again.",
            inputs=[
                H3Engine.Input("engine", tooltip="From H3 Engine; a warm session keeps the model loaded across shots."),
                io.String.Input("shots", multiline=True, default=EXAMPLE_SHOTS,
                                tooltip="One shot per block (blank lines between). A block may start with "
                                        "[5s anchor]: its length (5s or 56f) and how it continues (anchor: the "
                                        "last frame carries over; tail: the last 2 s with sound, needs Ref2VA; "
                                        "cut), plus key=value such as seed=3."),
                io.Combo.Input("preset", options=list(PRESETS), default="balanced",
                               tooltip="Steps/layers/reuse for every shot (a shot may set steps=... itself)."),
                io.Int.Input("width", default=DEFAULT_WIDTH, min=32, max=1344, step=32,
                             tooltip="Film width (multiple of 32)."),
                io.Int.Input("height", default=DEFAULT_HEIGHT, min=32, max=1344, step=32,
                             tooltip="Film height (multiple of 32)."),
                # No "control after generate" (the frontend gives any INT named seed one, set to randomize):
                # a new seed on every Run would render every shot again, and Run again must resume.
                io.Int.Input("seed", default=DEFAULT_SEED, min=0, max=MAX_SEED, control_after_generate=False,
                             tooltip="The story's seed: each shot's seed derives from it and the shot's position. "
                                     "It stays as set, so Run again resumes the film; change it for another film."),
                io.Int.Input("crossfade_frames", default=DEFAULT_CROSSFADE_FRAMES, min=0, max=48, advanced=True,
                             tooltip="Audio crossfade at each join, in frames' worth (0: hard joins)."),
                io.String.Input("job_name", default="storyboard",
                                tooltip="Names the job folder in ComfyUI's output/h3bridge/stories; the same name "
                                        "resumes, another starts a new film."),
                # Last and optional: workflows saved before them still load (widget values are positional).
                io.Boolean.Input("ssd_streaming", default=False, optional=True,
                                 tooltip="Stream DiT blocks from SSD for every shot (two resident blocks, much "
                                         "less memory, slower): what 24-32 GB Macs need. A shot may set "
                                         "ssd_streaming=false in its [ ] line."),
                io.Boolean.Input("force", default=False, optional=True, advanced=True,
                                 tooltip="Run even when the memory plan says the most demanding shot does not "
                                         "fit this machine (macOS may swap or stop h3). Off: such a story is "
                                         "refused before any shot renders, with the settings that fit."),
                takes_input(f"Render every shot this many times (1-{MAX_TAKES}), with the shot's seed and the ones "
                            "above it; a shot's [takes=N] wins. Every take is kept in the job folder and shown "
                            "on the node's contact sheet; the film uses each shot's pick."),
                io.String.Input("pick", default="", optional=True,
                                tooltip="The take the film uses of shots with takes, as SHOT=TAKE pairs: 2=3, 4=1 "
                                        "(a shot not named uses take 1). Changing it renders nothing, except a shot "
                                        "that continues (anchor, tail) from a re-picked one."),
                background_input("every shot"),
            ],
            outputs=[
                io.Video.Output(display_name="video",
                                tooltip="The film (MP4 with audio), in ComfyUI's temp folder: connect Save Video "
                                        "to keep it (the shots stay in output/h3bridge/stories)."),
                io.Audio.Output(display_name="audio", tooltip="The film's stereo 32 kHz soundtrack."),
                io.Image.Output(display_name="frames",
                                tooltip="Every frame of the film; only built when this output is connected."),
                io.String.Output(display_name="summary", tooltip="Shots rendered and kept, the film and job folder."),
                takes_output("With takes: the contact sheet as a batch, one picture per take of every shot with "
                             "takes (shot, take, seed, four frames; the take the film uses is marked picked). "
                             "Without: one black placeholder frame."),
            ],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
        )

    @classmethod
    def fingerprint_inputs(cls, **values: Any) -> Any:
        return adapter.output_is_connected(running_prompt(), cls.hidden.unique_id if cls.hidden else None,
                                           IMAGE_OUTPUT_INDEX)

    @classmethod
    @user_facing_errors
    def execute(cls, engine: adapter.EngineHandle, shots: str, preset: str, width: int, height: int, seed: int,
                crossfade_frames: int = DEFAULT_CROSSFADE_FRAMES, job_name: str = "storyboard",
                ssd_streaming: bool = False, force: bool = False, takes: int = 1, pick: str = "",
                background: bool = False) -> io.NodeOutput:
        hidden = cls.hidden
        engine = adapter.with_background(engine, background)     # this story's engine
        want_image = adapter.output_is_connected(hidden.prompt if hidden else None,
                                                 hidden.unique_id if hidden else None, IMAGE_OUTPUT_INDEX)
        comfy.model_management.unload_all_models()
        bar = comfy.utils.ProgressBar(adapter.PROGRESS_STEPS, node_id=hidden.unique_id if hidden else None)
        cancel = CancelToken(check=comfy.model_management.processing_interrupted)
        defaults = {"preset": preset, "width": width, "height": height, "seed": seed,
                    "crossfade_frames": crossfade_frames, "ssd_streaming": bool(ssd_streaming)}
        stop_after_shot = threading.Event()     # the Stop after shot button (comfy/pause.py)
        with RUNNING_JOBS.job(hidden.unique_id if hidden else None, stop_after_shot) as pause:     # the Pause button
            try:
                outputs = render_story_text(
                    shots, defaults, engine=adapter.engine_for_node(engine), jobs_root=stories_folder(),
                    job_name=job_name, want_frames=want_image,
                    on_progress=lambda p: bar.update_absolute(int(p.fraction * adapter.PROGRESS_STEPS),
                                                              adapter.PROGRESS_STEPS),
                    on_notice=_in_node_words(notice_on_node(hidden.unique_id if hidden else None)), cancel=cancel, force=bool(force),
                    film_root=films_folder(), takes=takes, picks=pick or "", pause=pause,
                    stop_after_shot=stop_after_shot)
            except StoryMemoryError as error:      # the plan says CLI flags: say it with this node's inputs
                raise error.in_words(setting=_node_setting, everywhere="on H3 Storyboard",
                                     in_shot="in shot {shot}'s [ ] line (e.g. [39f anchor])",
                                     force="set the force input to true") from None
        image = (adapter.frames_to_image_batch(outputs.frames) if outputs.frames is not None
                 else adapter.placeholder_image(width, height))
        sheet = None
        if outputs.sheet is not None:
            from .takes import sheet_rows
            rows = sheet_rows(outputs.sheet, outputs.sheet_rows).astype(np.float32) / 255.0
            sheet = ui.PreviewImage(torch.from_numpy(outputs.sheet[None].astype(np.float32) / 255.0), cls=cls)
        else:
            rows = adapter.placeholder_image(width, height)
        return io.NodeOutput(
            InputImpl.VideoFromFile(str(outputs.video_path)),
            {"waveform": torch.from_numpy(outputs.audio[None]), "sample_rate": 32000},
            torch.from_numpy(image),
            outputs.summary,
            torch.from_numpy(rows),
            ui=sheet,
        )


def _node_setting(name: str, value: object) -> str:
    """A story setting as H3 Storyboard takes it: its own input, else key=value in each shot's [ ] line."""
    if name == "ssd_streaming":
        return f"the ssd_streaming input to {str(value).lower()}"
    if name == "frames":
        return f"the length to {value}f"
    shown = str(value).lower() if isinstance(value, bool) else value
    return f"{name}={shown} in every shot's [ ] line"


STORY_NODES: list[type[io.ComfyNode]] = [H3StoryboardNode]


def _in_node_words(show: "Callable[[str], None]") -> "Callable[[str | Fix], None]":
    """A story's notices on the node: one that names settings (a Fix) said with the nodes' inputs."""
    return lambda text: show(said(text, adapter.node_words) or "")

__all__ = ["H3StoryboardNode", "STORY_NODES"]
