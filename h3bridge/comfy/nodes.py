"""ComfyUI V3 nodes for h3bridge: the core nodes, and the extension that registers them with the
hex, LoRA and story node modules (which share `shared`, below all of them, and import no other node module).

Each node converts ComfyUI values to plain ones, calls `adapter`, and converts
the answer back; all decisions live in `adapter` and the h3bridge library.
Importing this module starts no engine and reads no model.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import comfy.model_management
import comfy.utils
from comfy_api.latest import ComfyExtension, InputImpl, Types, io, ui

from ..cancel import CancelToken
from ..errors import H3BridgeError
from ..vocabulary import ENGINE_KIND_MEANING, EngineKind
from ..media.references import AudioClip, ReferenceItem, ReferenceList, VideoSource
from ..request import (
    DEFAULT_FRAMES,
    DEFAULT_HEIGHT,
    DEFAULT_SEED,
    DEFAULT_WIDTH,
    MAX_LAYERS,
    MAX_REUSE,
    MAX_SEED,
    MAX_STEPS,
    MIN_LAYERS,
    MIN_STEPS,
    PRESETS,
    ReferenceKind,
)
from ..geometry import CANVAS_MULTIPLE, FPS, MAX_FRAMES, MAX_PIXELS, MIN_FRAMES
from . import adapter
from .hex_nodes import HEX_NODES          # H3 hexagon tiling nodes (h3bridge/hexgrid)
from .lora_nodes import LORA_NODES        # H3 LoRA (h3bridge/lora)
from .pause import RUNNING_JOBS, register_pause_routes     # the frontend's Pause button
from .model_nodes import MODEL_NODES      # H3 Model (a model folder under models/h3)
from .selftest_node import SELFTEST_NODES  # H3 Selftest (h3bridge/selftest)
from .shared import (CATEGORY, H3Engine, background_input, model_roots, notice_on_node, running_prompt,
                     takes_input, takes_output, to_numpy, user_facing_errors, work_dir)
from .story_nodes import STORY_NODES      # H3 Storyboard (h3bridge/story)
from ..takes import MAX_TAKES

H3References = io.Custom("H3_REFERENCES")

# ----------------------------------------------------------------------------- helpers

def _audio_clip(audio: dict) -> AudioClip:
    return adapter.waveform_to_clip(to_numpy(audio["waveform"]), int(audio["sample_rate"]))


def _video_source(video: Any) -> VideoSource:
    """A ComfyUI VIDEO as something the library can write to an .mp4 path on demand."""
    def write(target: Path) -> None:
        video.save_to(str(target), format=Types.VideoContainer.MP4, codec=Types.VideoCodec.H264)
    source = getattr(video, "get_stream_source", lambda: None)()
    return VideoSource(write=write, description=source if isinstance(source, str) else type(video).__name__)


# ----------------------------------------------------------------------------- shared inputs

def _preset_input(*, with_steps: bool) -> io.Input:
    """The preset as a dynamic combo: each preset shows its own steps/layers/reuse widgets set to that
    preset's values, so the node shows what will be used (no "0 = preset"), and they can be edited."""
    def option(name: str) -> io.DynamicCombo.Option:
        preset = PRESETS[name]
        inputs: list[io.Input] = []
        if with_steps:
            inputs.append(io.Int.Input("steps", default=preset.steps, min=MIN_STEPS, max=MAX_STEPS,
                                       tooltip=f"Denoising passes, {MIN_STEPS}..{MAX_STEPS}; set to the preset's value "
                                               "when it is chosen."))
        inputs += [
            io.Int.Input("layers", default=preset.layers, min=MIN_LAYERS, max=MAX_LAYERS,
                         tooltip=f"Active DiT blocks, {MIN_LAYERS}..{MAX_LAYERS}; set to the preset's value when it "
                                 "is chosen. Fewer is faster and uses less memory."),
            io.Int.Input("reuse", default=preset.reuse, min=1, max=MAX_REUSE,
                         tooltip=f"Whole-denoiser reuse 1..{MAX_REUSE}; set to the preset's value when it is chosen. "
                                 "Set it to 1 to use core_reuse."),
        ]
        return io.DynamicCombo.Option(name, inputs)

    return io.DynamicCombo.Input(
        "preset", options=[option(name) for name in adapter.PRESET_NAMES],
        tooltip="Speed/quality preset; choosing one sets the widgets below it to its values: "
                + "; ".join(f"{name} {adapter.preset_values(name)}" for name in adapter.PRESET_NAMES)
                + ". 24-32 GB Macs: preview or balanced with SSD streaming; 96-128 GB: quality.")


def _length_input() -> io.Input:
    """The clip length in the unit chosen: only that unit's widget is shown."""
    return io.DynamicCombo.Input("length_unit", options=[
        io.DynamicCombo.Option("seconds", [
            io.Float.Input("seconds", default=2.0, min=0.05, max=round(MAX_FRAMES / FPS, 3), step=0.125, round=0.001,
                           tooltip=f"Clip length. Snapped UP to the next legal H3 length (5 + 17n frames at 24 fps, "
                                   f"{MIN_FRAMES}..{MAX_FRAMES} frames): 10 s becomes 243 frames (10.125 s)."),
        ]),
        io.DynamicCombo.Option("frames", [
            io.Int.Input("frames", default=DEFAULT_FRAMES, min=MIN_FRAMES, max=MAX_FRAMES, step=17,
                         tooltip=f"Clip length at 24 fps. Snapped UP to the next legal H3 length "
                                 f"(5 + 17n: 22, 39, 56, 73, ... {MAX_FRAMES})."),
        ]),
    ], tooltip="Give the clip length in seconds or in frames (24 fps).")


def _plan_inputs(*, with_steps: bool) -> list[io.Input]:
    """The settings both H3 Generate and H3 Memory Plan take (same names, same meaning)."""
    return [
        _preset_input(with_steps=with_steps),
        # h3.c h3_valid_params limits the product, not each side: the widget allows any side that
        # can be part of a legal canvas, the node checks the product before the engine starts.
        io.Int.Input("width", default=DEFAULT_WIDTH, min=CANVAS_MULTIPLE, max=MAX_PIXELS // CANVAS_MULTIPLE,
                     step=CANVAS_MULTIPLE,
                     tooltip="Multiple of 32; width x height at most 768 x 1344 (h3.c h3_valid_params)."),
        io.Int.Input("height", default=DEFAULT_HEIGHT, min=CANVAS_MULTIPLE, max=MAX_PIXELS // CANVAS_MULTIPLE,
                     step=CANVAS_MULTIPLE,
                     tooltip="Multiple of 32; width x height at most 768 x 1344 (h3.c h3_valid_params)."),
        _length_input(),
        io.Int.Input("core_reuse", default=1, min=1, max=6, advanced=True,
                     tooltip="Core residual reuse 1..6 (1 = off). Exclusive with reuse: set reuse to 1."),
        io.Boolean.Input("token_reduction", default=False, advanced=True,
                         tooltip="Faster; may change composition. Keep off at 256x256 and with layers 40 + reuse 3."),
        io.Boolean.Input("int8_row_fc2", default=False, advanced=True,
                         tooltip="~2.6% faster FC2 on M5; cannot be combined with SSD streaming."),
        io.Int.Input("render_width", default=0, min=0, max=MAX_PIXELS // CANVAS_MULTIPLE, step=CANVAS_MULTIPLE,
                     optional=True, advanced=True, tooltip="Render internally at this width and upscale (0 = output size). "
                                            "Set with render_height; same aspect ratio, not larger than the output "
                                            "(e.g. 384x384 for a 512x512 output)."),
        io.Int.Input("render_height", default=0, min=0, max=MAX_PIXELS // CANVAS_MULTIPLE, step=CANVAS_MULTIPLE,
                     optional=True, advanced=True, tooltip="Render internally at this height (0 = output size); see render_width."),
        io.Combo.Input("ssd_streaming", options=list(adapter.SSD_MODES), default="auto",
                       tooltip="Stream DiT blocks from SSD (two resident blocks, much less memory, slower). "
                               "auto: on when the memory plan says the model does not fit in RAM."),
    ]


def _settings(values: dict[str, Any], prompt: str = "") -> adapter.GenerateSettings:
    return adapter.settings_from_node_values(values, prompt)


def _preview_on_node(bar: Any, progress: adapter.ProgressForwarder) -> Callable[[Any], None]:
    """A denoise preview (library mode, or the previews a remote server streams), shown on the node
    as KSampler shows its previews: the progress bar's update with a ("JPEG", PIL image, size
    limit) preview (latent_preview.py)."""
    def show(preview: Any) -> None:
        from PIL import Image
        try:
            from latent_preview import MAX_PREVIEW_RESOLUTION
        except ImportError:     # scripted use without ComfyUI's server modules
            MAX_PREVIEW_RESOLUTION = 512
        image = Image.fromarray(np.ascontiguousarray(preview.image))     # uint8 [H, W, 3]: RGB
        bar.update_absolute(progress.value, adapter.PROGRESS_STEPS, ("JPEG", image, MAX_PREVIEW_RESOLUTION))
    return show


# ----------------------------------------------------------------------------- nodes

# The engine choice in the words every interface uses (vocabulary.EngineKind, ENGINE_KIND_MEANING).
_MODES_TOOLTIP = " ".join(f"{kind.value}: {ENGINE_KIND_MEANING[kind]}." for kind in EngineKind)


def _engine_mode_input() -> io.Input:
    """The engine mode as a dynamic combo: each mode shows only the inputs it reads (remote mode no
    model folder, library mode its library and previews). The default mode comes first (the
    frontend selects a new node's first option): the library when $H3_LIBRARY is set."""
    def engine_path() -> io.Input:
        # One text for every mode: the frontend keeps one translation per input name
        # (nodeDefs.H3EngineV2.inputs.mode_engine_path), whichever mode shows it.
        return io.String.Input("engine_path", default="",
                               tooltip="Path to the h3 binary (or the h3.c checkout). Empty: $H3_BIN, then `h3` on "
                                       "PATH. In library mode it is optional: the h3 for the clips the library hands "
                                       "to a one-shot h3 (a storyboard's multi-line prompts); empty there: none.")

    def model_dir() -> io.Input:
        return io.String.Input("model_dir", default=adapter.DEFAULT_MODEL_NAME,
                               tooltip=f"Folder name under ComfyUI/models/{adapter.MODEL_FOLDER}/ or an absolute path "
                                       "to the MiniMax-H3 download (the folder holding FL2VA/ and Ref2VA/).")

    def stall_timeout() -> io.Input:
        return io.Int.Input("stall_timeout", default=600, min=0, max=_MAX_STALL_TIMEOUT, advanced=True,
                            tooltip="Kill the engine after this many seconds without progress (0 = never).")

    options = {
        adapter.ONE_SHOT: [engine_path(), model_dir(), stall_timeout()],
        adapter.SESSION: [engine_path(), model_dir(), stall_timeout()],
        adapter.LIBRARY: [
            io.String.Input("library_path", default="",
                            tooltip="libh3.dylib, which h3bridge's build-engine links in the h3.c checkout (empty: "
                                    "$H3_LIBRARY). Runs in the checkout it was built in."),
            model_dir(),
            io.Boolean.Input("previews", default=True,
                             tooltip="Show a denoise preview on H3 Generate after every step. Costs upstream's "
                                     "preview VAE (about 10 GiB more; the memory plan counts it)."),
            engine_path(),
            stall_timeout(),
        ],
        adapter.REMOTE: [
            io.String.Input("remote_url", default="",
                            tooltip="The video server, e.g. http://studio-mac.local:8765 (`h3bridge serve` on "
                                    "another Mac, or an SGLang Diffusion / vLLM-Omni server). Its API key is read "
                                    "from H3BRIDGE_API_KEY in ComfyUI's environment, never stored in the workflow."),
        ],
    }
    first = adapter.default_engine_mode()
    order = [first, *(mode for mode in adapter.ENGINE_MODES if mode != first)]
    return io.DynamicCombo.Input(
        "mode", options=[io.DynamicCombo.Option(mode, options[mode]) for mode in order],
        tooltip=_MODES_TOOLTIP + " Each mode shows only the inputs it reads.")


class H3EngineByModeNode(io.ComfyNode):
    """H3 Engine: one mode's inputs at a time (issue 20 item 5). Replaces H3EngineNode, which showed
    every mode's inputs and stays, deprecated, for workflows saved with it."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3EngineV2",
            display_name="H3 Engine",
            category=CATEGORY,
            description="Where the h3 engine (antirez/h3.c) and the MiniMax-H3 model are, or (remote mode) the video "
                        "server that renders. Nothing is loaded here; the engine runs when H3 Generate runs.",
            search_aliases=["h3", "minimax", "engine"],
            inputs=[_engine_mode_input()],
            outputs=[H3Engine.Output(display_name="engine")],
            hidden=[io.Hidden.unique_id],      # the node's notice (a mode saved under its old name)
        )

    @classmethod
    def validate_inputs(cls, **values: Any) -> bool | str:
        """Checked when the graph is queued, before any node runs: every missing piece (the engine,
        the library, the model folder) at once, each with its fix, and the widgets turn red.
        **values: ComfyUI hands a dynamic combo's chosen inputs only to a function taking them all
        (execution.py validate_inputs); it then repeats the message under each of them and skips its
        own range checks, so stall_timeout's is done here. A linked model_dir (H3 Model) arrives as
        None: that node checks its own choice."""
        mode = values.get("mode") or {}
        if not isinstance(mode, dict):
            return True
        problems = _engine_problems(mode)
        return adapter.problems_text(problems) if problems else True

    @classmethod
    @user_facing_errors
    def execute(cls, mode: dict[str, Any]) -> io.NodeOutput:
        return _engine_output(str(mode.get("engine_path") or ""), str(mode.get("model_dir") or ""),
                              mode.get("mode", ""), mode.get("stall_timeout", 600),
                              remote_url=str(mode.get("remote_url") or ""),
                              library_path=str(mode.get("library_path") or ""),
                              previews=bool(mode.get("previews", True)), node_id=cls.hidden.unique_id if cls.hidden else None)


def _engine_problems(values: dict[str, Any]) -> list[H3BridgeError]:
    """What is wrong with an engine node's values (a linked one, None here, is checked when it runs)."""
    from ..errors import RequestError
    problems: list[H3BridgeError] = []
    timeout = values.get("stall_timeout")
    if isinstance(timeout, (int, float)) and not 0 <= timeout <= _MAX_STALL_TIMEOUT:
        problems.append(RequestError(f"{timeout} is outside 0..{_MAX_STALL_TIMEOUT} seconds", field="stall_timeout",
                                     hint="give the seconds without progress before the engine is stopped "
                                          "(0 = never)"))

    def text(name: str) -> str | None:
        """A widget's value; None when linked from another node (known only when the graph runs)."""
        value = values.get(name, "")
        return None if value is None else str(value)

    problems += adapter.engine_setting_problems(text("engine_path"), text("model_dir"), str(values.get("mode") or ""),
                                                model_roots(), remote_url=text("remote_url"),
                                                library_path=text("library_path"))
    return problems


_MAX_STALL_TIMEOUT = 86400


def _engine_output(engine_path: str, model_dir: str, mode: str, stall_timeout: int | float | None, *,
                   remote_url: str, library_path: str, previews: bool, node_id: str | None) -> io.NodeOutput:
    """Both engine nodes' output: the settings checked (nothing started), as one engine handle. A
    mode saved under its old name ("warm session") runs, with a notice on the node."""
    mode, old = adapter.engine_mode(mode)
    handle = adapter.check_engine_settings(engine_path, model_dir, mode, model_roots(),
                                           stall_timeout=float(stall_timeout) if stall_timeout else None,
                                           remote_url=remote_url, library_path=library_path, previews=previews)
    if old is not None:
        notice_on_node(node_id)(adapter.old_mode_notice(old, mode))
    return io.NodeOutput(handle)


class H3EngineNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3Engine",
            display_name="H3 Engine (all modes' inputs, deprecated)",
            category=CATEGORY,
            description="Replaced by H3 Engine, which shows only the chosen mode's inputs; kept so workflows saved "
                        "with this node load and run as they were. Where the h3 engine (antirez/h3.c) and the "
                        "MiniMax-H3 model are, or (remote mode) the video server that renders.",
            is_deprecated=True,
            inputs=[
                # Every mode's inputs are shown (a dynamic combo per mode would reorder the saved widget
                # values of every workflow made so far); each tooltip says which modes read it.
                io.String.Input("engine_path", default="",
                                tooltip="one-shot and session (library: optional): path to the h3 binary (or the "
                                        "h3.c checkout). Empty: $H3_BIN, then `h3` on PATH. Not read in remote mode."),
                io.String.Input("model_dir", default=adapter.DEFAULT_MODEL_NAME,
                                tooltip=f"one-shot, session and library: folder name under "
                                        f"ComfyUI/models/{adapter.MODEL_FOLDER}/ or an absolute path to the MiniMax-H3 "
                                        "download (the folder holding FL2VA/ and Ref2VA/). Not read in remote mode."),
                io.Combo.Input("mode", options=list(adapter.ENGINE_MODES), default=adapter.default_engine_mode(),
                               tooltip=_MODES_TOOLTIP + " library is the default when H3_LIBRARY is set; remote "
                                                        "reads only remote_url."),
                io.Int.Input("stall_timeout", default=600, min=0, max=_MAX_STALL_TIMEOUT, advanced=True,
                             tooltip="Kill the engine after this many seconds without progress (0 = never)."),
                # Last and optional: saved workflows list widget values in input order, and API-format
                # prompts name their inputs; ones saved before these modes existed still load and run.
                io.String.Input("remote_url", default="", optional=True,
                                tooltip="remote mode only (not read in the others): the server, e.g. "
                                        "http://studio-mac.local:8765 (`h3bridge serve` on another Mac, or an SGLang "
                                        "Diffusion / vLLM-Omni server). Its API key is read from H3BRIDGE_API_KEY in "
                                        "ComfyUI's environment, never stored in the workflow."),
                io.String.Input("library_path", default="", optional=True,
                                tooltip="library mode only (not read in the others): libh3.dylib, which h3bridge's "
                                        "build-engine links in the h3.c checkout (empty: $H3_LIBRARY). Runs in the "
                                        "checkout it was built in."),
                io.Boolean.Input("previews", default=True, optional=True,
                                 tooltip="library mode only (not read in the others): show a denoise preview on H3 "
                                         "Generate after every step. Costs upstream's preview VAE (about 10 GiB "
                                         "more; the memory plan counts it)."),
            ],
            outputs=[H3Engine.Output(display_name="engine")],
            hidden=[io.Hidden.unique_id],      # the node's notice (a mode saved under its old name)
        )

    @classmethod
    def validate_inputs(cls, **values: Any) -> bool | str:
        """As H3 Engine's: everything missing at once, before anything runs. Taking every input also
        lets a workflow saved with the old mode name ("warm session") pass ComfyUI's list check: the
        name is read through the vocabulary (and the node says the new name when it runs)."""
        problems = _engine_problems(values)
        return adapter.problems_text(problems) if problems else True

    @classmethod
    @user_facing_errors
    def execute(cls, engine_path: str, model_dir: str, mode: str, stall_timeout: int = 600, remote_url: str = "",
                library_path: str = "", previews: bool = True) -> io.NodeOutput:
        return _engine_output(engine_path, model_dir, mode, stall_timeout, remote_url=remote_url or "",
                              library_path=library_path or "", previews=previews, node_id=cls.hidden.unique_id if cls.hidden else None)


class H3GenerateNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3Generate",
            display_name="H3 Generate",
            category=CATEGORY,
            description="Render a video with synchronized stereo audio with MiniMax-H3 on the h3 engine. "
                        "Models ComfyUI holds in memory are unloaded first, to leave the engine room. "
                        "If the IMAGE output is not connected, frames are not decoded and IMAGE is a single "
                        "black placeholder frame.",
            inputs=[
                H3Engine.Input("engine"),
                io.String.Input("prompt", multiline=True, default="",
                                tooltip="What to render, best as Scene/Action/Camera/Look/Audio sections (the H3 Prompt "
                                        "node). The session mode takes only a one-line prompt (H3 Prompt's output is one "
                                        "line); a multi-line prompt runs one-shot, and the node says so."),
                *_plan_inputs(with_steps=True)[:4],
                io.Int.Input("seed", default=DEFAULT_SEED, min=0, max=MAX_SEED, control_after_generate=True,
                             tooltip=f"Native random stream seed (h3 default {DEFAULT_SEED})."),
                *_plan_inputs(with_steps=True)[4:],
                io.Image.Input("first_frame", optional=True, tooltip="Anchor image for the first frame (FL2VA)."),
                io.Image.Input("last_frame", optional=True, tooltip="Anchor image for the last frame (FL2VA)."),
                H3References.Input("references", optional=True,
                                   tooltip="Ordered references from H3 References (Ref2VA); not with frame anchors."),
                # Last and optional: workflows saved before it still load and run.
                io.Boolean.Input("force", default=False, optional=True, advanced=True,
                                 tooltip="Run even when the memory plan says these settings do not fit this "
                                         "machine (macOS may swap or stop h3). Off: such a job is refused before "
                                         "the engine starts, with the settings that fit (often ssd_streaming on)."),
                takes_input(f"Render the request this many times (1-{MAX_TAKES}), with the seed and the ones "
                            "above it, and show their contact sheet on the node. A warm engine (session, "
                            "library) loads the model once for all of them."),
                io.Int.Input("pick", default=1, min=1, max=MAX_TAKES, optional=True,
                             tooltip="The take the video, frames and audio outputs carry (1 to takes). Choosing "
                                     "another renders nothing: the takes are kept (keep the seed fixed: its "
                                     "control after generate set to fixed)."),
                background_input("the clip (every take)"),
            ],
            outputs=[
                io.Video.Output(display_name="video", tooltip="The engine's MP4 with its audio (with takes: the pick)."),
                io.Image.Output(display_name="frames",
                                tooltip="All frames [F, H, W, 3]. Only decoded when this output is connected."),
                io.Audio.Output(display_name="audio", tooltip="Stereo 32 kHz soundtrack."),
                io.String.Output(display_name="summary", tooltip="Request, timings and memory plan."),
                takes_output("With takes: the contact sheet as a batch, one picture per take (its take number, "
                             "seed and four frames). Without: one black placeholder frame."),
            ],
            hidden=[io.Hidden.prompt, io.Hidden.unique_id],
        )

    # No validate_inputs: ComfyUI repeats its message once per input it takes, and with dynamic
    # combos (preset, length_unit) it passes those too, whatever the signature (execution.py
    # validate_inputs -> _io.build_nested_inputs). Rules over several inputs (the canvas pixel cap,
    # render aspect, reuse with core_reuse, a blank prompt) are checked when the node runs, each
    # reported once, before the engine starts. ComfyUI still checks each widget's range and options.

    @classmethod
    def fingerprint_inputs(cls, **values: Any) -> Any:
        # The cached outputs depend on whether IMAGE was built; re-run when that changes.
        return adapter.output_is_connected(running_prompt(), cls.hidden.unique_id if cls.hidden else None,
                                           adapter.IMAGE_OUTPUT_INDEX)

    @classmethod
    @user_facing_errors
    def execute(cls, engine: adapter.EngineHandle, prompt: str, first_frame: Any = None, last_frame: Any = None,
                references: ReferenceList | None = None, takes: int = 1, pick: int = 1,
                **values: Any) -> io.NodeOutput:
        hidden = cls.hidden       # (None when the node is called outside ComfyUI's executor)
        node_id = hidden.unique_id if hidden else None
        engine = adapter.with_background(engine, bool(values.pop("background", False)))     # this job's engine
        want_image = adapter.output_is_connected(hidden.prompt if hidden else None, node_id, adapter.IMAGE_OUTPUT_INDEX)
        # h3 needs tens of GiB of the Mac's unified memory: models ComfyUI keeps loaded between
        # prompts would push it into swap or the OOM killer, so they go first (reloaded when needed).
        comfy.model_management.unload_all_models()
        comfy.model_management.soft_empty_cache()
        bar = comfy.utils.ProgressBar(adapter.PROGRESS_STEPS, node_id=node_id)
        progress, node_text = adapter.node_progress(engine, lambda value, total: bar.update_absolute(value, total),
                                                    notice_on_node(node_id))   # the notice, then the ETA
        cancel = CancelToken(check=comfy.model_management.processing_interrupted)
        with RUNNING_JOBS.job(node_id) as pause:     # the Pause button
            outputs = adapter.run_generate(
                engine, _settings(values, prompt),
                adapter.GenerateInputs(
                    first_frame=None if first_frame is None else to_numpy(first_frame),
                    last_frame=None if last_frame is None else to_numpy(last_frame),
                    references=references),
                scratch_parent=work_dir("inputs"), output_dir=work_dir("outputs"), want_image=want_image,
                on_progress=progress, on_notice=node_text.notice, cancel=cancel,
                on_preview=_preview_on_node(bar, progress), takes=takes, pick=pick, pause=pause)
        progress.finish()
        takes_image = outputs.takes_image if outputs.takes_image is not None else \
            adapter.placeholder_image(outputs.result.width, outputs.result.height)
        sheet = None if outputs.sheet is None else ui.PreviewImage(torch.from_numpy(outputs.sheet), cls=cls)
        return io.NodeOutput(
            InputImpl.VideoFromFile(str(outputs.video_path)),
            torch.from_numpy(outputs.image),
            {"waveform": torch.from_numpy(outputs.waveform), "sample_rate": outputs.sample_rate},
            outputs.summary,
            torch.from_numpy(takes_image),
            ui=sheet,
        )


_KINDS: dict[str, ReferenceKind] = {
    "image": ReferenceKind.IMAGE,
    "video": ReferenceKind.SILENT_VIDEO,
    "video with its audio": ReferenceKind.VIDEO,
    "video plus replacement audio": ReferenceKind.VIDEO_AUDIO,
    "audio": ReferenceKind.AUDIO,
}


class H3ReferencesNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3References",
            display_name="H3 References",
            category=CATEGORY,
            description="Append one reference to an ordered list (chain several nodes). In the prompt, refer to them "
                        "as <Picture i>, <Video k>, <Audio j>. Limits: 12 references, 9 images, 3 videos, "
                        "3 audio inputs (a video with its audio counts as one video and one audio).",
            inputs=[
                H3References.Input("previous", optional=True, tooltip="References earlier in the order."),
                io.Combo.Input("kind", options=list(_KINDS), default="image",
                               tooltip="image: IMAGE. video: VIDEO, soundtrack ignored. video with its audio: VIDEO "
                                       "with its own soundtrack. video plus replacement audio: VIDEO + AUDIO. "
                                       "audio: AUDIO (needs an image or video reference too)."),
                io.Image.Input("image", optional=True),
                io.Video.Input("video", optional=True),
                io.Audio.Input("audio", optional=True),
            ],
            outputs=[H3References.Output(display_name="references")],
        )

    @classmethod
    @user_facing_errors
    def execute(cls, kind: str, previous: ReferenceList | None = None, image: Any = None, video: Any = None,
                audio: dict | None = None) -> io.NodeOutput:
        if kind not in _KINDS:
            raise ValueError(f"unknown reference kind {kind!r}; use one of {', '.join(_KINDS)}")
        item = ReferenceItem(
            kind=_KINDS[kind],
            image=None if image is None else to_numpy(image),
            video=None if video is None else _video_source(video),
            audio=None if audio is None else _audio_clip(audio),
        )
        return io.NodeOutput((previous or ReferenceList()).appended(item))


class H3PromptNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3Prompt",
            display_name="H3 Prompt",
            category=CATEGORY,
            description="Build the Scene / Action / Camera / Look / Audio prompt H3 was trained on "
                        "(upstream README, 'Improve the prompt'); empty fields are left out. With only "
                        "free_text, it cleans that text instead. The output is one line, so the session mode "
                        "can take it (h3's interactive mode reads one line per prompt).",
            inputs=[
                # Each box shows its name above its text (web/h3_prompt_labels.js): ComfyUI's canvas
                # draws a multiline box's name only as a placeholder, gone once there is text.
                io.String.Input("scene", multiline=True, default="", placeholder="Scene: subject and setting",
                                tooltip="Scene: subject and setting."),
                io.String.Input("action", multiline=True, default="", placeholder="Action: what happens",
                                tooltip="Action: what happens."),
                io.String.Input("camera", multiline=True, default="", placeholder="Camera: shot, lens, movement",
                                tooltip="Camera: shot, lens, movement."),
                io.String.Input("look", multiline=True, default="", placeholder="Look: lighting and style",
                                tooltip="Look: lighting and style."),
                io.String.Input("audio", multiline=True, default="",
                                placeholder="Audio: desired sound; say 'no music' if so",
                                tooltip="Audio: desired sound; say 'no music' if so."),
                io.String.Input("free_text", multiline=True, default="", optional=True,
                                placeholder="Free text: used (cleaned, on one line) when the five boxes are empty",
                                tooltip="Used (cleaned, joined to one line) when all the boxes above are empty."),
                io.Int.Input("max_bytes", default=0, min=0, max=65536, advanced=True,
                             tooltip="Cap the prompt's UTF-8 size (0 = no cap); cuts between words."),
            ],
            outputs=[io.String.Output(display_name="prompt")],
        )

    @classmethod
    @user_facing_errors
    def execute(cls, scene: str, action: str, camera: str, look: str, audio: str, free_text: str = "",
                max_bytes: int = 0) -> io.NodeOutput:
        return io.NodeOutput(adapter.compose_prompt(scene, action, camera, look, audio, free_text,
                                                    max_bytes=max_bytes or None))


class H3MemoryPlanNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3MemoryPlan",
            display_name="H3 Memory Plan",
            category=CATEGORY,
            description="Show whether these settings fit this machine's memory, and with SSD streaming or not, "
                        "before anything runs.",
            inputs=[H3Engine.Input("engine"), *_plan_inputs(with_steps=False)],
            outputs=[io.String.Output(display_name="plan")],
        )

    @classmethod
    @user_facing_errors
    def execute(cls, engine: adapter.EngineHandle, **values: Any) -> io.NodeOutput:
        return io.NodeOutput(adapter.describe_plan(engine, _settings(values, "memory plan")))


NODES: list[type[io.ComfyNode]] = [H3EngineByModeNode, H3EngineNode, H3GenerateNode, H3ReferencesNode, H3PromptNode, H3MemoryPlanNode]


class H3BridgeExtension(ComfyExtension):
    async def on_load(self) -> None:
        model_roots()   # registers ComfyUI/models/h3 (no disk access)
        # bin/h3-sim (the simulator as an engine path, for a checkout without console scripts)
        # runs in ComfyUI's own python, which has the pack's requirements.
        os.environ.setdefault("H3BRIDGE_PYTHON", sys.executable)
        try:
            # A server stopped with SIGTERM/SIGHUP mid-render would leave the job's scratch inputs in
            # temp/h3bridge/inputs: remove them first, then the signal does what it did before.
            adapter.install_termination_cleanup()
        except ValueError:
            pass         # not the main thread: Python allows signal handlers only there
        try:
            from server import PromptServer     # ComfyUI's own server: the Pause button's routes
            register_pause_routes(PromptServer.instance)
        except (ImportError, AttributeError):
            pass         # no server (scripted use): nothing to press

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [*NODES, *MODEL_NODES, *HEX_NODES, *LORA_NODES, *STORY_NODES, *SELFTEST_NODES]


async def comfy_entrypoint() -> H3BridgeExtension:
    return H3BridgeExtension()
