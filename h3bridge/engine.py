"""The one-shot engine: one `h3` process per request, supervised from Python.

    from h3bridge import GenerationRequest, OneShotEngine
    engine = OneShotEngine(model_dir="~/models/MiniMax-H3")
    result = engine.generate(GenerationRequest("A red fox runs through snow"), Path("fox.mp4"))

The engine is antirez's `h3` binary (or any program with the same command line,
such as `h3-sim`). Everything here works from h3's observable behaviour: its flags
(main.c), its stderr progress records and `h3: <message>` lines, its exit codes
(0 ok, 2 usage, 1 failure), and its `--frames-dir` PPM files.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from .cancel import CancelToken
from .engine_process import EngineProcess, signal_name
from .errors import (
    DiskError,
    EngineCrashedError,
    EngineError,
    EngineNotFoundError,
    EngineStalledError,
    GenerationCancelled,
    MediaError,
    ModelError,
    OutputExistsError,
    RequestError,
)
from .media import decode_audio, read_frames_dir, remove_quietly
from .lock import STAGING_PREFIX, STAGING_SUFFIX, WORKDIR_PREFIX, EngineLock, engine_lock, remove_leftovers
from .progress import (
    PHASE_ORDER,
    WAITING_PHASE,
    ProgressCallback,
    ProgressEvent,
    ProgressTracker,
)
from .request import FPS, MIN_LAYERS, GenerationRequest, Reference, ReferenceImageSize, ReferenceKind
from .result import GenerationResult
from .upstream_costs import JobShape

ENGINE_ENV = "H3_BIN"
MODEL_DIR_ENV = "H3_MODEL_DIR"
# Field names appear bare (`engine_path`), never as `name=value`: the CLI turns them into its flags
# (cli.in_cli_words) and ComfyUI shows its node input of the same name.
ENGINE_BUILD_HINT = (
    "build h3 on an Apple Silicon Mac: `git clone https://github.com/antirez/h3.c && cd h3.c && make`, "
    "then give the path of the h3 it builds as engine_path (CLI: --engine-path), set H3_BIN, or put h3 on "
    "PATH. To try h3bridge without a Mac, give the simulator h3-sim (installed with h3bridge) as "
    "engine_path, with a fixture model from `h3-sim-model DIR`.")
FFMPEG_HINT = ("install FFmpeg (`brew install ffmpeg` on macOS, `apt-get install ffmpeg` on Debian/Ubuntu), "
               "or point H3_FFMPEG / H3_FFPROBE at the programs (apps started from the Dock lack Homebrew's PATH)")
POLL_SECONDS = 0.05


# ----------------------------------------------------------------------------- locating things

def locate_engine(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The h3 binary: `explicit`, else env H3_BIN, else `h3` on PATH. Absolute path.

    An explicit directory (an h3.c checkout) means its `h3` inside.
    Raises EngineNotFoundError saying how to build h3 or use h3-sim.
    """
    if explicit is not None and str(explicit):
        source, raw = "the given engine path", os.fspath(explicit)
    elif os.environ.get(ENGINE_ENV):
        source, raw = f"${ENGINE_ENV}", os.environ[ENGINE_ENV]
    else:
        found = shutil.which("h3")
        if found is None:
            raise EngineNotFoundError("the h3 engine was not found (no engine path given, H3_BIN unset, "
                                      "no `h3` on PATH)", hint=ENGINE_BUILD_HINT)
        source, raw = "PATH", found
    path = Path(raw).expanduser()
    if path.is_dir() and (path / "h3").is_file():
        path = path / "h3"
    elif path.is_dir():
        unbuilt = (path / "h3.c").is_file() and (path / "Makefile").is_file()
        raise EngineNotFoundError(
            f"the h3 engine from {source} is a folder with no h3 program in it: {path.absolute()}",
            hint=f"this looks like an h3.c checkout that was never built: run `make` in it on an Apple Silicon "
                 f"Mac, then give {path.absolute() / 'h3'} (or this folder again)" if unbuilt else
                 "give the h3 program itself (the `h3` file `make` builds in an h3.c checkout) or the h3.c "
                 "checkout that holds it; to try h3bridge without a Mac, give the simulator h3-sim")
    if not path.is_file():
        # A bare name ("h3-sim") given explicitly or in H3_BIN: look it up on PATH.
        found = shutil.which(raw) if os.sep not in raw else None
        if found is None:
            raise EngineNotFoundError(f"the h3 engine from {source} does not exist: {raw}", hint=ENGINE_BUILD_HINT)
        path = Path(found)
    if not os.access(path, os.X_OK):
        raise EngineNotFoundError(f"the h3 engine from {source} is not executable: {path}",
                                  hint=f"chmod +x {path}, or rebuild it with `make`")
    return path.absolute()


def engine_working_directory(engine_path: Path) -> Path:
    """Where h3 must run: its real (symlink-resolved) directory, because h3 compiles
    `h3_shaders.metal` at run time from a relative path (h3.c passes "h3_shaders.metal" to
    every Metal loader), so a symlink to h3 in ~/bin must still run from the h3.c checkout."""
    return engine_path.resolve().parent


def locate_model_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The model directory: `explicit`, else env H3_MODEL_DIR. Must be a directory."""
    raw = os.fspath(explicit) if explicit is not None and os.fspath(explicit) else os.environ.get(MODEL_DIR_ENV)
    if not raw:
        raise ModelError("no MiniMax-H3 model directory given",
                         hint=f"pass model_dir (CLI: --model-dir) or set {MODEL_DIR_ENV}; "
                              "for tests, `h3-sim-model DIR` writes a fixture model")
    path = Path(raw).expanduser().absolute()
    if not path.is_dir():
        raise ModelError(f"the model directory {path} does not exist or is not a directory",
                         hint="download MiniMaxAI/MiniMax-H3 there, or fix the path")
    return path


@dataclass(frozen=True)
class MediaTools:
    """Absolute paths of the FFmpeg programs h3 runs (None when not found)."""

    ffmpeg: Path | None
    ffprobe: Path | None


def locate_media_tools(env: dict[str, str] | None = None) -> MediaTools:
    """FFmpeg/FFprobe as h3 would find them: `H3_FFMPEG`/`H3_FFPROBE`, else PATH (h3_ffmpeg.c
    `ffmpeg_program`/`ffprobe_program`), resolved to absolute paths."""
    env = dict(os.environ) if env is None else env

    def find(variable: str, name: str) -> Path | None:
        configured = env.get(variable)
        found = shutil.which(configured or name, path=env.get("PATH"))
        return Path(found).absolute() if found else None

    return MediaTools(ffmpeg=find("H3_FFMPEG", "ffmpeg"), ffprobe=find("H3_FFPROBE", "ffprobe"))


# ----------------------------------------------------------------------------- command line

def _abs(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


_REFERENCE_FLAGS = {
    ReferenceKind.IMAGE: "--ref-image",
    ReferenceKind.VIDEO: "--ref-video",
    ReferenceKind.SILENT_VIDEO: "--ref-silent-video",
    ReferenceKind.VIDEO_AUDIO: "--ref-video-audio",
    ReferenceKind.AUDIO: "--ref-audio",
}


def reference_arguments(references: Sequence[Reference]) -> list[str]:
    """The ordered `--ref-*` flags (main.c option table) for `references`, paths absolute."""
    args: list[str] = []
    for reference in references:
        args += [_REFERENCE_FLAGS[reference.kind], _abs(reference.path)]
        if reference.kind is ReferenceKind.VIDEO_AUDIO:
            assert reference.audio_path is not None
            args.append(_abs(reference.audio_path))
    return args


def request_arguments(request: GenerationRequest) -> list[str]:
    """The h3 flags (main.c option table) for every generation option of `request`.

    Paths are absolute. Model dir, prompt, output and frames dir are not included
    (the one-shot engine and the session set those differently).
    """
    args = ["--width", str(request.width), "--height", str(request.height),
            # h3 would align a non-legal length itself; we always pass the aligned count.
            "--frames", str(request.frame_count),
            "--steps", str(request.steps), "--seed", str(request.seed),
            "--reuse", str(request.reuse), "--layers", str(request.layers),
            "--core-reuse", str(request.core_reuse)]
    if request.render_width is not None and request.render_height is not None:
        args += ["--render-width", str(request.render_width), "--render-height", str(request.render_height)]
    if request.token_reduction:
        args.append("--token-reduction")
    if request.ssd_streaming:
        args.append("--ssd-streaming")
    if request.int8_row_fc2:
        args.append("--use-int8-row-fc2")
    if request.reference_rope:
        args.append("--use-reference-rope")
    for slower in sorted(request.slower_paths, key=lambda p: p.value):
        args.append(f"--use-slower-{slower.value}")
    if request.first_frame is not None:
        args += ["--first-frame", _abs(request.first_frame)]
    if request.last_frame is not None:
        args += ["--last-frame", _abs(request.last_frame)]
    args += reference_arguments(request.references)
    if request.reference_image_size is not ReferenceImageSize.MATCH:
        args += ["--ref-image-size", request.reference_image_size.value]
    return args


def expected_phases(request: GenerationRequest, *, writes_mp4: bool) -> dict[str, float]:
    """The upstream phases a job runs (h3.c h3_generate), in order, each with the seconds the
    upstream cost model expects it to take for this job: ProgressTracker's weights."""
    from .memory import AUDIO_LATENT_FPS, video_latent_t   # memory imports much; only needed here
    frames = request.frame_count
    shape = JobShape(render_width=request.render_width or request.width,
                     render_height=request.render_height or request.height,
                     width=request.width, height=request.height, frame_count=frames,
                     video_t=video_latent_t(frames), audio_t=int(frames * AUDIO_LATENT_FPS / FPS + 0.5),
                     steps=request.steps, dit_layers=request.layers, denoise_reuse=request.reuse,
                     ssd_streaming=request.ssd_streaming)
    seconds = shape.phase_seconds()
    phases = ["tokenizer", "text encoder", "refine text", "precompute AdaLN", "load transformer core",
              "denoise enqueue", "denoise", "audio VAE", "video VAE load"]
    visual = [r for r in request.references if r.kind is not ReferenceKind.AUDIO]
    if visual or request.first_frame is not None or request.last_frame is not None:
        phases += ["video VAE encoder", "Qwen vision"]
    if any(r.kind not in (ReferenceKind.IMAGE, ReferenceKind.SILENT_VIDEO) for r in request.references):
        phases.append("audio VAE encoder")
    if writes_mp4:
        phases.append("FFmpeg")
    # "denoise enqueue" is the GPU sampler's name for the same loop (upstream_costs)
    return {p: seconds["denoise" if p == "denoise enqueue" else p] for p in PHASE_ORDER if p in phases}


# The `h3: ` lines upstream prints that are not errors (everything else after `h3: ` is one):
# warnings and success reports (main.c), the warm-cache notices (h3.c 696-717, 987, 1435-1437,
# 1476-1530, e.g. "prepared DiT cache miss; model retained"), the --show display notices (main.c,
# h3_cli.c `cli_frame`), and the diagnostics behind H3_PROFILE, H3_DEBUG_GPU_MEMORY and
# H3_NAX_DIAGNOSTIC (h3_dit.c, h3_video_vae.c, h3_gpu.m).
_INFORMATIONAL_LINE = re.compile(
    r"h3: (?:warning: |wrote |(?:video VAE|conditioning|prepared DiT) cache (?:hit|miss)"
    r"|preview \d+/\d+$|frame \d+/\d+ via |denoise preview \d+/\d+, |graphical output uses "
    r"|(?:terminal )?display disabled: |gate-ranked DiT skips|(?:custom|selected) (?:GPU )?reuse schedule "
    r"|GPU sampler encode window |BF16 SSD stream |(?:resident )?video VAE tiles "
    r"|Metal live allocation |TensorOps compile failed: )")


def engine_error_text(line: str) -> str | None:
    """The error in one line of h3's stderr (the text after `h3: `), or None when the line is
    not an `h3: ` line or is one of upstream's informational ones (_INFORMATIONAL_LINE)."""
    if not line.startswith("h3: ") or _INFORMATIONAL_LINE.match(line):
        return None
    return line[len("h3: "):]


def engine_message_from(stderr: str) -> str | None:
    """h3's own words: its last error line (main.c and h3_cli.c print a failure as `h3: %s`),
    never a warning, a success report or a cache notice that came after it."""
    for line in reversed(stderr.replace("\r", "\n").split("\n")):
        message = engine_error_text(line)
        if message is not None:
            return message
    return None


# ----------------------------------------------------------------------------- shared by every engine
# (the one-shot engine here and the warm session in session.py)

def resolve_output(output: str | os.PathLike[str] | None, *, overwrite: bool) -> Path | None:
    """The absolute output path (None: no MP4 kept); refuses a directory or, unless
    `overwrite`, an existing file, before any engine starts."""
    text = os.fspath(output) if output is not None else ""
    output_path = Path(text).expanduser().absolute() if text else None
    if output_path is not None:
        limit = _name_limit(output_path.parent)
        length = len(output_path.name.encode("utf-8", "surrogateescape"))
        if length > limit:
            raise RequestError(f"the output file name is {length} bytes, over this file system's {limit}",
                               field="output", hint="choose a shorter file name")
        if text.endswith(os.sep) or output_path.is_dir():
            raise RequestError(f"the output {text} names a folder", field="output",
                               hint=f"give a file name ending in .mp4, e.g. {output_path / 'clip.mp4'}")
        if output_path.suffix.lower() != ".mp4":
            # h3 writes MP4 (H.264 + AAC); another suffix would misname the file.
            raise RequestError(f"the output {output_path.name} does not end in .mp4, and h3 writes an MP4",
                               field="output", hint=f"name it {output_path.with_suffix('.mp4').name}")
        # lexists: a symlink (even a dangling one) is something the user made.
        if os.path.lexists(output_path) and not overwrite:
            raise OutputExistsError(f"the output {output_path} already exists",
                                    hint="choose another name, or allow overwriting (CLI: --overwrite)")
        # The clip is staged beside the output and the parents are created (staging_path), so
        # the nearest existing folder must take new entries; find out now, not after the render.
        existing = output_path.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise RequestError(f"the output {output_path} cannot be written: {existing} is not a writable folder "
                               f"({_why_not_writable(existing)})",
                               field="output", hint="choose an output in a folder you can write to")
    return output_path


def _why_not_writable(existing: Path) -> str:
    if not existing.is_dir():
        return "it is a file"
    try:
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            return "its file system is mounted read-only"
    except OSError:
        pass
    return "you have no permission to write there"


def _name_limit(folder: Path) -> int:
    """The longest file name the output's file system takes (NAME_MAX, 255 on APFS and ext4)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def missing_folders(output_path: Path) -> list[Path]:
    """The output's folders that do not exist yet, deepest first: staging_path creates them,
    and a job that fails takes them away again, each only if it is still empty."""
    missing: list[Path] = []
    folder = output_path.parent
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def staging_path(output_path: Path) -> Path:
    """The temporary name a clip is written under before its atomic rename to `output_path`:
    in the same folder (rename is atomic only within one file system), hidden, unique, and
    ending in .mp4 (FFmpeg picks the muxer by suffix). Creates the output's parents, as h3
    does for its own output (h3_ffmpeg.c `make_parents`)."""
    try:
        output_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise MediaError(f"cannot create the output folder {output_path.parent}: {error.strerror}",
                         hint="choose an output in a folder you can write to") from None
    # Short whatever the output's name: a name near the file system's limit must still fit.
    return output_path.parent / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}{STAGING_SUFFIX}"


# ----------------------------------------------------------------------------- disks
# A full or read-only disk must be named as such. Without this, a full disk stops FFmpeg mid-clip,
# h3 then reports "cannot stream generated A/V to FFmpeg: Broken pipe" (h3_ffmpeg.c), and the
# advice would be to install FFmpeg. Both engines use what follows: a check before the render,
# and the same wording when the disk still stops one (from FFmpeg's stderr, or an OSError).

# What an H.264 clip at CRF 18 can cost: 1 bit per pixel and frame is several times what CRF 18
# ("fast" preset) gives on rendered footage (~0.1-0.3); AAC at 192 kbit/s; plus room for the MP4
# index and the `+faststart` rewrite. Generous on purpose: the check only has to catch a disk
# that cannot take the clip, never refuse one that can.
CLIP_BITS_PER_PIXEL = 1.0
AUDIO_BITS_PER_SECOND = 192_000
CLIP_SLACK_BYTES = 1 << 20
# main.c `cli_frame`: "P6\n%d %d\n255\n" then the raw RGB rows.
_PPM_HEADER_BYTES = 32


def expected_clip_bytes(request: GenerationRequest) -> int:
    """A generous upper estimate of the MP4 h3 writes for `request` (see CLIP_BITS_PER_PIXEL)."""
    video = request.width * request.height * request.frame_count * CLIP_BITS_PER_PIXEL / 8
    audio = request.frame_count / FPS * AUDIO_BITS_PER_SECOND / 8
    return int(video + audio) + CLIP_SLACK_BYTES


def expected_frames_bytes(request: GenerationRequest) -> int:
    """What `--frames-dir` takes: one binary PPM per final frame (main.c `cli_frame`)."""
    return request.frame_count * (request.width * request.height * 3 + _PPM_HEADER_BYTES)


@dataclass(frozen=True)
class DiskNeed:
    """Bytes a job will write into `folder` (an existing folder, or the nearest existing parent
    of one it will create). `what` names the folder for the user ("the output folder")."""

    folder: Path
    what: str
    needed: int


def existing_folder(path: Path) -> Path:
    """`path` or its nearest existing parent: where a folder about to be created would live."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


# strerror() of the errors that mean the disk, not the program, stopped a write (Linux and macOS;
# macOS spells EDQUOT "Disc quota exceeded"), as FFmpeg prints them after the file name.
_DISK_STATES = {
    "No space left on device": "is full",
    "Disk quota exceeded": "is over your disk quota",
    "Disc quota exceeded": "is over your disk quota",
    "Read-only file system": "is on a read-only file system",
}
_DISK_ERRNOS = {errno.ENOSPC: "is full", errno.EDQUOT: "is over your disk quota",
                errno.EROFS: "is on a read-only file system"}
# main.c `cli_frame`: h3 could not write a --frames-dir file (it prints no errno).
_FRAME_WRITE_FAILURE = re.compile(r"^h3: (?:cannot write frame \d+ to|incomplete frame \d+ in) (?P<dir>.+)$")


def disk_error(need: DiskNeed, state: str, *, before_start: bool, free: int | None = None,
               detail: str = "", engine_message: str | None = None, stderr: str = "",
               parts: Sequence[DiskNeed] = ()) -> DiskError:
    """The one way both engines say that a disk stopped (or would stop) a job: which folder,
    what is wrong with it (`state`, e.g. "is full"), and what to do. `parts`: the needs on one
    disk that `need` adds up (the MP4 and the frames)."""
    from .model import format_bytes
    where = f"{need.what} {need.folder}"
    if free is not None and len(parts) > 1:
        message = (f"the disk of {where} has {format_bytes(free)} free, and this job needs about "
                   f"{format_bytes(need.needed)} on it: " + ", ".join(
                       f"{format_bytes(part.needed)} in {part.what} {part.folder}" for part in parts))
    elif free is not None:
        message = (f"{where} has {format_bytes(free)} free, and this job needs about "
                   f"{format_bytes(need.needed)} there{detail}")
    else:
        message = f"{where} {state}{detail}"
    if state == "is on a read-only file system":
        hint = "write the clip to a folder on a writable disk"
    elif state in ("is full", "is over your disk quota") or free is not None:
        hint = f"free at least {format_bytes(need.needed)} on that disk, or write the clip to another disk"
    else:
        hint = "write the clip to a folder on a local, writable disk"
    if any(part.what.startswith("h3bridge's temporary folder") for part in (need, *parts)):
        hint += " (TMPDIR moves h3bridge's temporary folder)"
    return DiskError(message, folder=need.folder, free=free, needed=need.needed, before_start=before_start,
                     hint=hint, engine_message=engine_message, stderr=stderr)


def check_disk_space(needs: Sequence[DiskNeed]) -> None:
    """Before the render: every folder in `needs` must take a file (a tiny probe, created and
    removed at once: permissions, read-only mounts, file systems that refuse writes) and its disk
    must have room for what the job writes there (needs on one disk add up).
    Raises DiskError(before_start=True)."""
    by_disk: dict[int, list[DiskNeed]] = {}
    for need in needs:
        _probe_writable(need)
        by_disk.setdefault(os.stat(need.folder).st_dev, []).append(need)
    for group in by_disk.values():
        total = sum(need.needed for need in group)
        free = shutil.disk_usage(group[0].folder).free
        if free < total:
            raise disk_error(DiskNeed(group[0].folder, group[0].what, total), "is full", before_start=True,
                             free=free, parts=group)


def _probe_writable(need: DiskNeed) -> None:
    """Create one small file in `need.folder` with O_EXCL, write to it, remove it."""
    state = None
    if not os.access(need.folder, os.W_OK | os.X_OK):
        state = _why_not_writable(need.folder)
        state = "is on a read-only file system" if "read-only" in state else f"cannot be written ({state})"
    else:
        try:
            descriptor, name = tempfile.mkstemp(prefix=".h3bridge-probe-", dir=need.folder)
            try:
                os.write(descriptor, b"h3bridge")
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
                remove_quietly(Path(name))
        except OSError as error:
            state = _DISK_ERRNOS.get(error.errno or 0) or (
                f"does not take new files (creating a test file there failed: {error.strerror or error}), "
                "so it is not on a writable file system")
    if state is not None:
        raise disk_error(need, state, before_start=True)


def disk_problem(stderr: str, needs: Sequence[DiskNeed]) -> tuple[DiskNeed, str] | None:
    """The disk problem h3's or FFmpeg's stderr reports (FFmpeg: "Error writing trailer of PATH:
    No space left on device"), as (the need whose folder it concerns, its state), else None."""
    for line in stderr.replace("\r", "\n").split("\n"):
        state = next((state for words, state in _DISK_STATES.items() if words in line), None)
        frames = _FRAME_WRITE_FAILURE.match(line)
        if state is None and frames is None:
            continue
        if frames is not None:
            state = "could not take the frames (is its disk full?)"
        concerned = [need for need in needs if str(need.folder) in line] or list(needs)
        if concerned:
            return max(concerned, key=lambda need: len(str(need.folder))), state
    return None


def raise_for_disk_problem(stderr: str, needs: Sequence[DiskNeed], *, engine_message: str | None) -> None:
    """After a job: the DiskError for a disk problem its stderr reports (see disk_problem)."""
    found = disk_problem(stderr, needs)
    if found is not None:
        need, state = found
        raise disk_error(need, state, before_start=False, engine_message=engine_message, stderr=stderr,
                         detail=": the clip could not be written")


def disk_error_from_os_error(error: OSError, need: DiskNeed) -> DiskError | None:
    """The DiskError for an OSError that a full or read-only disk caused, else None."""
    state = _DISK_ERRNOS.get(error.errno or 0)
    if state is None:
        return None
    return disk_error(need, state, before_start=False, detail=": the finished clip could not be moved there")


def one_shot_disk_needs(request: GenerationRequest, output_path: Path | None, *, writes_mp4: bool,
                        want_frames: bool) -> list[DiskNeed]:
    """Where a one-shot job writes: its MP4 beside the output (or in h3bridge's temporary folder
    when only the audio is wanted), and the frames in h3bridge's temporary folder."""
    temporary = Path(tempfile.gettempdir())
    needs = []
    if output_path is not None:
        needs.append(DiskNeed(existing_folder(output_path.parent), "the output folder", expected_clip_bytes(request)))
    elif writes_mp4:
        needs.append(DiskNeed(temporary, "h3bridge's temporary folder", expected_clip_bytes(request)))
    if want_frames:
        needs.append(DiskNeed(temporary, "h3bridge's temporary folder (frames)", expected_frames_bytes(request)))
    return needs


# ----------------------------------------------------------------------------- the command line's size

def _argument_limits() -> tuple[int | None, int]:
    """(longest single argument, argv + environment together) exec accepts here, in bytes with
    each string's NUL. Linux caps one argument at MAX_ARG_STRLEN = 32 pages (131072 bytes,
    include/uapi/linux/binfmts.h); macOS has no such cap. Both cap the total at ARG_MAX."""
    try:
        total = os.sysconf("SC_ARG_MAX")
    except (OSError, ValueError):
        total = 1 << 20     # macOS's ARG_MAX, the smaller of the two
    single = 32 * os.sysconf("SC_PAGE_SIZE") if sys.platform.startswith("linux") else None
    return single, total


def _argument_limit_error(argv: Sequence[str], env: Mapping[str, str], prompt: str) -> RequestError:
    """The RequestError for a command line exec refuses (E2BIG), in the prompt's terms."""
    single, total_limit = _argument_limits()
    prompt_bytes = len(os.fsencode(prompt))
    alternative = ("shorten the prompt, or render it in the warm session (SessionEngine, CLI: --session): "
                   "it sends the prompt to h3 over stdin, where its length does not count")
    if single is not None and prompt_bytes + 1 > single:
        return RequestError(f"the prompt is {prompt_bytes} bytes; h3 takes it as one command-line argument, and "
                            f"this system allows at most {single - 1} bytes in one (MAX_ARG_STRLEN)",
                            field="prompt", hint=alternative)
    used = _command_line_bytes(argv, env)
    return RequestError(f"the engine's command line and environment come to {used} bytes ({prompt_bytes} of "
                        f"them the prompt), over this system's limit of {total_limit} (ARG_MAX)",
                        field="prompt", hint=alternative + "; or unset large environment variables")


def _command_line_bytes(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """What exec copies: every argument and `NAME=value` with its NUL, and a pointer to each."""
    strings = [os.fsencode(arg) for arg in argv] + [os.fsencode(f"{k}={v}") for k, v in env.items()]
    return sum(len(item) + 1 for item in strings) + 8 * (len(strings) + 2)


def check_argument_limits(argv: Sequence[str], env: Mapping[str, str], prompt: str) -> None:
    """Refuse, before anything starts, a command line exec would refuse with E2BIG (a prompt
    longer than the system's argument limit). 4 KiB are kept for exec's own bookkeeping."""
    single, total_limit = _argument_limits()
    too_long = single is not None and any(len(os.fsencode(arg)) + 1 > single for arg in argv)
    if too_long or _command_line_bytes(argv, env) > total_limit - 4096:
        raise _argument_limit_error(argv, env, prompt)


def check_media_tools(request: GenerationRequest, *, writes_mp4: bool) -> MediaTools:
    """FFmpeg/FFprobe must exist when h3 will need them; EngineNotFoundError otherwise."""
    needs_ffmpeg = writes_mp4 or request.first_frame is not None or request.last_frame is not None \
        or bool(request.references)
    tools = locate_media_tools()
    if needs_ffmpeg and tools.ffmpeg is None:
        raise EngineNotFoundError("FFmpeg was not found; h3 needs it to write the MP4 and read media inputs",
                                  hint=FFMPEG_HINT)
    if request.references and tools.ffprobe is None:
        raise EngineNotFoundError("FFprobe was not found; h3 needs it to size reference images and videos",
                                  hint=FFMPEG_HINT)
    return tools


def engine_environment(tools: MediaTools) -> dict[str, str]:
    """Our environment, with FFmpeg/FFprobe pinned to the absolute paths we found."""
    env = dict(os.environ)
    if tools.ffmpeg is not None:
        env["H3_FFMPEG"] = str(tools.ffmpeg)
    if tools.ffprobe is not None:
        env["H3_FFPROBE"] = str(tools.ffprobe)
    return env


def engine_variables(env: Mapping[str, str]) -> dict[str, str]:
    """The upstream `H3_*` variables in an engine's environment. h3 reads dozens of them (tuning
    switches such as H3_TOKEN_REDUCTION, h3_dit.c:380, and H3_FFMPEG/H3_FFPROBE): they can change
    the clip, so a result lists them and a warm session restarts when they change."""
    return {name: value for name, value in sorted(env.items()) if name.startswith("H3_")}


def waiting_reporter(on_progress: ProgressCallback | None) -> Callable[[float], None] | None:
    """An `on_wait` for lock.engine_lock that reports WAITING_PHASE through `on_progress`."""
    if on_progress is None:
        return None

    def report(waited: float) -> None:
        on_progress(ProgressEvent(phase=WAITING_PHASE, done=0, total=0, fraction=0.0, elapsed=waited))
    return report


def raise_if_cancelled(cancel: CancelToken | None) -> None:
    """After the engine is gone, reading frames and audio can still take seconds on a long
    clip: a cancel that arrives then is honoured too, before anything is published."""
    if cancel is not None and cancel.cancelled:
        raise GenerationCancelled("generation cancelled; the engine had finished, its clip was discarded")


def finish_result(request: GenerationRequest, mp4: Path | None, output_path: Path | None, *,
                  overwrite: bool, frames: np.ndarray | None, want_audio: bool, timings: dict[str, float],
                  command: list[str], engine_log: str, engine_variables: dict[str, str],
                  seed: int | None = None) -> GenerationResult:
    """Decode the audio (if wanted) from the finished MP4 `mp4`, publish it to `output_path`
    (atomic rename from a temp name in the same directory), and build the GenerationResult."""
    audio = None
    if mp4 is not None:
        if not mp4.is_file():
            raise EngineError("h3 reported success but wrote no MP4", engine_message=None,
                              exit_code=0, stderr=engine_log, command=command)
        if want_audio:
            audio = decode_audio(mp4)
    if output_path is not None:
        assert mp4 is not None
        _publish(mp4, output_path, overwrite=overwrite)
    return GenerationResult(request=request, video_path=output_path, frames=frames, audio=audio,
                            width=request.width, height=request.height, frame_count=request.frame_count,
                            seed=request.seed if seed is None else seed, timings=timings, command=command,
                            engine_log=engine_log, engine_variables=engine_variables)


# ----------------------------------------------------------------------------- the engine

class OneShotEngine:
    """Runs one `h3` process per request.

    engine_path: the h3 binary (default: env H3_BIN, then `h3` on PATH), see locate_engine.
    model_dir: the MiniMax-H3 directory (default: env H3_MODEL_DIR).
    stall_timeout: kill the engine if it reports no progress for this many seconds
      (None disables the watchdog). The tiled video VAE decode reports nothing at
      upstream 8974cc0, so keep this generous on large clips.
    """

    def __init__(self, engine_path: str | os.PathLike[str] | None = None,
                 model_dir: str | os.PathLike[str] | None = None, *,
                 stall_timeout: float | None = 600.0) -> None:
        self.engine_path = locate_engine(engine_path)
        self.model_dir = locate_model_dir(model_dir)
        self.stall_timeout = stall_timeout

    def command(self, request: GenerationRequest, output_arg: str, frames_dir: str | None) -> list[str]:
        """The exact argv for one job (`output_arg` '' means no MP4, as in h3)."""
        argv = [str(self.engine_path), "-d", str(self.model_dir), "-p", request.prompt, "-o", output_arg]
        argv += request_arguments(request)
        if frames_dir is not None:
            argv += ["--frames-dir", frames_dir]
        return argv

    def environment(self, tools: MediaTools) -> dict[str, str]:
        return engine_environment(tools)

    def generate(self, request: GenerationRequest, output: str | os.PathLike[str] | None = None, *,
                 overwrite: bool = False, want_frames: bool = True, want_audio: bool = True,
                 on_progress: ProgressCallback | None = None,
                 cancel: CancelToken | None = None) -> GenerationResult:
        """Render one clip and return its frames, audio and MP4.

        output: where the MP4 goes (None: no MP4 is kept). It is written under a temporary
          name in the same directory and renamed into place only on success; an existing
          file is never replaced unless `overwrite` (OutputExistsError before the engine starts).
        want_frames: read the frames into `result.frames` (uint8 [F, H, W, 3]).
        want_audio: decode the soundtrack into `result.audio` (float32 [channels, samples], 32 kHz).
        on_progress: called with ProgressEvents from the calling thread.
        cancel: a CancelToken; cancelling (from any thread) stops the engine within a second
          and raises GenerationCancelled. No output or temporary file is left behind.

        Raises RequestError (bad request), OutputExistsError, EngineNotFoundError (FFmpeg
        missing), EngineError / EngineCrashedError / EngineStalledError (h3 failed; h3's own
        message is in `engine_message`), GenerationCancelled.
        """
        request.validate()
        output_path = resolve_output(output, overwrite=overwrite)
        writes_mp4 = output_path is not None or want_audio
        check_media_tools(request, writes_mp4=writes_mp4)
        disk_needs = one_shot_disk_needs(request, output_path, writes_mp4=writes_mp4, want_frames=want_frames)
        check_disk_space(disk_needs)

        workdir = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
        mp4_temp: Path | None = None
        made_folders = missing_folders(output_path) if output_path is not None else []
        published = False
        try:
            if output_path is not None:
                mp4_temp = staging_path(output_path)
            elif want_audio:
                mp4_temp = workdir / "audio.mp4"
            frames_dir = workdir / "frames" if want_frames else None
            argv = self.command(request, "" if mp4_temp is None else str(mp4_temp),
                                None if frames_dir is None else str(frames_dir))
            # One engine per machine (lock.py): wait, cancellably, while another holds the model.
            env = self.environment(locate_media_tools())
            check_argument_limits(argv, env, request.prompt)
            with engine_lock(cancel=cancel, on_wait=waiting_reporter(on_progress)) as lock:
                stderr, timings = self._run(argv, request, env, writes_mp4=mp4_temp is not None,
                                            on_progress=on_progress, cancel=cancel, lock=lock,
                                            disk_needs=disk_needs,
                                            leftovers=[path for path in (mp4_temp, workdir) if path is not None])
            frames = None
            if frames_dir is not None:
                raise_if_cancelled(cancel)
                frames = read_frames_dir(frames_dir, request.frame_count, request.width, request.height)
            raise_if_cancelled(cancel)
            result = finish_result(request, mp4_temp, output_path, overwrite=overwrite, frames=frames,
                                   want_audio=want_audio, timings=timings, command=argv, engine_log=stderr,
                                   engine_variables=engine_variables(env))
            published = True
            return result
        finally:
            if mp4_temp is not None and mp4_temp.parent != workdir:
                remove_quietly(mp4_temp)
            shutil.rmtree(workdir, ignore_errors=True)
            if not published:
                remove_leftovers([f"{folder}{os.sep}" for folder in made_folders])

    def _run(self, argv: list[str], request: GenerationRequest, env: dict[str, str], *, writes_mp4: bool,
             on_progress: ProgressCallback | None, cancel: CancelToken | None, lock: EngineLock,
             leftovers: list[Path], disk_needs: Sequence[DiskNeed] = ()) -> tuple[str, dict[str, float]]:
        """Run h3 to completion under supervision; return (stderr, timings) or raise.

        The engine is recorded beside the held lock with the temporary files it writes
        (`leftovers`), so that if this process dies, the next holder stops it and removes them.
        A disk in `disk_needs` that stopped FFmpeg or h3 is reported as a DiskError, even when
        h3 exited 0 (an FFmpeg that failed writing the MP4 trailer may exit 0 with a truncated file)."""
        tracker = ProgressTracker(expected_phases(request, writes_mp4=writes_mp4), time.monotonic())
        try:
            # h3 opens h3_shaders.metal by relative path: run it from its own directory.
            process = EngineProcess(argv, cwd=engine_working_directory(self.engine_path), env=env)
        except OSError as error:
            if error.errno == errno.E2BIG:    # the prompt is over the system's argument limit
                raise _argument_limit_error(argv, env, request.prompt) from None
            raise EngineNotFoundError(f"cannot start the engine {argv[0]}: {error.strerror}",
                                      hint=ENGINE_BUILD_HINT) from None
        lock.record_engine(process.pid, leftovers=leftovers)
        last_activity = time.monotonic()
        last_event: ProgressEvent | None = None

        def handle(piece_timeout: float) -> None:
            nonlocal last_activity, last_event
            piece = process.next_piece(piece_timeout)
            while piece is not None:
                last_activity = time.monotonic()
                event = tracker.feed(piece.text, piece.complete, now=last_activity)
                if event is not None:
                    last_event = event
                    if on_progress is not None:
                        on_progress(event)
                piece = process.next_piece(0)

        try:
            while True:
                handle(POLL_SECONDS)
                if cancel is not None and cancel.cancelled:
                    process.stop()
                    raise GenerationCancelled("generation cancelled; the engine was stopped and no output was kept")
                if process.poll() is not None:
                    process.stop()      # sweep up grandchildren (FFmpeg) and let stderr reach EOF
                    handle(0)
                    break
                if self.stall_timeout is not None and time.monotonic() - last_activity > self.stall_timeout:
                    process.stop()
                    stderr = process.stderr_text
                    message = engine_message_from(stderr)
                    raise EngineStalledError(
                        f"the engine made no progress for {self.stall_timeout:g} s "
                        f"{phase_words(last_event, before=ONE_SHOT_BEFORE_PROGRESS)} and was stopped",
                        engine_message=message, exit_code=process.poll(), stderr=stderr,
                        command=argv, hint=failure_hint(request, message, stalled=True))
        finally:
            process.stop()
            lock.clear_engine()
        stderr = process.stderr_text
        timings = tracker.finish(time.monotonic())
        status = process.popen.returncode
        message = engine_message_from(stderr)
        if status >= 0:
            raise_for_disk_problem(stderr, disk_needs, engine_message=message)
        if status == 0:
            return stderr, timings
        if status < 0:
            raise EngineCrashedError(f"the engine crashed ({signal_name(-status)}) "
                                     f"{phase_words(last_event, before=ONE_SHOT_BEFORE_PROGRESS)}"
                                     + (f", after h3 said: {message}" if message else ""),
                                     engine_message=message, exit_code=status, stderr=stderr, command=argv,
                                     hint=failure_hint(request, message, signal_number=-status))
        if status == 2:
            raise EngineError(f"h3 rejected its command line: {message or 'usage error'}", engine_message=message,
                              exit_code=status, stderr=stderr, command=argv,
                              hint="this h3 build may be older or newer than h3bridge expects (upstream 8974cc0)")
        raise EngineError(f"h3 failed: {message or f'exit status {status}'}", engine_message=message,
                          exit_code=status, stderr=stderr, command=argv, hint=failure_hint(request, message))


def out_of_memory_hint(request: GenerationRequest) -> str:
    """What to try after macOS killed the engine (SIGKILL is how it ends a process out of memory),
    leaving out what this request already does."""
    options = [] if request.ssd_streaming else ["ssd_streaming (--ssd-streaming)"]
    options += ["fewer frames", "a smaller canvas or render canvas"]
    if request.layers > MIN_LAYERS:
        options.append("fewer DiT layers (--layers)")
    return ("SIGKILL usually means macOS ran out of memory; check `h3bridge plan`, then try "
            + ", ".join(options[:-1]) + " or " + options[-1])


# ----------------------------------------------------------------------------- what to do about a failure
# One place for both engines (the one-shot run above and the warm session in session.py).

ONE_SHOT_BEFORE_PROGRESS = "while loading the model, before its first progress report"


def phase_words(last: ProgressEvent | None, *, before: str) -> str:
    """Where in the job an engine stopped: its last progress report, e.g. "during denoise
    (last report 1/20)"; `before` when it reported none yet."""
    if last is None:
        return before
    return f"during {last.phase} (last report {last.done}/{last.total})"


METAL_DEVICE_HINT = (
    "h3 found no usable Metal GPU. Run it on an Apple Silicon Mac (M1 or later), natively: not under "
    "Rosetta (an x86_64 Python or terminal; `uname -m` must say arm64), not in a virtual machine or a "
    "container, and from a logged-in user's session (an ssh login or a launchd job with no one logged in "
    "at the Mac may see no GPU)")
CRASH_HINT = ("see the engine log; the next job starts a fresh engine. If the same request crashes again, "
              "report it at https://github.com/antirez/h3.c/issues with that log")


def failure_hint(request: GenerationRequest, message: str | None, *, signal_number: int | None = None,
                 stalled: bool = False) -> str | None:
    """The fix line for an engine that failed (`message`: h3's last error), died from
    `signal_number`, or was stopped by the watchdog (`stalled`). None leaves h3's message to
    speak for itself."""
    if stalled:
        return ("h3 reports nothing while it decodes the video (the tiled video VAE decode) and little while "
                "it loads from a slow disk: for a very large clip raise stall_timeout; otherwise see the "
                "engine log for where it stopped")
    if signal_number == signal.SIGKILL:
        return out_of_memory_hint(request)
    if signal_number is not None:
        return CRASH_HINT
    if not message:
        return "see the engine log"
    lowered = message.lower()
    if "cannot start ffmpeg" in lowered or "cannot start ffprobe" in lowered:
        return FFMPEG_HINT
    if "ffmpeg" in lowered and ("stream" in lowered or "exited" in lowered):
        return ("FFmpeg stopped while writing the clip; its own error is in the engine log (a full disk or "
                "an output folder that cannot be written are the usual causes)")
    if "ffmpeg" in lowered or "ffprobe" in lowered:
        return ("h3's FFmpeg could not read one of the media inputs: check that the file plays, or convert "
                "it (PNG/JPEG images, H.264 MP4 videos, WAV audio)")
    if "ref2va" in lowered and "checkpoint" in lowered:
        return "download the Ref2VA transformer into the model directory, or drop the references"
    if "h3_shaders.metal" in lowered:
        # h3 compiles it from its working directory (h3_gpu.m:353), which is the binary's real folder.
        return ("h3 reads h3_shaders.metal from the folder its binary is in: keep h3 in its h3.c "
                "checkout (a symlink to it elsewhere is fine, a copy is not), or rebuild it there")
    if "no metal device" in lowered or "cannot initialize metal" in lowered:
        return METAL_DEVICE_HINT
    if request.int8_row_fc2 and ("metal" in lowered or "m5" in lowered or "int8" in lowered):
        return "drop int8_row_fc2 (--use-int8-row-fc2, M5 only) and try again"
    if "metal" in lowered:
        return ("the GPU gave up on the work, most often for lack of memory: check `h3bridge plan`, close other "
                "GPU-heavy apps, and see the engine log")
    if "safetensors" in lowered or "model" in lowered or "tokenizer" in lowered or "config.json" in lowered:
        return "check the model directory (h3bridge verify)"
    return None


def _publish(temp: Path, output: Path, *, overwrite: bool) -> None:
    """Move the finished MP4 into place atomically, never clobbering a file that appeared
    meanwhile unless `overwrite`. A clip that cannot take its name is kept beside it (a render
    can cost many minutes), and the error says where."""
    try:
        _publish_or_keep_beside(temp, output, overwrite=overwrite)
    except OutputExistsError:
        raise
    except OSError as error:      # e.g. the folder became read-only or the output is now a folder
        need = DiskNeed(output.parent, "the output folder", temp.stat().st_size if temp.exists() else 0)
        raise disk_error_from_os_error(error, need) or MediaError(
            f"cannot move the finished clip to {output}: {error.strerror}",
            hint="check the output folder's permissions") from None


def _publish_or_keep_beside(temp: Path, output: Path, *, overwrite: bool) -> None:
    if overwrite:
        os.replace(temp, output)
        return
    if _link_new(temp, output):
        return
    for number in range(2, 1000):
        keep = output.with_name(f"{output.stem}-{number}{output.suffix}")
        if _link_new(temp, keep):
            raise OutputExistsError(f"the output {output} appeared while rendering; the new clip was kept as {keep}",
                                    hint="rename the files as you like; h3bridge replaced nothing",
                                    before_start=False)
    raise OutputExistsError(f"the output {output} appeared while rendering and no free name was found beside it",
                            hint="choose another name, or allow overwriting (CLI: --overwrite)", before_start=False)


def _link_new(temp: Path, target: Path) -> bool:
    """Give `temp` the name `target` only if nothing holds that name; True when done."""
    try:
        os.link(temp, target)      # fails if `target` exists: no race with another writer
    except FileExistsError:
        return False
    except OSError:
        # File systems without hard links (exFAT, some network shares): a small window remains.
        if target.exists():
            return False
        os.replace(temp, target)
        return True
    os.unlink(temp)
    return True


__all__ = ["OneShotEngine", "locate_engine", "locate_model_dir", "locate_media_tools", "MediaTools",
           "request_arguments", "expected_phases", "engine_message_from", "resolve_output", "check_media_tools",
           "engine_environment", "waiting_reporter", "finish_result", "staging_path", "raise_if_cancelled",
           "reference_arguments"]
