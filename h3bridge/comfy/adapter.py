"""Everything the ComfyUI nodes do, without ComfyUI.

The nodes in `nodes.py` only translate between ComfyUI values (torch tensors,
AUDIO dicts, VIDEO objects, hidden PROMPT/UNIQUE_ID) and the plain values used
here (numpy arrays, paths, dataclasses). No module imported from here imports
comfy, torch or folder_paths, so all of it is testable in CI.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..cancel import CancelToken, PauseControl
from ..engines.locate import locate_engine
from ..engines.process import stop_live_engines
from ..engines.protocol import Engine
from ..errors import (H3BridgeError, MemoryPlanError, ModelError, RequestError, SessionUnsupportedError,
                      UnsupportedRequestError)
from ..fixes import Change, Fix, Given, changes, python_word, said
from ..model.memory import MachineFacts, MemoryPlan, check_model_for, plan_memory
from ..model.inventory import inspect_model
from ..model.download import ALL_DOWNLOAD_GIB, FL2VA_DOWNLOAD_GIB
from ..history.eta import format_eta
from ..vocabulary import ENGINE_KINDS, EngineKind, read_engine_kind
from ..progress import PAUSED_PHASE, PreviewFrame, ProgressEvent
from ..prompt import StructuredPrompt, clean_prompt_text
from ..media.references import (
    AudioClip,
    ReferenceList,
    RunDirectory,
    describe_kind,
    materialise_references,
    write_png,
)
from ..request import (
    DEFAULT_FRAMES,
    DEFAULT_HEIGHT,
    DEFAULT_SEED,
    DEFAULT_WIDTH,
    PRESETS,
    GenerationRequest,
    Reference,
    ReferenceKind,
)
from ..geometry import FPS, MAX_FRAMES, MIN_FRAMES, SAMPLE_RATE, align_frame_count, frames_from_seconds
from ..result import GenerationResult
from ..engines.session import session_prompt

# ----------------------------------------------------------------------------- choices

# The engine mode is the engine choice of every interface (vocabulary.EngineKind), spelled the same.
ONE_SHOT = EngineKind.ONE_SHOT.value
SESSION = EngineKind.SESSION.value       # h3's interactive mode kept warm between clips
LIBRARY = EngineKind.LIBRARY.value       # libh3 in a warm worker: previews, exact frames (engines/library.py)
from .remote import REMOTE, check_remote_settings, open_remote_engine   # a Videos API server as the engine
from .pause import PAUSED_TEXT      # what the node says while its engine is paused

from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from .takes import RenderedTakes, TakesCache
ENGINE_MODES: tuple[str, ...] = ENGINE_KINDS
SSD_MODES: tuple[str, ...] = ("auto", "on", "off")
LENGTH_UNITS: tuple[str, ...] = ("seconds", "frames")
DEFAULT_PRESET = "balanced"             # what the examples use and the Mac table recommends
# The default first: a dynamic combo (H3 Generate's preset) starts on its first option.
PRESET_NAMES: tuple[str, ...] = (DEFAULT_PRESET, *(name for name in PRESETS if name != DEFAULT_PRESET))
MODEL_FOLDER = "h3"                      # ComfyUI/models/h3/<model dir>
DEFAULT_MODEL_NAME = "MiniMax-H3"
# H3 Model's one option when no model folder is installed: not a name that looks like a model.
NO_MODEL_INSTALLED = f"(no model in models/{MODEL_FOLDER})"

# Output order of the H3 Generate node; IMAGE is the one that can be skipped.
GENERATE_OUTPUTS: tuple[str, ...] = ("VIDEO", "IMAGE", "AUDIO", "STRING")
IMAGE_OUTPUT_INDEX = GENERATE_OUTPUTS.index("IMAGE")

# ComfyUI progress bars take integers; 1000 steps gives 0.1 % resolution.
PROGRESS_STEPS = 1000


# ----------------------------------------------------------------------------- engine handle

@dataclass(frozen=True)
class EngineHandle:
    """The H3_ENGINE value: where the engine and model are and how to run them.

    Small and immutable: creating one starts nothing; `open_engine` does the work
    when a Generate node runs.
    """

    engine_path: Path | None         # None in remote mode (the server's engine), or library mode without an h3 program
    model_dir: Path | None           # None in remote mode
    mode: str = ONE_SHOT
    stall_timeout: float | None = None
    remote_url: str | None = None    # remote mode: the server (its API key is never held here)
    library_path: Path | None = None    # library mode: libh3's shared library
    previews: bool = False              # library mode: denoise previews on the node (the preview VAE)
    background: bool = False            # the engine at background priority (a node's `background` input)

    def describe(self) -> str:
        if self.mode == REMOTE:
            return f"remote engine at {self.remote_url}"
        if self.mode == LIBRARY:
            return f"{self.mode} engine {self.library_path} with model {self.model_dir}"
        return f"{self.mode} engine {self.engine_path} with model {self.model_dir}"


def resolve_model_dir(value: str, search_roots: Sequence[Path]) -> Path:
    """A model directory from a node value: an absolute/home path, or a name under a
    registered model folder (ComfyUI/models/h3/NAME)."""
    text = value.strip()
    if not text:
        raise ModelError("no model directory given",
                         hint=f"put the MiniMax-H3 folder in ComfyUI/models/{MODEL_FOLDER}/ and give its name, "
                              "or give an absolute path")
    candidate = Path(os.path.expanduser(text))
    if candidate.is_absolute():
        if candidate.is_dir():
            return candidate
        raise ModelError(f"model directory {candidate} does not exist or is not a directory",
                         hint=f"give the folder that holds FL2VA/ (and Ref2VA/), or {download_advice(candidate)}")
    tried = [root / candidate for root in search_roots]
    for path in tried:
        if path.is_dir():
            return path.resolve()
    where = ", ".join(str(p) for p in tried) or "(no model folders registered)"
    download = f"{download_advice(tried[0])}; or " if tried else ""
    raise ModelError(f"model directory {text!r} was not found (looked in {where})",
                     hint=f"{download}put the MiniMax-H3 folder in ComfyUI/models/{MODEL_FOLDER}/{text}, "
                          "or give an absolute path")


# The download sizes in short, for descriptions (download.py has the full note).
SIZES_IN_SHORT = f"about {FL2VA_DOWNLOAD_GIB} GiB for FL2VA alone, {ALL_DOWNLOAD_GIB} GiB for all"


def download_advice(directory: Path) -> str:
    """The exact command that puts the model at `directory`, with its size."""
    from ..model.download import download_command, partition_size_note
    return f"download it: `{download_command(directory)}` downloads {partition_size_note(directory)}"


def installed_models(search_roots: Sequence[Path]) -> list[str]:
    """The model folders under the registered model folders (ComfyUI/models/h3/*): those holding
    FL2VA/ or Ref2VA/ (an unfinished download is listed too: H3 Engine says what it lacks)."""
    from ..model.inventory import PARTITIONS
    names: dict[str, None] = {}
    for root in search_roots:
        try:
            children = sorted(root.iterdir())
        except OSError:
            continue
        for child in children:
            if child.is_dir() and any((child / partition).is_dir() for partition in PARTITIONS):
                names.setdefault(child.name, None)
    return list(names)


def resolve_engine_path(value: str) -> Path:
    """The engine binary: the given path, or (empty) what `locate_engine` finds."""
    text = value.strip()
    return Path(locate_engine(os.path.expanduser(text) if text else None))


def engine_mode(value: str) -> tuple[str, str | None]:
    """The node's mode value as the engine choice (vocabulary.EngineKind), and the old spelling it
    was saved in (a workflow from before issue 30: "warm session"), None for a current one."""
    try:
        kind, old = read_engine_kind(value)
    except ValueError:
        raise RequestError(f"unknown engine mode {value!r}", field="mode",
                           hint=f"choose one of: {', '.join(ENGINE_MODES)}") from None
    return kind.value, old


def old_mode_notice(old: str, mode: str) -> str:
    """The node's one-line notice for a mode saved under its old name."""
    return f"mode {old!r} is now called {mode!r} (the workflow ran as saved; save it again to keep the new name)"


def engine_setting_problems(engine_path: str | None, model_dir: str | None, mode: str, search_roots: Sequence[Path],
                            *, remote_url: str | None = "", library_path: str | None = "") -> list[H3BridgeError]:
    """Everything wrong with the H3 Engine node's values, each with its fix, found cheaply (no
    engine run, no weights read): the engine (or library, or server URL) AND the model folder, so a
    new user is told every missing piece at once instead of one per run. None: a value linked from
    another node, unknown until it runs (H3 Model checks its own choice; the run checks the rest)."""
    try:
        mode, _old = engine_mode(mode)
    except RequestError as error:
        return [error]
    if mode == REMOTE:
        try:
            if remote_url is not None:
                check_remote_settings(remote_url)
        except H3BridgeError as error:
            return [error]
        return []
    problems: list[H3BridgeError] = []
    try:
        if mode == LIBRARY:
            from ..engines.library import locate_library
            if library_path is not None:
                locate_library(os.path.expanduser(library_path.strip()) or None)
            if engine_path is not None and engine_path.strip():
                resolve_engine_path(engine_path)
        elif engine_path is not None:
            resolve_engine_path(engine_path)
    except H3BridgeError as error:
        problems.append(error)
    try:
        if model_dir is not None:
            check_model_layout(resolve_model_dir(model_dir, search_roots))
    except H3BridgeError as error:
        problems.append(error)
    return problems


def problem_input(problem: H3BridgeError) -> str | None:
    """The engine node's input a problem is about (the word the user sees on the node)."""
    from ..errors import EngineNotFoundError, LibraryLoadError
    if isinstance(problem, RequestError) and problem.field:
        return problem.field
    if isinstance(problem, ModelError):
        return "model_dir"
    if isinstance(problem, LibraryLoadError):
        return "library_path"
    if isinstance(problem, EngineNotFoundError):
        return "engine_path"
    return None


def problems_text(problems: Sequence[H3BridgeError]) -> str:
    """One message for several problems, numbered, each led by the input it is about and with its
    fix (the pack's frontend extension outlines those inputs)."""
    def one(problem: H3BridgeError) -> str:
        name = problem_input(problem)
        return f"{name}: {problem}" if name else str(problem)
    if len(problems) == 1:
        return one(problems[0])
    return f"{len(problems)} things to fix before this can run:\n" + "\n".join(
        f"{index}. {one(problem)}" for index, problem in enumerate(problems, 1))


def check_engine_settings(engine_path: str, model_dir: str, mode: str, search_roots: Sequence[Path],
                          *, stall_timeout: float | None = None, remote_url: str = "", library_path: str = "",
                          previews: bool = True) -> EngineHandle:
    """Validate the H3 Engine node's values cheaply (no engine run, no weights read). Library
    mode needs the library (library_path or $H3_LIBRARY), not the h3 program; remote mode only
    the server's URL. Every problem is reported at once (`engine_setting_problems`)."""
    mode, _old = engine_mode(mode)
    problems = engine_setting_problems(engine_path, model_dir, mode, search_roots, remote_url=remote_url,
                                       library_path=library_path)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise RequestError(problems_text(problems), field="mode")
    if mode == REMOTE:
        return EngineHandle(engine_path=None, model_dir=None, mode=REMOTE, remote_url=check_remote_settings(remote_url))
    if mode == LIBRARY:
        from ..engines.library import locate_library
        library = locate_library(os.path.expanduser(library_path.strip()) or None)
        engine = resolve_engine_path(engine_path) if engine_path.strip() else None
    else:
        library, engine = None, resolve_engine_path(engine_path)
    model = resolve_model_dir(model_dir, search_roots)
    return EngineHandle(engine_path=engine, model_dir=model, mode=mode, stall_timeout=stall_timeout,
                        library_path=library, previews=previews and mode == LIBRARY)


def default_engine_mode() -> str:
    """The H3 Engine node's default mode: the library when one is configured ($H3_LIBRARY)."""
    from ..engines.library import LIBRARY_ENV
    return LIBRARY if os.environ.get(LIBRARY_ENV) else ONE_SHOT


def check_model_setting(model_dir: str, search_roots: Sequence[Path]) -> Path | None:
    """The H3 Engine node's queue-time check: the model folder alone (found, laid out right).

    ComfyUI repeats a `validate_inputs` message once per input that function takes, so the queue
    check takes this one input and a missing model is reported once, under model_dir; the engine
    path is checked when the node runs (`check_engine_settings`), before any engine starts.
    The default name not found is left to that run-time check, which knows the mode: remote mode
    reads no model_dir, and a new node switched to remote must run as it is (None returned)."""
    if model_dir.strip() == DEFAULT_MODEL_NAME and not any((root / DEFAULT_MODEL_NAME).is_dir()
                                                           for root in search_roots):
        return None
    model = resolve_model_dir(model_dir, search_roots)
    check_model_layout(model)
    return model


def check_model_choice(model: str, search_roots: Sequence[Path]) -> Path:
    """H3 Model's check (queue time and run): the chosen folder must be there and laid out right.
    Nothing installed (its placeholder option, or a saved name absent here): the folder it would be
    downloaded to and the command, runnable where ComfyUI runs (`runnable`)."""
    if model == NO_MODEL_INSTALLED or not installed_models(search_roots):
        where = ", ".join(str(root) for root in search_roots) or f"ComfyUI/models/{MODEL_FOLDER}"
        target = (search_roots[0] if search_roots else Path(MODEL_FOLDER)) / DEFAULT_MODEL_NAME
        raise ModelError(f"no MiniMax-H3 model is installed (looked in {where})",
                         hint=f"{download_advice(target)}; then refresh the page (R) and pick it in model")
    model_dir = resolve_model_dir(model, search_roots)
    check_model_layout(model_dir)
    return model_dir


def check_model_layout(model_dir: Path) -> None:
    """The cheap structural check of a model directory (layout only, no shard headers read),
    so a wrong folder is reported when the graph is queued, not minutes into a run."""
    inspect_model(model_dir, read_headers=False).raise_for_problems()


def open_engine(handle: EngineHandle) -> Engine:
    """The engine of this handle's kind (engines/factory.py), the session alone: `engine_for_node`
    puts its one-shot fallback behind it.

    The local engines are the process-wide warm ones for (engine, model), so the model stays
    resident across queue runs and graphs (until its idle timeout); this job's engine node decides
    its watchdog (its error tells users to raise it)."""
    if handle.mode == REMOTE:
        return open_remote_engine(handle.remote_url or "")
    from ..engines.factory import open_engine as open_kind
    return open_kind(handle.mode, engine_path=handle.engine_path, model_dir=handle.model_dir,
                     stall_timeout=handle.stall_timeout, library_path=handle.library_path,
                     shared=handle.mode != ONE_SHOT, fallback=False, background=handle.background)


def engine_for_node(handle: EngineHandle, engine_factory: Callable[[EngineHandle], Engine] = open_engine, *,
                    on_fallback: Callable[[UnsupportedRequestError], None] | None = None) -> Engine:
    """The engine a node runs on: a session behind its one-shot fallback (engines/fallback.py, the one
    fallback every interface uses), built only if a request needs it: a remote or library setup on
    a machine with no local `h3` never looks for one."""
    engine = engine_factory(handle)
    if handle.mode != SESSION:
        return engine
    from ..engines.fallback import FallbackEngine
    return FallbackEngine(engine, lambda: engine_factory(one_shot_handle(handle)), on_fallback=on_fallback)


def one_shot_handle(handle: EngineHandle) -> EngineHandle:
    return EngineHandle(handle.engine_path, handle.model_dir, ONE_SHOT, handle.stall_timeout,
                        background=handle.background)


def with_background(handle: EngineHandle, background: bool) -> EngineHandle:
    """The engine a node opens, at background priority as its `background` input says (the CLI's
    --background and the storyboard key reach the same open_engine(background=)). A remote engine
    renders at its server's priority: asking for it there is refused in the node's words."""
    if background and handle.mode == REMOTE:
        from ..runnable import h3bridge_command
        raise RequestError("background is for a local engine: the remote engine renders at its server's priority",
                           field="background",
                           hint=f"set background to false on this node; to render in the background there, start "
                                f"the server with `{h3bridge_command('serve', '--background')}`")
    return replace(handle, background=bool(background))


# ----------------------------------------------------------------------------- prompt

def compose_prompt(scene: str, action: str, camera: str, look: str, audio: str, free_text: str = "", *,
                   max_bytes: int | None = None) -> str:
    """The H3 Prompt node's output: upstream's Scene / Action / Camera / Look / Audio sections
    (README "Improve the prompt"), or the cleaned free text when they are all empty, on ONE line.

    h3's interactive mode reads one line per prompt, so a multi-line prompt cannot go to a warm
    session; on one line the same text runs in both modes (the same clip for the same seed)."""
    sections = (scene, action, camera, look, audio)
    if not any(part.strip() for part in sections) and free_text.strip():
        text = clean_prompt_text(free_text, max_bytes=max_bytes)
    else:
        text = StructuredPrompt(*sections).render(max_bytes=max_bytes)
    try:
        return session_prompt(text, join_prompt_lines=True)
    except SessionUnsupportedError:
        # Only a free text starting with '!' (a session command): kept as written; H3 Generate
        # says on its node that this prompt runs one-shot.
        return text


def preset_values(name: str) -> str:
    """'20 steps, 45 layers, reuse 2': what a preset sets, for node labels and tooltips."""
    preset = PRESETS[name]
    return f"{preset.steps} steps, {preset.layers} layers, reuse {preset.reuse}"


# ----------------------------------------------------------------------------- request

@dataclass(frozen=True)
class GenerateSettings:
    """The H3 Generate / H3 Memory Plan node values, as plain Python."""

    prompt: str = ""
    preset: str = DEFAULT_PRESET
    width: int = DEFAULT_WIDTH
    height: int = DEFAULT_HEIGHT
    length_unit: str = "seconds"
    seconds: float = 2.0
    frames: int = DEFAULT_FRAMES
    steps: int = 0              # 0: the preset's
    seed: int = DEFAULT_SEED
    layers: int = 0             # 0: the preset's
    reuse: int = 0              # 0: the preset's
    core_reuse: int = 1         # 1: off (mutually exclusive with reuse > 1)
    token_reduction: bool = False
    int8_row_fc2: bool = False
    render_width: int = 0       # internal canvas (README "Internal canvas"); 0 and 0: the output size
    render_height: int = 0
    ssd_streaming: str = "auto"
    force: bool = False         # run even when the memory plan says it does not fit


def settings_from_node_values(values: Mapping[str, Any], prompt: str = "") -> GenerateSettings:
    """H3 Generate / H3 Memory Plan values -> GenerateSettings. A dynamic combo (preset, length_unit)
    arrives as a dict of its own choice, under its name, and the widgets of that choice:
    {"preset": "balanced", "steps": 20, "layers": 45, "reuse": 2}. Other node values (the engine,
    media inputs) are not settings and are left out."""
    names = set(GenerateSettings.__dataclass_fields__)
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(value)
        else:
            flat[key] = value
    chosen = {key: value for key, value in flat.items() if key in names and value is not None}
    chosen["prompt"] = prompt
    return GenerateSettings(**chosen)


def snap_frames(frames: int) -> int:
    """The legal H3 length a frame count becomes: upstream's upward rounding to 5 + 17n
    (h3_host.c `h3_align_frame_count`), kept inside the released 22..362 range."""
    return min(max(align_frame_count(int(frames)), MIN_FRAMES), MAX_FRAMES)


def frames_for(settings: GenerateSettings) -> int:
    """The frame count the node will request, after snapping."""
    if settings.length_unit == "seconds":
        if settings.seconds <= 0:
            raise RequestError(f"seconds={settings.seconds:g} must be positive", field="seconds",
                               hint=f"e.g. seconds={MIN_FRAMES / FPS:.3f}")
        return snap_frames(frames_from_seconds(settings.seconds))
    if settings.length_unit == "frames":
        return snap_frames(settings.frames)
    raise RequestError(f"unknown length unit {settings.length_unit!r}", field="length_unit",
                       hint=f"use one of: {', '.join(LENGTH_UNITS)}")


def build_request(settings: GenerateSettings, *, ssd_streaming: bool = False,
                  first_frame: Path | None = None, last_frame: Path | None = None,
                  references: tuple = ()) -> GenerationRequest:
    """Node values -> GenerationRequest (preset first, then the explicit overrides)."""
    if settings.preset not in PRESETS:
        raise RequestError(f"unknown preset {settings.preset!r}", field="preset",
                           hint=f"use one of: {', '.join(PRESETS)}")
    if settings.core_reuse > 1 and settings.reuse > 1:
        # README "4. Choose a speed/quality preset": `--reuse` and `--core-reuse` are mutually exclusive.
        raise RequestError(f"reuse={settings.reuse} and core_reuse={settings.core_reuse} are mutually exclusive",
                           field="core_reuse", hint="set reuse to 1 (core reuse replaces it), or core_reuse to 1")
    overrides: dict[str, object] = {
        "width": settings.width,
        "height": settings.height,
        "frames": frames_for(settings),
        "seed": settings.seed,
        "token_reduction": settings.token_reduction,
        "int8_row_fc2": settings.int8_row_fc2,
        "ssd_streaming": ssd_streaming,
        "first_frame": first_frame,
        "last_frame": last_frame,
        "references": tuple(references),
    }
    if settings.steps > 0:
        overrides["steps"] = settings.steps
    if settings.render_width > 0 or settings.render_height > 0:
        # Both or neither; request validation names the missing one and the legal sizes.
        overrides["render_width"] = settings.render_width or None
        overrides["render_height"] = settings.render_height or None
    if settings.layers > 0:
        overrides["layers"] = settings.layers
    if settings.core_reuse > 1:
        overrides["core_reuse"] = settings.core_reuse
        overrides["reuse"] = 1          # core reuse replaces the preset's whole-velocity reuse
    elif settings.reuse > 0:
        overrides["reuse"] = settings.reuse
    return GenerationRequest.from_preset(settings.preset, settings.prompt, **overrides)


def plan_text(plan: MemoryPlan) -> str:
    return plan.render(words=node_words)      # its fix as the nodes' inputs, not the CLI's flags


def decide_ssd_streaming(choice: str, request: GenerationRequest, model_dir: Path, *,
                         machine: MachineFacts | Callable[[], MachineFacts] | None = None, session: bool = False,
                         model_warnings: "list[str | Fix] | None" = None, preview: bool = False,
                         force: bool = False) -> tuple[bool, MemoryPlan]:
    """SSD streaming on/off from the node's choice and the memory plan for it (`session`: planned
    for the warm session, which keeps the DiT and the video decoder loaded between clips).

    The model is checked first (layout, shard headers, Ref2VA), whatever the choice; what the
    user should be told but not stopped by (e.g. an incomplete Ref2VA/ for a job without
    references) is appended to `model_warnings` when given.
    'on'/'off' are taken as given; 'auto' turns streaming on only when the request does not
    fit in memory without it and does with it (memory.py's suggestion). Returns
    (ssd_streaming, plan); raises MemoryPlanError (with the plan, and its fix in the node's
    input names) when the chosen setting does not fit, before any engine starts, unless `force`.
    """
    if choice not in SSD_MODES:
        raise RequestError(f"unknown SSD streaming choice {choice!r}", field="ssd_streaming",
                           hint=f"use one of: {', '.join(SSD_MODES)}")
    inventory = inspect_model(model_dir)      # one header read serves the check and every plan
    warnings = check_model_for(request, inventory)
    if model_warnings is not None:
        model_warnings.extend(warnings)
    if callable(machine):      # the library's facts start a worker that opens the model: after its check
        machine = machine()

    def plan(ssd: bool) -> MemoryPlan:
        return plan_memory(request.with_changes(ssd_streaming=ssd), inventory, machine=machine, session=session,
                           preview=preview)

    def fitting(chosen: MemoryPlan) -> MemoryPlan:
        if force or chosen.fits:
            return chosen
        raise memory_refusal_in_node_words(chosen)

    if choice != "auto":
        ssd = choice == "on"
        return ssd, fitting(plan(ssd))
    resident = plan(False)
    if resident.fits:
        return False, resident
    if resident.needs_ssd_streaming:
        return True, fitting(plan(True))
    return False, fitting(resident)


# Changes said together as one step on the node (h3 refuses SSD streaming with the int8 row-wise
# FC2; a render canvas is both its sides).
_SAID_TOGETHER = {("ssd_streaming", "int8_row_fc2"), ("render_width", "render_height")}


def node_word(change: Change) -> str:
    """One change as the H3 nodes' inputs take it (h3bridge.fixes: ComfyUI's renderer). Every
    name said is an input of H3 Generate (or, for previews, H3 Engine)."""
    name, value = change.field, change.value
    if isinstance(change, Given):     # a setting the request gave, named in a message: as the node's input says it
        return python_word(change)
    if name == "preview":
        return f"previews {'on' if value else 'off'} on H3 Engine"
    if name == "references" and isinstance(value, ReferenceKind):     # a reference of this kind
        return f"H3 References kind '{describe_kind(value)}'"
    if name == "force":
        return f"force to {str(bool(value)).lower()} on H3 Generate"
    if name == "engine":
        return f"mode {getattr(value, 'value', value)} on H3 Engine"
    if name == "layers":
        return f"layers {value} (under preset)"
    if name == "job_dir":        # H3 Storyboard keeps its jobs under ComfyUI's folder, by name
        return "another job_name on H3 Storyboard"
    if name == "frames":
        return f"length_unit frames with frames {value}"
    if isinstance(value, bool):
        return f"{name} {'on' if value else 'off'}"
    return f"{name} {getattr(value, 'value', value)}"


def node_words(group: Sequence[Change]) -> str:
    """A group of changes as the steps to take on the nodes: `ssd_streaming on and int8_row_fc2
    off, layers 40 (under preset)`. `seconds` left out goes with `frames` (the length unit)."""
    steps: list[str] = []
    previous: str | None = None
    for change in group:
        if change.field == "seconds" and change.value is None and not isinstance(change, Given):
            continue
        if previous is not None and (previous, change.field) in _SAID_TOGETHER and steps:
            steps[-1] += " and " + node_word(change)
        else:
            steps.append(node_word(change))
        previous = change.field
    return ", ".join(steps)


def memory_refusal_in_node_words(plan: MemoryPlan) -> MemoryPlanError:
    """The refusal of a plan that does not fit, said with the H3 nodes' inputs: the setting that
    fits, as the inputs to change, and the node's `force`."""
    suggestion = plan.suggestion
    message = plan.verdict(None)
    if suggestion is None:
        return MemoryPlanError(message, plan=plan,
                               hint="this machine has too little memory for MiniMax-H3 even at the smallest "
                                    "settings; or set " + node_words(changes(force=True)) + " to try anyway")
    return MemoryPlanError(message, plan=plan, hint="set " + node_words(suggestion.settings) + "; or set "
                           + node_words(changes(force=True)) + " to try anyway")


# ----------------------------------------------------------------------------- graph facts

def output_is_connected(prompt: Mapping[str, Any] | None, node_id: str | None, output_index: int) -> bool:
    """Whether any node input in the API-format `prompt` links to output `output_index`
    of node `node_id` (a link is the list ``[source_node_id, output_index]``).

    When the graph is unknown (no prompt or id) this answers True: building an
    unneeded output wastes memory, skipping a needed one breaks the graph.
    """
    if not prompt or node_id is None:
        return True
    wanted = str(node_id)
    for node in prompt.values():
        inputs = node.get("inputs", {}) if isinstance(node, Mapping) else {}
        for value in inputs.values():
            if (isinstance(value, (list, tuple)) and len(value) == 2 and str(value[0]) == wanted
                    and isinstance(value[1], int) and value[1] == output_index):
                return True
    return False


# ----------------------------------------------------------------------------- conversions

def frames_to_image_batch(frames: np.ndarray) -> np.ndarray:
    """uint8 [F, H, W, 3] -> ComfyUI IMAGE float32 [F, H, W, 3] in 0..1, one allocation."""
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"expected uint8 frames [F, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    batch = frames.astype(np.float32)
    batch *= np.float32(1.0 / 255.0)
    return batch


def placeholder_image(width: int, height: int) -> np.ndarray:
    """The IMAGE returned when the IMAGE output is not connected: ONE black frame
    [1, H, W, 3] (the full clip is never built; 1344x768x362 would be 4.5 GB)."""
    return np.zeros((1, height, width, 3), dtype=np.float32)


def audio_to_waveform(audio: np.ndarray | None, sample_count: int = 0) -> np.ndarray:
    """Engine audio float32 [channels, T] -> ComfyUI AUDIO waveform [1, 2, T] float32.

    Mono is duplicated to both channels; no audio gives `sample_count` samples of silence.
    """
    if audio is None:
        return np.zeros((1, 2, sample_count), dtype=np.float32)
    data = np.asarray(audio, dtype=np.float32)
    if data.ndim != 2 or data.shape[0] not in (1, 2):
        raise ValueError(f"expected audio [channels, samples], got {list(data.shape)}")
    if data.shape[0] == 1:
        data = np.repeat(data, 2, axis=0)
    return np.ascontiguousarray(data[np.newaxis])


def waveform_to_clip(waveform: np.ndarray, sample_rate: int) -> AudioClip:
    """ComfyUI AUDIO waveform [B, C, T] (first item used) -> AudioClip, every channel kept (h3's
    FFmpeg downmixes surround to stereo itself)."""
    data = np.asarray(waveform, dtype=np.float32)
    if data.ndim == 3:
        data = data[0]
    return AudioClip(np.ascontiguousarray(data), int(sample_rate))


# ----------------------------------------------------------------------------- progress

class ProgressForwarder:
    """ProgressEvent -> a host progress bar taking (value, total), never moving backwards.

    The events' `fraction` is already phase-weighted over the whole job (progress.py),
    so the bar shows overall progress, not the current phase's.
    """

    def __init__(self, update: Callable[[int, int], None], total: int = PROGRESS_STEPS, *,
                 on_eta: Callable[[str], None] | None = None,
                 on_paused: Callable[[bool], None] | None = None) -> None:
        self._update = update
        self._on_paused = on_paused       # told True at the engine's paused report, False when it reports again
        self._total = total
        self._value = -1
        self.last_phase = ""
        # The time left from past runs (ProgressEvent.eta, history/eta.py), as text, each change once.
        self._on_eta = on_eta
        self._eta_text: str | None = None

    def __call__(self, event: ProgressEvent) -> None:
        if self._on_paused is not None and (event.phase == PAUSED_PHASE) != (self.last_phase == PAUSED_PHASE):
            self._on_paused(event.phase == PAUSED_PHASE)
        self.last_phase = event.phase
        value = min(self._total, max(0, int(event.fraction * self._total)))
        if value > self._value:
            self._value = value
            self._update(value, self._total)
        if self._on_eta is not None and event.eta is not None:
            text = format_eta(event.eta)
            if text != self._eta_text:
                self._eta_text = text
                self._on_eta(text)

    @property
    def value(self) -> int:
        """Where the bar is (0 before the first event): a preview is shown at the current value."""
        return max(self._value, 0)

    def finish(self) -> None:
        if self._value < self._total:
            self._value = self._total
            self._update(self._total, self._total)


class NodeText:
    """The text shown under a node while it runs: the job's notice (`run_generate`'s
    `on_notice`), then the ETA from past runs of the shape on this machine once there is one."""

    def __init__(self, show: Callable[[str], None]) -> None:
        self._show = show
        self._notice = ""
        self._eta = ""
        self._paused = False

    def paused(self, paused: bool) -> None:
        """While paused the node says so (and that the memory stays in use) before anything else."""
        self._paused = paused
        self._refresh()

    def notice(self, text: str) -> None:
        self._notice = text
        self._refresh()

    def eta(self, text: str) -> None:
        self._eta = text
        self._refresh()

    def _refresh(self) -> None:
        eta = f"{self._eta} (from past runs of this shape on this machine)" if self._eta else ""
        self._show("\n".join(part for part in (PAUSED_TEXT if self._paused else "", self._notice, eta) if part))


def node_progress(handle: EngineHandle, update: Callable[[int, int], None],
                  show_text: Callable[[str], None]) -> tuple[ProgressForwarder, NodeText]:
    """H3 Generate's progress bar and node text for a job on `handle`. A remote job shows no ETA:
    the estimates come from past runs on this machine (history/eta.py), not on the server."""
    text = NodeText(show_text)
    return ProgressForwarder(update, on_eta=None if handle.mode == REMOTE else text.eta, on_paused=text.paused), text


# ----------------------------------------------------------------------------- running

@dataclass
class GenerateInputs:
    """Media handed to a Generate node, already as plain values."""

    first_frame: np.ndarray | None = None      # image [H, W, C] or batch [B, H, W, C]
    last_frame: np.ndarray | None = None
    references: ReferenceList | None = None


@dataclass
class GenerateOutputs:
    video_path: Path
    image: np.ndarray                # float32 [F, H, W, 3], or placeholder [1, H, W, 3]
    image_is_placeholder: bool
    waveform: np.ndarray             # float32 [1, 2, T]
    sample_rate: int
    summary: str
    result: GenerationResult = field(repr=False)
    # With takes: the contact sheet ([1, H, W, 3]) and every take's row of it ([takes, h, W, 3]), float32 0..1
    sheet: np.ndarray | None = None
    takes_image: np.ndarray | None = None


def new_output_path(directory: Path, prefix: str = "h3") -> Path:
    """A fresh, unused MP4 path in `directory` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return directory / f"{prefix}-{stamp}-{uuid.uuid4().hex[:8]}.mp4"


def summarise(result: GenerationResult, handle: EngineHandle, plan: MemoryPlan | None = None,
              image_is_placeholder: bool = False, notes: Sequence[str] = ()) -> str:
    """The STRING output: what was asked, what ran, how long each phase took, the plan."""
    request = result.request
    lines = [
        f"engine: {handle.describe()}",
        f"video: {result.video_path}",
        f"size: {result.width}x{result.height}, {result.frame_count} frames at {result.fps} fps "
        f"({result.frame_count / result.fps:.3f} s), audio {result.sample_rate} Hz stereo",
        f"seed: {result.seed}, steps: {request.steps}, layers: {request.layers}, reuse: {request.reuse}, "
        f"core reuse: {request.core_reuse}, token reduction: {'on' if request.token_reduction else 'off'}, "
        f"SSD streaming: {'on' if request.ssd_streaming else 'off'}",
    ]
    if request.first_frame or request.last_frame:
        lines.append(f"anchors: first={'yes' if request.first_frame else 'no'}, "
                     f"last={'yes' if request.last_frame else 'no'}")
    if request.references:
        lines.append("references: " + ", ".join(describe_kind(r.kind) for r in request.references))
    lines.extend(notes)
    if image_is_placeholder:
        lines.append("IMAGE output not connected: frames were not decoded (1-frame placeholder)")
    if result.timings:
        total = result.timings.get("total")
        parts = [f"{name} {seconds:.2f}s" for name, seconds in result.timings.items() if name != "total"]
        if total is not None:        # a remote job reports only its total
            parts.append(f"total {total:.2f}s")
        lines.append("timings: " + ", ".join(parts))
    if plan is not None:
        lines.append("memory plan:")
        lines.extend("  " + line for line in plan_text(plan).splitlines())
    lines.append("prompt: " + request.prompt)
    return "\n".join(lines)


def describe_job(request: GenerationRequest, mode: str) -> str:
    """One line of what a job will use, resolved (preset values, snapped length, SSD choice):
    shown on the H3 Generate node while it runs."""
    frames = request.frame_count
    core = f", core reuse {request.core_reuse}" if request.core_reuse > 1 else ""
    return (f"{mode}: {request.width}x{request.height}, {frames} frames ({frames / FPS:.3f} s), "
            f"{request.steps} steps, {request.layers} layers, reuse {request.reuse}{core}, "
            f"SSD streaming {'on' if request.ssd_streaming else 'off'}, seed {request.seed}")


def cannot_go_warm_notice(request: GenerationRequest, unsupported: UnsupportedRequestError) -> str:
    """The node's warning when a warm-session job runs one-shot, with the fix in node words."""
    text = f"WARNING: not run in session mode: {unsupported.message}; ran one-shot instead"
    if "\n" in request.prompt or "\r" in request.prompt:
        text += ". fix: put the prompt on one line (H3 Prompt's output is one line)"
    return text


# Scratch folders of jobs running in this process: removed when the host is terminated.
_live_scratch: set[Path] = set()
_live_scratch_guard = threading.Lock()


def remove_live_scratch() -> None:
    """Remove the scratch input folders of every job running in this process (best effort)."""
    import shutil
    with _live_scratch_guard:
        folders = list(_live_scratch)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def install_termination_cleanup(signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> list[int]:
    """Make SIGTERM/SIGHUP (a server stopped with `kill`, by systemd or a closed terminal) first stop
    the running engines' process groups and remove the scratch inputs of running jobs, then do what the signal did before: the previous handler is
    called, or with the default disposition the process still dies of the signal. A signal the host
    ignores (nohup) stays ignored. Main thread only (Python's rule); returns the signals taken."""
    taken = []
    for number in signals:
        previous = signal.getsignal(number)
        if previous in (signal.SIG_IGN, None) or getattr(previous, "h3bridge_cleanup", False):
            continue

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            # The engines run in their own process groups: without this a SIGTERM'd server leaves
            # a rendering h3 (tens of GiB) running until the next job's engine lock stops it.
            stop_live_engines()
            remove_live_scratch()
            if callable(previous):
                previous(signum, frame)
                return
            signal.signal(signum, signal.SIG_DFL)      # die of it, as without this handler
            os.kill(os.getpid(), signum)

        handler.h3bridge_cleanup = True  # type: ignore[attr-defined]
        signal.signal(number, handler)
        taken.append(number)
    return taken


def _scratch_names(scratch: Path, first: Path | None, last: Path | None, references: Sequence[Reference],
                   items: ReferenceList | None) -> dict[str, str]:
    """Scratch path -> what the user gave, as node messages should name it."""
    names: dict[str, str] = {}
    if first is not None:
        names[str(first)] = "the first_frame image"
    if last is not None:
        names[str(last)] = "the last_frame image"
    for index, (reference, item) in enumerate(zip(references, items or ()), 1):
        if item.video is not None:
            names[str(reference.path)] = repr(item.video.description)
        elif item.kind is ReferenceKind.IMAGE:
            names[str(reference.path)] = f"the image of reference {index}"
        else:
            names[str(reference.path)] = f"the audio of reference {index}"
        if reference.audio_path is not None:
            names[str(reference.audio_path)] = f"the audio of reference {index}"
    return names


def node_reference_names(request: GenerationRequest) -> list[str]:
    """Each reference as the H3 nodes' user knows it: its number and H3 References' `kind` option
    (the library's `video` is the node's 'video with its audio', its `silent_video` the node's 'video')."""
    return [f"reference {index} ({describe_kind(reference.kind)})"
            for index, reference in enumerate(request.references, 1)]


def in_node_words(error: H3BridgeError, scratch_names: Mapping[str, str]) -> H3BridgeError:
    """A library message as the H3 nodes' user needs it: its settings said by `node_words`
    (reference kinds by H3 References' `kind` options), and the scratch copies (`ref-01.mp4`)
    named as the user's file or input."""
    def named(text: str | None) -> str | None:
        if not text:
            return text
        for path, name in scratch_names.items():
            text = text.replace(repr(path), name).replace(path, name)
        return text

    message, hint = named(error.message_in(node_words)), named(error.hint_in(node_words))
    if (message, hint) != (error.message, error.hint):
        error.message, error.hint = message or "", hint
        error.args = (message,)
    return error


def run_generate(handle: EngineHandle, settings: GenerateSettings, inputs: GenerateInputs, *,
                 scratch_parent: Path, output_dir: Path, want_image: bool,
                 on_progress: Callable[[ProgressEvent], None] | None = None,
                 on_notice: Callable[[str], None] | None = None,
                 cancel: CancelToken | None = None,
                 on_preview: Callable[[PreviewFrame], None] | None = None,
                 engine_factory: Callable[[EngineHandle], Engine] = open_engine,
                 takes: int = 1, pick: int = 1, takes_cache: "TakesCache | None" = None,
                 pause: PauseControl | None = None) -> GenerateOutputs:
    """Write the inputs to files, build and check the request, run the engine, convert.

    takes > 1: the request's takes (seeds from its seed upward, comfy/takes.py), rendered once and
    kept in `takes_cache` by the request's key; the outputs carry take `pick`, the contact sheet
    and every take's row of it. The same request with another pick renders nothing.

    Input files live in a private directory under `scratch_parent`, removed when this
    returns (success or not) or the host is terminated (`install_termination_cleanup`). The
    MP4 is written to a fresh name in `output_dir`. `on_notice` gets the text the node shows:
    what the job will use, and a warning when a warm-session job has to run one-shot.
    """
    notify = on_notice or (lambda text: None)
    from .takes import NODE_TAKES, check_take_inputs
    takes, pick = check_take_inputs(takes, pick)
    cache = takes_cache if takes_cache is not None else NODE_TAKES
    rendered = None
    with RunDirectory(scratch_parent) as scratch:
        with _live_scratch_guard:
            _live_scratch.add(scratch)
        try:
            first = last = None
            references: tuple[Reference, ...] = ()
            try:
                if inputs.first_frame is not None:
                    first = write_png(inputs.first_frame, scratch / "first-frame.png")
                if inputs.last_frame is not None:
                    last = write_png(inputs.last_frame, scratch / "last-frame.png")
                if inputs.references:
                    references = materialise_references(inputs.references, scratch)
                request = build_request(settings, first_frame=first, last_frame=last, references=references)
                model_warnings: list[str | Fix] = []
                if handle.mode == REMOTE:     # the server checks its model and plans for its own memory
                    ssd, plan = settings.ssd_streaming == "on", None
                else:
                    library = handle.mode == LIBRARY     # warm too; planned with the library's h3_device facts
                    ssd, plan = decide_ssd_streaming(settings.ssd_streaming, request, handle.model_dir,
                                                     session=handle.mode in (SESSION, LIBRARY),
                                                     model_warnings=model_warnings, preview=handle.previews,
                                                     force=settings.force,
                                                     machine=engine_factory(handle).machine_facts if library else None)
                request = request.with_changes(ssd_streaming=ssd)
                request.validate(reference_names=node_reference_names(request))
            except H3BridgeError as error:
                raise in_node_words(error, _scratch_names(scratch, first, last, references,
                                                          inputs.references)) from None
            output = new_output_path(output_dir)
            options = dict(overwrite=False, want_frames=want_image, want_audio=True, on_progress=on_progress,
                           cancel=cancel)
            if pause is not None:       # the frontend's Pause button (comfy/pause.py)
                options["pause"] = pause
            # library mode (the preview VAE's memory is planned), and remote mode: the previews a
            # server streams (an `h3bridge serve` whose engine makes them; others send none)
            if (handle.previews or handle.mode == REMOTE) and on_preview is not None:
                options["on_preview"] = on_preview
            shown = [said(warning, node_words) for warning in model_warnings]
            ran_on, notes = handle, [f"model warning: {warning}" for warning in shown]
            # Shown on the node like the cannot-go-warm warning: the job runs, but the user must know.
            notify("".join(f"WARNING: {warning}\n" for warning in shown) + describe_job(request, handle.mode))

            def fell_back(unsupported: UnsupportedRequestError) -> None:
                # Before anything starts (e.g. a multi-line prompt: h3's interactive mode reads one
                # line per prompt). The clip must be the prompt as written, so it runs one-shot, said
                # on the node: the user chose the session.
                nonlocal ran_on
                notes.append(f"{SESSION}: {unsupported.message}; ran one-shot instead")
                ran_on = one_shot_handle(handle)
                notify(cannot_go_warm_notice(request, unsupported) + "\n" + describe_job(request, ONE_SHOT))

            if takes == 1:
                engine = engine_for_node(handle, engine_factory, on_fallback=fell_back)
                result = engine.generate(request, output, **options)
            else:
                rendered = _node_takes(handle, request, takes, output, options, cache, notify,
                                       lambda: engine_for_node(handle, engine_factory, on_fallback=fell_back))
                result = _picked_take(rendered, request, pick, want_image)
                notes.append(f"takes: {takes} (seeds {', '.join(map(str, rendered.seeds))}), pick {pick}; "
                             f"contact sheet {rendered.sheet_path}")
        finally:
            with _live_scratch_guard:
                _live_scratch.discard(scratch)
    if want_image and result.frames is not None:
        image, placeholder = frames_to_image_batch(result.frames), False
        result.frames = None     # the uint8 copy is not needed any more; don't keep the clip twice
    else:
        image, placeholder = placeholder_image(result.width, result.height), True
    samples = int(round(result.frame_count / result.fps * result.sample_rate))
    waveform = audio_to_waveform(result.audio, samples)
    video_path = result.video_path if result.video_path is not None else output
    sheet = takes_image = None
    if rendered is not None:
        from .takes import sheet_rows
        sheet = rendered.sheet[None].astype(np.float32) / 255.0
        takes_image = sheet_rows(rendered.sheet, takes).astype(np.float32) / 255.0
    return GenerateOutputs(video_path=Path(video_path), image=image, image_is_placeholder=placeholder,
                           waveform=waveform, sample_rate=result.sample_rate or SAMPLE_RATE,
                           summary=summarise(result, ran_on, plan, placeholder, notes), result=result,
                           sheet=sheet, takes_image=takes_image)


def _node_takes(handle: EngineHandle, request: GenerationRequest, takes: int, output: Path, options: dict,
                cache: "TakesCache", notify: Callable[[str], None], engine: Callable[[], Engine]) -> "RenderedTakes":
    """The request's takes: the ones this node rendered before (another pick renders nothing), else
    rendered now on one engine (generate_takes: a warm one loads the model once)."""
    from ..takes import generate_takes
    from .takes import RenderedTakes, TakesProgress, takes_key
    key = takes_key(request, handle.describe(), takes)
    kept = cache.get(key)
    if kept is not None:
        notify(f"{takes} takes of this request are rendered already: showing the pick, nothing runs")
        return kept
    progress = TakesProgress(options.get("on_progress"), takes, on_take=notify)
    done = generate_takes(engine(), request, output, takes=takes, want_frames=False, want_audio=False,
                          on_progress=progress, on_preview=options.get("on_preview"), on_take=progress.start,
                          cancel=options.get("cancel"), pause=options.get("pause"))
    assert done.contact_sheet is not None and done.sheet is not None
    first = done.takes[0]
    rendered = RenderedTakes(tuple(Path(take.video_path) for take in done.takes), tuple(done.seeds),
                             done.contact_sheet, done.sheet, first.frame_count, first.width, first.height,
                             first.fps, first.sample_rate)
    cache.put(key, rendered)
    return rendered


def _picked_take(rendered: "RenderedTakes", request: GenerationRequest, pick: int, want_image: bool) -> GenerationResult:
    """Take `pick` as a GenerationResult read back from its MP4 (frames only when wanted)."""
    from ..media.decode import decode_audio, decode_video_frames
    video = rendered.videos[pick - 1]
    frames = decode_video_frames(video, rendered.frame_count, rendered.width, rendered.height) if want_image else None
    return GenerationResult(request=request.with_changes(seed=rendered.seeds[pick - 1]), video_path=video,
                            frames=frames, audio=decode_audio(video), width=rendered.width, height=rendered.height,
                            frame_count=rendered.frame_count, seed=rendered.seeds[pick - 1], fps=rendered.fps,
                            sample_rate=rendered.sample_rate)


def describe_plan(handle: EngineHandle, settings: GenerateSettings, *, machine: MachineFacts | None = None) -> str:
    """The H3 Memory Plan node's text: the plan for these settings, nothing run. A plan that
    does not fit is shown (with the setting that would fit), not raised."""
    request = build_request(settings)
    if handle.mode == REMOTE:
        raise RequestError(f"the memory plan of a remote engine is made by the server at {handle.remote_url}, "
                           "for its own machine, when a job is sent", field="engine",
                           hint="connect an H3 Engine in one-shot or warm-session mode to plan for this machine")
    if settings.ssd_streaming not in SSD_MODES:
        raise RequestError(f"unknown SSD streaming choice {settings.ssd_streaming!r}", field="ssd_streaming",
                           hint=f"use one of: {', '.join(SSD_MODES)}")
    inventory = inspect_model(handle.model_dir)
    # warm engines (the session, the library) keep the DiT and video decoder loaded
    session = handle.mode in (SESSION, LIBRARY)
    ssd = settings.ssd_streaming == "on"
    if settings.ssd_streaming == "auto":
        resident = plan_memory(request, inventory, machine=machine, session=session, preview=handle.previews)
        ssd = not resident.fits and resident.needs_ssd_streaming
    plan = plan_memory(request.with_changes(ssd_streaming=ssd), inventory, machine=machine, session=session,
                       preview=handle.previews)
    frames = request.frame_count
    header = (f"{request.width}x{request.height}, {frames} frames ({frames / FPS:.3f} s), preset {settings.preset}, "
              f"SSD streaming {'on' if ssd else 'off'} ({settings.ssd_streaming})")
    return header + "\n" + plan_text(plan)


__all__ = [
    "ENGINE_MODES", "EngineHandle", "NO_MODEL_INSTALLED", "check_model_choice", "engine_mode",
    "engine_setting_problems", "old_mode_notice", "problem_input", "problems_text", "LIBRARY", "default_engine_mode", "check_model_setting", "compose_prompt", "describe_job", "in_node_words",
    "install_termination_cleanup", "preset_values", "remove_live_scratch", "settings_from_node_values", "GENERATE_OUTPUTS", "GenerateInputs", "GenerateOutputs", "GenerateSettings",
    "IMAGE_OUTPUT_INDEX", "LENGTH_UNITS", "MODEL_FOLDER", "ONE_SHOT", "REMOTE", "PRESET_NAMES", "PROGRESS_STEPS",
    "ProgressForwarder", "NodeText", "node_progress", "SSD_MODES", "SESSION", "audio_to_waveform", "build_request", "check_engine_settings",
    "decide_ssd_streaming", "describe_plan", "memory_refusal_in_node_words", "node_reference_names", "node_word", "node_words", "frames_for", "frames_to_image_batch", "new_output_path",
    "open_engine", "output_is_connected", "placeholder_image", "resolve_engine_path", "resolve_model_dir",
    "run_generate", "snap_frames", "summarise", "waveform_to_clip",
]
