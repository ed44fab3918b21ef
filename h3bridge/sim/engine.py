"""h3-sim's generation core: upstream h3.c's `h3_load_dir` / `h3_generate` / cache API, simulated.

Public API (used by `h3bridge.sim.cli` and by the interactive session in `h3bridge.sim.interactive`):

    ctx = SimContext.load_dir(model_dir)          # h3_load_dir; raises SimError(upstream text)
    ctx.device, ctx.model                         # h3_device / h3_model (SimDevice, ModelInfo)
    ctx.set_cache_enabled(True)                   # h3_cache_set_enabled (False also clears)
    ctx.clear_cache()                             # h3_cache_clear
    ctx.cache_info() -> CacheInfo                 # h3_cache_get_info: embedding_entries,
                                                  #   embedding_bytes, prepared_dit, video_decoder
    result = generate(ctx, prompt, params,        # h3_generate; params is a SimParams (params.py)
                      on_progress=None,           #   (phase: str, done: int, total: int) -> bool
                      on_frame=None)              #   (frame: SimFrame) -> bool
                                                  # callbacks return True to cancel, like upstream's
                                                  # non-zero; raises SimError(message) where
                                                  # h3_generate returns NULL (message = h3_last_error)
    result: SimResult(width, height, frames, fps, sample_rate, seed)

`generate` writes upstream's own stderr lines itself ("h3: conditioning cache hit", "h3: video
VAE cache miss; decoder retained", ...) to `sys.stderr`, as h3.c does with fprintf; progress
goes only through `on_progress` (the CLI formats it like main.c `cli_progress`). With
`params.output_path` set it writes the MP4 through the ffmpeg program exactly like
h3_ffmpeg.c. Interactive mode: `h3bridge.sim.cli` calls
`h3bridge.sim.interactive.run(ctx, model_dir, params, show, seed_given) -> int` (h3_cli_run).

Upstream order inside `h3_generate` (h3.c:848-1727), mirrored step by step below: empty prompt;
`h3_valid_params`; 22-frame chunk; Ref2VA checkpoint; cache keys and invalidation;
conditioning (tokenizer 0/1..1/1; Ref2VA: ffprobe + image/video reads, then reference audio
with its limits and "audio VAE encoder" n/7; FL2VA: first/last frame reads; "video VAE
encoder" tiles and "Qwen vision" n/27 per visual; "text encoder" 0..50/50); DiT ("refine
text", "precompute AdaLN" n/50, "load transformer core" n/50) or cache hit; optional "preview
VAE load"; "denoise" (or "denoise enqueue" + final "denoise" on M5); "audio VAE" 0..7/7;
"video VAE load" n/36 (0/36 first when caching); frames to on_frame; "FFmpeg" 0/F, F/F.

Simulation-only environment variables (documented again in docs/sim-and-testing.md, "h3-sim"):
  H3_SIM_TIME_SCALE    seconds of sleep per simulated M1-Ultra second (default 0.002: the phases
                       of a default 864x480x56/20-step job sleep ~0.3 s in all; 1 = realistic,
                       ~2 min; real work such as frame rendering and x264 comes on top)
  H3_SIM_CRASH_PHASE   <phase>[:<done>]  report that progress, then die with SIGSEGV
  H3_SIM_HANG_PHASE    <phase>[:<done>]  report that progress, then stop progressing forever
  H3_SIM_HANG_NOTICE   a file the sim creates (holding its pid) once a hang fault has fired, after
                       its last write: from then on it writes nothing, like upstream's silent
                       tiled VAE decode (h3.c:1618), so a test can act on a truly silent engine
  H3_SIM_HOLD_PHASE    <phase>[:<done>]  report that progress, create H3_SIM_HOLD_NOTICE (if set),
  H3_SIM_HOLD_RELEASE  then wait (silent) until the file H3_SIM_HOLD_RELEASE exists and go on: a
  H3_SIM_HOLD_NOTICE   test holds a job at a known point, acts (kills a client, a server), releases it
  H3_SIM_HOLD_ONCE     =1: the job removes the release file as it goes on, so each job needs its own
  H3_SIM_FAIL_PHASE    <phase>[:<done>]  report that progress, then fail like a Metal error:
  H3_SIM_FAIL_MESSAGE  the message (default "Metal command buffer failed: Internal Error
                       (0000000e:Internal Error)"); main.c prints "h3: <message>", exit 1
  (without :<done> a fault fires at the phase's first report; a phase that this job never
  reports never fires.)  Device variables: see device.py. H3_SIM_LOG: see cli.py.
  H3_SIM_DENOISE_LOG   append one JSON line per finished denoise ({"pid": N, "seed": S, "steps": K}):
                       what a job cost, counted across processes (a warm engine denoises N times
                       in one process; H3_SIM_LOG counts the processes)
Upstream variables honoured: H3_FFMPEG, H3_FFPROBE (ffmpeg.py), H3_CPU_SAMPLER / H3_GPU_SAMPLER
(h3_dit.c:2579-2585 sampler choice), H3_PROFILE (set by --profile: "h3 profile:" lines in
h3_gpu.m:184-208's format at h3_dit.c's marks and each GPU context's teardown; the sim has no
GPU counters, so those fields are zero).
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import time
import unicodedata
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..upstream_costs import REFERENCE_SECONDS, JobShape
from . import content
from . import ffmpeg as media
from .device import SimDevice, device_from_env
from .libc import strerror, strtof
from .params import (AUDIO_HOP_LENGTH, FPS, SAMPLE_RATE, SLOWER_FLAGS,
                     ReferenceImageSize, ReferenceKind, SimParams, align_frame_count, c_llround,
                     reuse_evaluations,
                     latent_canvas, reference_image_canvas, reference_video_canvas,
                     temporal, valid_params_error,
                     video_encoder_latent_t)
from .st_header import ComponentInfo, HeaderError, inventory_dir, weight_store_paths

ERROR_LIMIT = 511          # char error[512] (h3_set_error, h3.c:361-367)
TEXT_LAYERS = 50           # h3_text_encoder.c:13
VISION_LAYERS = 27         # h3_vision_encoder.c:14
DIT_BLOCKS = 50            # h3_dit_schedule.h:11
VAE_LAYERS = 36            # h3_video_vae.c:19
AUDIO_STAGES = 7           # h3_audio_vae.c:18 (decoder); encoder reports ENCODER_STAGES + 2 = 7
ENCODER_TILE, ENCODER_OVERLAP = 256, 64   # h3_video_encoder.c:20-22
TEXT_WIDTH = 5120          # h3_text_encoder.c:15 TEXT_HIDDEN (cached BF16 row width)
DEFAULT_FAIL_MESSAGE = "Metal command buffer failed: Internal Error (0000000e:Internal Error)"


class SimError(Exception):
    """h3_last_error text of a failed h3_load_dir / h3_generate."""

    def __init__(self, message: str) -> None:
        raw = message.encode("utf-8", "surrogateescape")
        # vsnprintf into char[512] keeps at most 511 bytes.
        self.message = raw[:ERROR_LIMIT].decode("utf-8", "ignore") if len(raw) > ERROR_LIMIT else message
        super().__init__(self.message)


@dataclass(frozen=True)
class ModelInfo:
    """h3_model_info (h3.h:155-161)."""

    text_encoder: ComponentInfo
    fl2va_transformer: ComponentInfo
    ref2va_transformer: ComponentInfo
    video_vae: ComponentInfo
    audio_vae: ComponentInfo


@dataclass(frozen=True)
class CacheInfo:
    """h3_cache_info (h3.h:23-28)."""

    embedding_entries: int
    embedding_bytes: int
    prepared_dit: bool
    video_decoder: bool


@dataclass(frozen=True)
class SimFrame:
    """h3_frame (h3.h:49-59); `rgb` is HxWx3 uint8, stride = width * 3."""

    width: int
    height: int
    stride: int
    rgb: np.ndarray
    frame_index: int
    frame_count: int
    denoise_step: int = -1
    denoise_steps: int = 0


@dataclass(frozen=True)
class SimResult:
    """h3_result (h3.h:163-170)."""

    width: int
    height: int
    frames: int
    fps: int
    sample_rate: int
    seed: int
    # h3_last_error after the successful call: a cancel asked for during "FFmpeg" sets the text
    # (h3.c h3_progress_emit) but nothing checks it after the mux starts, so the clip is written
    # and the call succeeds with "generation cancelled during FFmpeg" left in the error buffer.
    last_error: str = ""


ProgressCallback = Callable[[str, int, int], object]
FrameCallback = Callable[[SimFrame], object]


@dataclass
class _Conditioning:
    """The conditioning cache entry (h3.c:219-267): encoded rows, plus the decoded media the
    simulator renders from."""

    key: str
    tokens: int
    tagged: bool
    video_elements: int
    audio_elements: int
    conditioned: bool
    media: content.Conditions


def _stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


@dataclass
class SimContext:
    """h3_ctx: model directory inventory + device + the interactive caches."""

    model_dir: str
    device: SimDevice
    model: ModelInfo
    cache_enabled: bool = False
    _conditioning: _Conditioning | None = None
    _dit_key: str | None = None
    _video_decoder_key: str | None = None

    @classmethod
    def load_dir(cls, model_dir: str | os.PathLike[str] | None) -> "SimContext":
        """h3_load_dir (h3.c:407-460)."""
        if not model_dir:
            raise SimError("model directory is required")
        root = os.fspath(model_dir)

        def require_file(relative: str) -> None:
            path = f"{root}/{relative}"
            if not os.path.isfile(path):      # stat + S_ISREG, following symlinks
                raise SimError(f"missing required model file: {path}")

        def inventory(relative: str) -> ComponentInfo:
            try:
                return inventory_dir(f"{root}/{relative}")
            except HeaderError as error:
                raise SimError(str(error)) from None

        require_file("FL2VA/transformer/config.json")
        require_file("FL2VA/tokenizer/tokenizer.json")
        text_encoder = inventory("FL2VA/text_encoder")
        fl2va = inventory("FL2VA/transformer")
        video_vae = inventory("FL2VA/video_vae/source")
        audio_vae = inventory("FL2VA/audio_vae")
        ref2va = ComponentInfo()
        if os.path.isfile(f"{root}/Ref2VA/transformer/model.safetensors.index.json"):
            ref2va = inventory("Ref2VA/transformer")
        device = device_from_env()
        if device is None:
            raise SimError("no Metal device available")
        return cls(root, device, ModelInfo(text_encoder, fl2va, ref2va, video_vae, audio_vae))

    def set_cache_enabled(self, enabled: bool) -> None:
        """h3_cache_set_enabled (h3.c:66-70)."""
        if not enabled:
            self.clear_cache()
        self.cache_enabled = bool(enabled)

    def clear_cache(self) -> None:
        """h3_cache_clear (h3.c:53-64)."""
        self._conditioning = None
        self._dit_key = None
        self._video_decoder_key = None

    def cache_info(self) -> CacheInfo:
        """h3_cache_get_info (h3.c:72-89): BF16 rows + one tag byte per token + f32 conditions."""
        entry = self._conditioning
        entries = 1 if entry else 0
        size = 0
        if entry:
            size = (entry.tokens * TEXT_WIDTH * 2 + entry.tokens
                    + entry.video_elements * 4 + entry.audio_elements * 4)
        return CacheInfo(entries, size, self._dit_key is not None,
                         self._video_decoder_key is not None)


# ---------------------------------------------------------------- time model and faults

# Seconds on the reference machine for the reference job (864x480, 56 frames, 20 steps): the
# one table of upstream's per-phase costs, shared with the bridge's progress weights (see
# h3bridge/upstream_costs.py for why it lives there and not here).
_BASE_SECONDS = REFERENCE_SECONDS


def _time_scale() -> float:
    text = os.environ.get("H3_SIM_TIME_SCALE", "")
    try:
        value = float(text) if text else 0.002
    except ValueError:
        raise SimError(f"H3_SIM_TIME_SCALE must be a number, not {text!r}") from None
    return max(value, 0.0)


@dataclass(frozen=True)
class _Fault:
    phase: str
    done: int | None

    @classmethod
    def parse(cls, variable: str) -> "_Fault | None":
        text = os.environ.get(variable, "")
        if not text:
            return None
        phase, colon, done = text.rpartition(":")
        if colon and done.strip().lstrip("-").isdigit():
            return cls(phase, int(done))
        return cls(text, None)

    def matches(self, phase: str, done: int) -> bool:
        return phase == self.phase and (self.done is None or self.done == done)


def _notice(path: str | None) -> None:
    """Create `path` holding this process's pid (a fault has fired), under a temporary name and
    renamed, so a reader never sees it half-written."""
    if path:
        from ..safeio.outputs import write_output
        write_output(path, f"{os.getpid()}\n", overwrite=True, field="H3_SIM notice")


class _Progress:
    """h3_generation_progress + h3_progress_emit (h3.c:639-653), with faults and time."""

    def __init__(self, ctx: SimContext, on_progress: ProgressCallback | None) -> None:
        self.ctx = ctx
        self.on_progress = on_progress
        self.cancelled_message: str | None = None
        self.scale = _time_scale()
        self.crash = _Fault.parse("H3_SIM_CRASH_PHASE")
        self.hang = _Fault.parse("H3_SIM_HANG_PHASE")
        self.hold = _Fault.parse("H3_SIM_HOLD_PHASE")
        self.fail = _Fault.parse("H3_SIM_FAIL_PHASE")
        profile = os.environ.get("H3_PROFILE", "")
        self.profiling = bool(profile) and profile != "0"   # h3_gpu_profile_enabled (h3_gpu.m:175-178)

    def profile(self, label: str, phase: str, since: float) -> None:
        """h3_gpu_profile_emit's line (h3_gpu.m:184-208). Only the format and the wall time are
        upstream's; the sim has no GPU counters, so those fields read zero."""
        if not self.profiling:
            return
        wall = time.monotonic() - since
        _stderr(f"h3 profile: {label:<24} {phase:<14} wall={wall:8.3f}s encode={0.0:7.3f}s "
                f"wait={wall:8.3f}s root-gpu={0.0:7.3f}s peak={0.0:7.3f}GiB alloc={0.0:7.3f}GiB "
                "submissions=0 direct=0 linear=0 conv=0 attention=0\n")

    def work(self, reference_seconds: float) -> None:
        if self.scale and reference_seconds > 0:
            time.sleep(reference_seconds * self.scale)

    def emit(self, phase: str, done: int, total: int) -> None:
        if self.cancelled_message is None and self.on_progress is not None:
            if self.on_progress(phase, done, total):
                self.cancelled_message = f"generation cancelled during {phase}"
        if self.crash and self.crash.matches(phase, done):
            # A C program killed by SIGSEGV loses what stdio still buffers: stdout is not flushed.
            _stderr("")
            try:
                signal.signal(signal.SIGSEGV, signal.SIG_DFL)
            except ValueError:
                # Not the main thread (the libh3 double can be called from any thread): Python
                # installs no SIGSEGV handler of its own, so the default action still applies.
                pass
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(5)   # the signal is delivered asynchronously on some platforms
        if self.hang and self.hang.matches(phase, done):
            # Everything this process will ever write is written (the progress line above was
            # flushed): say so, then fall silent.
            _notice(os.environ.get("H3_SIM_HANG_NOTICE"))
            while True:
                time.sleep(3600)
        if self.hold and self.hold.matches(phase, done):
            _notice(os.environ.get("H3_SIM_HOLD_NOTICE"))
            release = os.environ.get("H3_SIM_HOLD_RELEASE") or ""
            while not os.path.exists(release):
                time.sleep(0.02)
            if os.environ.get("H3_SIM_HOLD_ONCE") == "1":
                # one release, one job: the next job holds again (a test lets jobs go one by one)
                try:
                    os.remove(release)
                except FileNotFoundError:
                    pass
        if self.fail and self.fail.matches(phase, done):
            raise SimError(os.environ.get("H3_SIM_FAIL_MESSAGE") or DEFAULT_FAIL_MESSAGE)

    def check_cancelled(self) -> None:
        """`if (progress.cancelled) goto cleanup;`"""
        if self.cancelled_message is not None:
            raise SimError(self.cancelled_message)

    def steps(self, phase: str, total: int, seconds: float, *, start: int = 1) -> None:
        """A stage that reports start..total/total, spending `seconds` evenly."""
        for done in range(start, total + 1):
            self.work(seconds / max(total - start + 1, 1))
            self.emit(phase, done, total)


# ---------------------------------------------------------------- keys (h3.c:127-192)

def _key_file(role: str, path: str | None) -> str:
    """h3_key_file: path identity by size and mtime (seconds, nanoseconds)."""
    if path is None:
        return f"|{role}=none"
    length = len(path.encode("utf-8", "surrogateescape"))
    try:
        status = os.stat(path)
    except OSError:
        return f"|{role}={length}:{path}:missing"
    return (f"|{role}={length}:{path}:{status.st_size}:"
            f"{status.st_mtime_ns // 10**9}:{status.st_mtime_ns % 10**9}")


def _conditioning_key(prompt: str, p: SimParams, render_w: int, render_h: int, ref2va: bool) -> str:
    key = f"mode={int(ref2va)}|prompt={len(prompt.encode('utf-8', 'surrogateescape'))}:{prompt}"
    if not ref2va and p.first_frame is None and p.last_frame is None:
        return key
    key += (f"|render={render_w}x{render_h}|frames={p.frames}|image-size={int(p.reference_image_size)}"
            + _key_file("first", p.first_frame) + _key_file("last", p.last_frame))
    for reference in p.references:
        key += (f"|ref={int(reference.kind)}:{int(reference.include_embedded_audio)}"
                + _key_file("media", reference.path) + _key_file("audio", reference.audio_path))
    return key


def _prepared_key(conditioning: str, p: SimParams, render_w: int, render_h: int) -> str:
    slow = "".join(str(int(getattr(p, name))) for name in SLOWER_FLAGS)
    return (f"{conditioning}|shape={render_w}x{render_h}x{p.frames}|steps={p.steps}"
            f"|layers={p.dit_layers}|reuse-core={p.core_reuse}|reduce={p.token_reduction}"
            f"|row-fc2={p.use_int8_row_fc2}|reference-rope={p.use_reference_rope}"
            f"|ssd-streaming={p.ssd_streaming}|slow={slow}")


# ---------------------------------------------------------------- simulated stages

def _open_weights(directory: str) -> None:
    """Every stage opens its shards through h3_weight_store_open (dotfiles included), then
    creates its Metal context."""
    try:
        weight_store_paths(directory)
    except HeaderError as error:
        raise SimError(str(error)) from None
    _create_gpu()


def _create_gpu() -> None:
    """h3_gpu_create (h3_gpu.m:353-401) compiles h3_shaders.metal from the working directory;
    a missing file is NSFileReadNoSuchFileError. Checked only with H3_SIM_SHADERS=1: h3-sim runs
    from a Python scripts folder, which has no shader file."""
    if os.environ.get("H3_SIM_SHADERS") == "1" and not os.path.isfile("h3_shaders.metal"):
        raise SimError("cannot compile h3_shaders.metal: The file \u201ch3_shaders.metal\u201d couldn\u2019t "
                       "be opened because there is no such file.")


_VIDEO_CHANNELS, _AUDIO_CHANNELS = 24, 32    # LATENT_CHANNELS, h3_video_vae.c:14, h3_audio_vae.c:14
_STANDARD_DEVIATION = "standard deviation"  # decoders' wording; the video encoder says "deviation"


def _check_config(path: str, label: str, *, channels: int,
                  deviation: str = _STANDARD_DEVIATION) -> None:
    """load_latent_normalization (h3_video_vae.c:268-318, h3_audio_vae.c:300-348) and the video
    encoder's load_normalization (h3_video_encoder.c:237-284): the file, then the latents_mean
    and latents_std arrays as parse_float_array reads them, then std > 0."""
    if os.path.isdir(path):
        # macOS fopen/fseek/ftell accept a directory; fread then fails (EISDIR).
        raise SimError(f"cannot read {label} config {path}")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise SimError(f"cannot open {label} config {path}: {strerror(error.errno or 0)}") from None
    if size < 1 or size > 1024 * 1024:
        raise SimError(f"invalid {label} config {path}")
    text = data.split(b"\0", 1)[0].decode("latin-1")     # a C string: bytes kept 1:1
    _parse_float_array(text, "latents_mean", channels, label)
    deviations = _parse_float_array(text, "latents_std", channels, label)
    if any(value <= 0.0 for value in deviations):
        raise SimError(f"{label} latent {deviation} is invalid")


def _parse_float_array(text: str, key: str, count: int, label: str) -> list[float]:
    """parse_float_array (h3_video_vae.c:232-266 and its twins): strstr for the quoted key,
    then ':' and '[' anywhere after it, then `count` strtof values separated by ','."""
    start = text.find(f'"{key}"')
    colon = text.find(":", start + len(key) + 2) if start >= 0 else -1
    cursor = text.find("[", colon) if colon >= 0 else -1
    if cursor < 0:
        raise SimError(f"{label} config is missing {key}")
    cursor += 1
    values = []
    blanks = " \n\r\t"
    for index in range(count):
        while cursor < len(text) and text[cursor] in blanks:
            cursor += 1
        value, rest, erange = strtof(text[cursor:])
        if value is None or erange or not math.isfinite(value):
            raise SimError(f"{label} config has malformed {key}")
        values.append(value)
        cursor = len(text) - len(rest)
        while cursor < len(text) and text[cursor] in blanks:
            cursor += 1
        following = text[cursor:cursor + 1]
        if index + 1 < count:
            if following != ",":
                raise SimError(f"{label} config has short {key}")
            cursor += 1
        elif following != "]":
            raise SimError(f"{label} config has long {key}")
    return values


@dataclass(frozen=True)
class _TokenCounter:
    """How many ids h3_tokenizer_encode (h3_tokenizer.m:416-466) gives a text: each added
    token's content is one id; the plain text between them is NFC-normalised and byte-level
    BPE-encoded. Without merges (every fixture model's tokenizer.json: the whole byte-level
    alphabet, no merges) that is one id per UTF-8 byte, exactly. With merges (a released
    tokenizer, which only the real h3 meets on a Mac) the sim estimates ~4 bytes per id rather
    than re-implement Qwen's BPE."""

    added: tuple[str, ...]
    merges: bool

    def count(self, text: str) -> int:
        total, start = 0, 0
        while start < len(text):
            found = [(text.find(token, start), -len(token), token) for token in self.added]
            found = [item for item in found if item[0] >= 0]
            if not found:
                break
            position, _, token = min(found)
            total += self._plain(text[start:position]) + 1
            start = position + len(token)
        return total + self._plain(text[start:])

    def _plain(self, text: str) -> int:
        if not text:
            return 0
        size = len(unicodedata.normalize("NFC", text).encode("utf-8", "surrogateescape"))
        return -(-size // 4) if self.merges else size


def _vision_tokens(width: int, height: int) -> int:
    """h3_vision_encode_bf16's merged rows (h3_vision_encoder.c:443-450, :609): 16-pixel
    patches merged 2x2."""
    return (height // 16) * (width // 16) // 4


def _conditioning_tokens(counter: _TokenCounter, prompt: str, p: SimParams, ref2va: bool,
                         visuals: list[tuple[int, int, int, bool]],
                         visual_of: dict[int, int]) -> int:
    """The token rows h3_generate caches: the prompt's ids (T2VA, h3.c:1413), or the
    multimodal presentation h3_multimodal_encode_fl2va_bf16 / _ref2va_bf16 builds
    (h3_multimodal.c:196-358): "<Picture N>: " + vision start + the image's rows + vision end
    per image; per reference "<Audio N>: " when it carries audio, "<Video N>: " and, per pair of
    sampled frames, "<T seconds>" + a vision span; then the prompt."""
    if not visuals:
        return max(counter.count(prompt), 1)    # pad_empty (h3_tokenizer.m:448)
    tokens = 0

    def span(width: int, height: int) -> int:
        return 1 + _vision_tokens(width, height) + 1     # H3_VISION_START ... H3_VISION_END

    if not ref2va:
        for number, (width, height, _, _) in enumerate(visuals, start=1):
            tokens += counter.count(f"<Picture {number}>: ") + span(width, height)
        return tokens + counter.count(prompt)
    pictures = videos = sounds = 0
    for index, reference in enumerate(p.references):
        if (reference.kind in (ReferenceKind.AUDIO, ReferenceKind.VIDEO_AUDIO)
                or (reference.kind == ReferenceKind.VIDEO and reference.include_embedded_audio)):
            sounds += 1
            tokens += counter.count(f"<Audio {sounds}>: ")
        if reference.kind == ReferenceKind.AUDIO:
            continue
        width, height, frames, is_image = visuals[visual_of[index]]
        if is_image:
            pictures += 1
            tokens += counter.count(f"<Picture {pictures}>: ") + span(width, height)
            continue
        videos += 1
        samples = (frames + 11) // 12
        for block in range((samples + 1) // 2):
            first = 2 * block
            second = first + 1 if first + 1 < samples else first
            if block == 0:
                tokens += counter.count(f"<Video {videos}>: ")
            tokens += counter.count(f"<{(first + second) / 4.0:.1f} seconds>") + span(width, height)
    return tokens + counter.count(prompt)


def _load_tokenizer(path: str) -> _TokenCounter:
    """h3_tokenizer_load's readable/JSON checks (h3_tokenizer.m:289-313)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        raise SimError(f"cannot read tokenizer: {path}") from None
    try:
        value = json.loads(data)
    except ValueError:
        # NSJSONSerialization's localizedDescription for malformed JSON.
        raise SimError("The data couldn\u2019t be read because it isn\u2019t in the correct format.") from None
    if not isinstance(value, dict):
        raise SimError("invalid tokenizer JSON")
    # h3_tokenizer.m:313-321: a byte-level BPE with a null unk_token and NFC normalization.
    # (A "model"/"normalizer" that is not an object makes upstream's Objective-C throw; the
    # sim reports it as the specification error instead of aborting.)
    model, normalizer = value.get("model"), value.get("normalizer")
    if (not isinstance(model, dict) or model.get("type") != "BPE"
            or "unk_token" not in model or model["unk_token"] is not None
            or not isinstance(normalizer, dict) or normalizer.get("type") != "NFC"
            or not isinstance(model.get("vocab"), dict) or not isinstance(model.get("merges"), list)):
        raise SimError("unexpected tokenizer specification")
    for entry in model["merges"]:    # h3_tokenizer.m:349-364
        if not ((isinstance(entry, str) and " " in entry)
                or (isinstance(entry, list) and len(entry) == 2)):
            raise SimError("invalid tokenizer merge")
    for token in value.get("added_tokens") or []:    # :368-375
        if isinstance(token, dict) and any(token.get(flag) for flag in
                                           ("single_word", "lstrip", "rstrip", "normalized")):
            raise SimError("unsupported added-token policy")
    added = tuple(str(token["content"]) for token in value.get("added_tokens") or []
                  if isinstance(token, dict) and token.get("content"))
    return _TokenCounter(added, bool(model["merges"]))


def _encoder_tiles(extent: int) -> int:
    """tile_axis_build (h3_video_encoder.c:611-651): tiles along one axis."""
    if extent <= ENCODER_TILE:
        return 1
    count = -(-extent // ENCODER_TILE)
    while ENCODER_TILE * count - ENCODER_OVERLAP * (count - 1) < extent:
        count += 1
    return count


VAE_TILE, VAE_OVERLAP, VAE_CHUNK_LATENT_T = 256, 64, 7   # h3_video_vae.c:15,29-30


def _vae_tile_count(extent: int, tile: int) -> int:
    """tile_count_for_extent (h3_video_vae.c:658-664)."""
    if extent <= tile:
        return 1
    count = -(-extent // tile)
    while tile * count - VAE_OVERLAP * (count - 1) < extent:
        count += 1
    return count


def _vae_tile_pixels(height: int, width: int) -> int:
    """configured_tile_pixels (h3_video_vae.c:666-690)."""
    text = os.environ.get("H3_VAE_TILE_PIXELS", "")
    if text and re.fullmatch(r"[ \t\n\v\f\r]*[+-]?[0-9]+", text):
        pixels = int(text)
        if VAE_TILE <= pixels <= 512 and pixels % 16 == 0:
            return pixels
    best, best_score = VAE_TILE, None
    for pixels in range(VAE_TILE, 321, 16):
        score = _vae_tile_count(height, pixels) * _vae_tile_count(width, pixels) * pixels * pixels
        if best_score is None or score < best_score:
            best, best_score = pixels, score
    return best


def _vae_tiles_line(prefix: str, height: int, width: int) -> None:
    """The H3_PROFILE tile-plan line (h3_video_vae.c:922-924 resident, :1069-1071 one-shot);
    upstream tests getenv() only, so any value counts."""
    if os.environ.get("H3_PROFILE") is None:
        return
    pixels = _vae_tile_pixels(height, width)
    _stderr(f"h3: {prefix}video VAE tiles {_vae_tile_count(width, pixels)}x"
            f"{_vae_tile_count(height, pixels)} at {pixels} pixels\n")


def _media(call: Callable[[], object]) -> object:
    try:
        return call()
    except media.MediaFailure as failure:
        raise SimError(str(failure)) from None


def _is_utf8(text: str) -> bool:
    """argv arrives surrogate-escaped; undecodable bytes mean the C string is not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _use_gpu_sampler(device: SimDevice) -> bool:
    """gpu_sampler_requested (h3_dit.c:2579-2585)."""
    cpu = os.environ.get("H3_CPU_SAMPLER")
    if cpu and cpu != "0":
        return False
    value = os.environ.get("H3_GPU_SAMPLER")
    if value is not None:
        return bool(value) and value != "0"
    return device.is_m5


def _gpu_sampler_window() -> int:
    """gpu_sampler_window (h3_dit.c:2587-2594)."""
    value = os.environ.get("H3_GPU_SAMPLER_WINDOW")
    if not value:
        return 1
    if re.fullmatch(r"[ \t\n\v\f\r]*[+-]?[0-9]+", value):
        parsed = int(value)
        if 0 <= parsed <= 1000:
            return parsed
    return 1


def _denoise_profile_lines(gpu: bool, steps: int, reuse: int) -> None:
    """What the samplers print before their first step when H3_PROFILE is set at all (h3_dit.c
    tests getenv only, so "0" counts; the "h3 profile:" lines' h3_gpu_profile_enabled differs):
    the reuse schedule's size (denoise_euler_gpu :2630-2632, denoise_euler :2891-2893) and the
    GPU sampler's encode window (:2633-2639)."""
    if os.environ.get("H3_PROFILE") is None:
        return
    if reuse > 1:
        evaluations = reuse_evaluations(steps, reuse)
        _stderr(f"h3: selected {'GPU ' if gpu else ''}reuse schedule has {evaluations} evaluations\n")
    if gpu:
        window = _gpu_sampler_window()
        split_disabled = window == 1 and os.environ.get("H3_DIT_COMMAND_BLOCKS") is None
        _stderr(f"h3: GPU sampler encode window is {'bounded' if window else 'unbounded'}; "
                f"internal split {'disabled' if split_disabled else 'enabled'}\n")


def _log_denoise(p: SimParams) -> None:
    """H3_SIM_DENOISE_LOG: one line per finished denoise, appended in one write (several engines may share it)."""
    path = os.environ.get("H3_SIM_DENOISE_LOG")
    if not path:
        return
    line = json.dumps({"pid": os.getpid(), "seed": p.seed, "steps": p.steps}) + "\n"
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode("utf-8"))
    finally:
        os.close(descriptor)


def generate(ctx: SimContext, prompt: str | None, params: SimParams | None,
             on_progress: ProgressCallback | None = None,
             on_frame: FrameCallback | None = None) -> SimResult:
    """h3_generate (h3.c:848-1727). Raises SimError with h3_last_error's text."""
    p = params
    if not prompt:
        raise SimError("prompt must not be empty")
    if p is None:   # h3_valid_params (h3.c:482-485); only a library caller can pass NULL
        raise SimError("generation parameters are required")
    message = valid_params_error(p, ctx.device.metal4, on_frame is not None)
    if message:
        raise SimError(message)
    render_w = p.render_width or p.width
    render_h = p.render_height or p.height
    if align_frame_count(p.frames) < 22:
        raise SimError("generation requires at least one trained 22-frame decoder chunk")
    ref2va = bool(p.references)
    if ref2va and not ctx.model.ref2va_transformer.files:
        raise SimError("ordered references require the Ref2VA checkpoint")
    progress = _Progress(ctx, on_progress)
    shape = temporal(p.frames)
    latent_w, latent_h = latent_canvas(render_w, render_h)
    part = "Ref2VA" if ref2va else "FL2VA"
    root = ctx.model_dir
    tokenizer_path = f"{root}/{part}/tokenizer/tokenizer.json"
    text_path = f"{root}/{part}/text_encoder"
    dit_path = f"{root}/{part}/transformer"
    vae_path = f"{root}/{part}/video_vae/source"
    audio_vae_path = f"{root}/{part}/audio_vae"
    conditioning_key = _conditioning_key(prompt, p, render_w, render_h, ref2va)
    prepared_key = _prepared_key(conditioning_key, p, render_w, render_h)
    decoder_key = f"{vae_path}|{latent_h}x{latent_w}"
    if ctx.cache_enabled and ctx._video_decoder_key not in (None, decoder_key):
        ctx._video_decoder_key = None
    if ctx.cache_enabled and ctx._dit_key not in (None, prepared_key):
        ctx._dit_key = None
    cached = ctx._conditioning
    if ctx.cache_enabled and cached is not None and cached.key == conditioning_key:
        conditioning = cached
        _stderr("h3: conditioning cache hit\n")
    else:
        conditioning = _encode_conditions(ctx, progress, prompt, p, ref2va, shape.frame_count,
                                          render_w, render_h, tokenizer_path, text_path,
                                          vae_path, audio_vae_path, conditioning_key)
        if ctx.cache_enabled:
            ctx._conditioning = conditioning
            _stderr("h3: conditioning cache miss; stored exact BF16\n")
    progress.check_cancelled()

    # DiT preparation (h3.c:1465-1538, h3_dit.c load_dit:1593-1700).
    costs = JobShape(render_w, render_h, p.width, p.height, shape.frame_count, shape.video_t,
                     shape.audio_t, p.steps, p.dit_layers, p.denoise_reuse, bool(p.ssd_streaming))
    dit_started = time.monotonic()
    if ctx.cache_enabled and ctx._dit_key == prepared_key:
        _stderr("h3: prepared DiT cache hit\n")
    else:
        _open_weights(dit_path)
        progress.emit("refine text", 0, 1)
        progress.work(_BASE_SECONDS["refine text"])
        progress.emit("refine text", 1, 1)
        progress.steps("precompute AdaLN", DIT_BLOCKS, _BASE_SECONDS["precompute AdaLN"])
        progress.steps("load transformer core", DIT_BLOCKS, costs.load_core_seconds())
        progress.profile("H3 DiT", "load", dit_started)
        if ctx.cache_enabled:
            ctx._dit_key = prepared_key
            _stderr("h3: prepared DiT cache miss; model retained\n")
    progress.check_cancelled()

    spec = content.PatternSpec(prompt, p.seed, p.width, p.height, shape.frame_count)
    preview_decoder = False
    if p.preview_denoise:
        progress.emit("preview VAE load", 0, VAE_LAYERS)
        _acquire_video_decoder(ctx, progress, decoder_key, vae_path, "preview VAE load",
                               latent_h, latent_w)
        preview_decoder = True
        if ctx.cache_enabled and ctx._video_decoder_key == decoder_key:
            progress.emit("preview VAE load", VAE_LAYERS, VAE_LAYERS)
        progress.check_cancelled()

    # Denoising (h3_dit.c denoise_euler_gpu / h3_dit_denoise_euler_preview).
    gpu = _use_gpu_sampler(ctx.device)
    _denoise_profile_lines(gpu, p.steps, p.denoise_reuse)
    denoise_started = time.monotonic()
    running = "denoise enqueue" if gpu else "denoise"
    preview_index = min(((shape.video_t - 2) // 5 // 2) * 17 + 11, shape.frame_count - 1)
    for step in range(p.steps):
        progress.emit(running, step, p.steps)
        progress.work(costs.denoise_step_seconds(step))
        if preview_decoder and on_frame is not None:
            progress.work(_BASE_SECONDS["preview decode"])
            rgb = content.render_preview(spec, conditioning.media, preview_index, step + 1, p.steps)
            frame = SimFrame(p.width, p.height, p.width * 3, rgb, preview_index,
                             shape.frame_count, step, p.steps)
            if on_frame(frame):
                if ctx.cache_enabled:
                    ctx._dit_key = None    # h3.c:1583-1588 drops a DiT that failed mid-run
                raise SimError(f"generation cancelled during denoising preview {step + 1}")
        progress.emit(running, step + 1, p.steps)
    if gpu:
        progress.emit("denoise", p.steps, p.steps)
    _log_denoise(p)
    progress.profile("H3 DiT", "GPU Euler denoise" if gpu else "Euler denoise", denoise_started)
    if not ctx.cache_enabled:
        progress.profile("H3 DiT", "total", dit_started)   # h3_dit_free of an uncached DiT
    progress.check_cancelled()

    # Audio VAE decode (h3.c:1594-1603, h3_audio_vae.c:660-700).
    progress.emit("audio VAE", 0, AUDIO_STAGES)
    audio_started = time.monotonic()
    _check_config(f"{audio_vae_path}/config.json", "audio VAE", channels=_AUDIO_CHANNELS)
    _open_weights(audio_vae_path)
    progress.steps("audio VAE", AUDIO_STAGES, costs.audio_vae_seconds())
    progress.profile("audio VAE decoder", "total", audio_started)
    samples = shape.audio_t * AUDIO_HOP_LENGTH
    pcm = content.render_audio(prompt, p.seed, samples, SAMPLE_RATE, conditioning.media)
    progress.check_cancelled()

    # Video VAE (h3.c:1604-1632).
    decode_seconds = costs.video_decode_seconds()
    if not preview_decoder and ctx.cache_enabled:
        progress.emit("video VAE load", 0, VAE_LAYERS)
        _acquire_video_decoder(ctx, progress, decoder_key, vae_path, "video VAE load",
                               latent_h, latent_w)
        preview_decoder = True
        if ctx._video_decoder_key == decoder_key:
            progress.emit("video VAE load", VAE_LAYERS, VAE_LAYERS)
    if preview_decoder:
        progress.work(decode_seconds)
    else:
        _check_config(f"{vae_path}/../config.json", "video VAE", channels=_VIDEO_CHANNELS)
        tile = _vae_tile_pixels(latent_h * 16, latent_w * 16)
        if shape.video_t > VAE_CHUNK_LATENT_T or latent_h > tile // 16 or latent_w > tile // 16:
            _vae_tiles_line("", latent_h * 16, latent_w * 16)   # decode_chunked (h3_video_vae.c:1226)
        _open_weights(vae_path)
        decode_started = time.monotonic()
        progress.steps("video VAE load", VAE_LAYERS, _BASE_SECONDS["video VAE load"])
        progress.work(decode_seconds)   # the tiled decode reports nothing at this commit
        progress.profile("video VAE decoder", "total", decode_started)
    progress.check_cancelled()

    if on_frame is not None:
        for index, rgb in enumerate(content.iter_frames(spec, conditioning.media)):
            frame = SimFrame(p.width, p.height, p.width * 3, rgb, index, shape.frame_count)
            if on_frame(frame):
                raise SimError(f"generation cancelled while delivering frame {index}")

    if p.output_path:
        progress.emit("FFmpeg", 0, shape.frame_count)
        progress.work(costs.ffmpeg_seconds())
        _media(lambda: media.write_av(p.output_path or "", content.iter_frames(spec, conditioning.media),
                                      shape.frame_count, p.width, p.height, FPS, pcm, SAMPLE_RATE))
        progress.emit("FFmpeg", shape.frame_count, shape.frame_count)
    return SimResult(p.width, p.height, shape.frame_count, FPS, SAMPLE_RATE, p.seed,
                     progress.cancelled_message or "")


def _acquire_video_decoder(ctx: SimContext, progress: _Progress, key: str, vae_path: str,
                           phase: str, latent_h: int, latent_w: int) -> None:
    """h3_acquire_video_decoder (h3.c:688-719)."""
    if ctx.cache_enabled and ctx._video_decoder_key == key:
        _stderr("h3: video VAE cache hit\n")
        return
    if ctx.cache_enabled:
        ctx._video_decoder_key = None
    _check_config(f"{vae_path}/../config.json", "video VAE", channels=_VIDEO_CHANNELS)
    _vae_tiles_line("resident ", latent_h * 16, latent_w * 16)
    _open_weights(vae_path)
    progress.steps(phase, VAE_LAYERS, _BASE_SECONDS["video VAE load"])
    if not ctx.cache_enabled:
        return
    ctx._video_decoder_key = key
    _stderr("h3: video VAE cache miss; decoder retained\n")


def _encode_conditions(ctx: SimContext, progress: _Progress, prompt: str, p: SimParams,
                       ref2va: bool, frame_count: int, render_w: int, render_h: int,
                       tokenizer_path: str, text_path: str, vae_path: str,
                       audio_vae_path: str, key: str) -> _Conditioning:
    """The conditioning branch of h3_generate (h3.c:989-1438)."""
    progress.emit("tokenizer", 0, 1)
    progress.work(_BASE_SECONDS["tokenizer"])
    counter = _load_tokenizer(tokenizer_path)
    progress.emit("tokenizer", 1, 1)
    progress.check_cancelled()
    found = content.Conditions()
    # (width, height, frames, is_image) per visual condition, in order.
    visuals: list[tuple[int, int, int, bool]] = []
    audio_elements = 0
    visual_of: dict[int, int] = {}
    if ref2va:
        for index, reference in enumerate(p.references):
            if reference.kind == ReferenceKind.AUDIO:
                continue
            path = reference.path or ""
            source_w, source_h = _media(lambda: media.probe_visual_size(path))  # type: ignore[misc]
            progress.work(_BASE_SECONDS["media read"])
            if reference.kind == ReferenceKind.IMAGE:
                cap = 2048 if p.reference_image_size == ReferenceImageSize.MAX else 0
                width, height = reference_image_canvas(source_w, source_h, render_w, render_h, cap)
                image = _media(lambda: media.read_image(path, width, height, media.FIT_STRETCH))
                found.reference_images.append(image)   # type: ignore[arg-type]
                visuals.append((width, height, 1, True))
            else:
                width, height = reference_video_canvas(source_w, source_h)
                video = _media(lambda: media.read_video(path, width, height, frame_count))
                found.reference_videos.append(video)   # type: ignore[arg-type]
                frames = len(video)   # type: ignore[arg-type]
                visuals.append((width, height, frames, False))
            visual_of[index] = len(visuals) - 1
        total_samples = 0
        for index, reference in enumerate(p.references, start=1):
            truncate = False
            max_samples = 32000 * 15
            if reference.kind == ReferenceKind.AUDIO:
                audio_path = reference.path
            elif reference.kind == ReferenceKind.VIDEO_AUDIO:
                audio_path, truncate = reference.audio_path, True
            elif reference.kind == ReferenceKind.VIDEO and reference.include_embedded_audio:
                audio_path, truncate = reference.path, True
            else:
                continue
            if truncate:
                frames = visuals[visual_of[index - 1]][2]
                max_samples = c_llround(frames * 32000.0 / FPS)
                if max_samples < 64000:
                    raise SimError(f"video soundtrack {index} requires at least 2 seconds; "
                                   "request at least 56 output frames")
            pcm = _media(lambda: media.read_audio(audio_path or "", max_samples, truncate))
            samples = pcm.shape[1]   # type: ignore[union-attr]
            if samples > 32000 * 15 - total_samples:
                raise SimError("ordered reference audio exceeds 15 seconds in total")
            _check_config(f"{audio_vae_path}/config.json", "audio VAE", channels=_AUDIO_CHANNELS)
            _open_weights(audio_vae_path)
            encoder_started = time.monotonic()
            progress.steps("audio VAE encoder", AUDIO_STAGES,
                           _BASE_SECONDS["audio VAE encoder"] * samples / 64000)
            progress.profile("audio VAE encoder", "total", encoder_started)
            found.reference_audio.append(pcm)   # type: ignore[arg-type]
            audio_elements += -(-samples // AUDIO_HOP_LENGTH) * 2 * 32
            total_samples += samples
            progress.check_cancelled()
    else:
        # `if (params->first_frame)`: an empty path is still read (and rejected by FFmpeg's
        # argument check), h3.c:1226-1250.
        if p.first_frame is not None:
            path = p.first_frame
            found.first_frame = _media(lambda: media.read_image(     # type: ignore[assignment]
                path, render_w, render_h, media.FIT_STRETCH))
            visuals.append((render_w, render_h, 1, True))
        if p.last_frame is not None:
            path_last = p.last_frame
            found.last_frame = _media(lambda: media.read_image(      # type: ignore[assignment]
                path_last, render_w, render_h, media.FIT_COVER))
            visuals.append((render_w, render_h, 1, True))
    video_elements = 0
    if visuals:
        for width, height, frames, _ in visuals:
            lw, lh = latent_canvas(width, height)
            video_elements += video_encoder_latent_t(frames) * lh * lw // 4 * 96
        for width, height, frames, _ in visuals:
            _open_weights(vae_path)
            _check_config(f"{vae_path}/../config.json", "video VAE", channels=_VIDEO_CHANNELS,
                          deviation="deviation")   # h3_video_encoder.c:278-282
            tiles = _encoder_tiles(height) * _encoder_tiles(width)
            encoder_started = time.monotonic()
            progress.steps("video VAE encoder", tiles,
                           _BASE_SECONDS["video VAE encoder"] * tiles * max(frames, 4) / 4)
            progress.profile("video VAE encoder", "total", encoder_started)
            progress.check_cancelled()
        for width, height, frames, is_image in visuals:
            encodes = 1 if is_image else ((frames + 11) // 12 + 1) // 2
            for _ in range(encodes):
                _open_weights(text_path)
                vision_started = time.monotonic()
                progress.steps("Qwen vision", VISION_LAYERS, _BASE_SECONDS["Qwen vision"])
                progress.profile("Qwen vision encoder", "total", vision_started)
                progress.check_cancelled()
            progress.check_cancelled()
    utf8 = _is_utf8(prompt)
    if not visuals and not utf8:
        # h3_tokenizer_encode (h3_tokenizer.m:424-427) runs before "text encoder" 0/50 in
        # T2VA (h3.c:1412-1416) ...
        raise SimError("prompt is not valid UTF-8")
    progress.emit("text encoder", 0, TEXT_LAYERS)
    if not utf8:
        # ... and inside h3_multimodal_encode_* (h3_multimodal.c:65) after it otherwise.
        raise SimError("prompt is not valid UTF-8")
    _open_weights(text_path)
    text_started = time.monotonic()
    progress.steps("text encoder", TEXT_LAYERS, _BASE_SECONDS["text encoder"])
    progress.profile("Qwen text encoder", "total", text_started)
    tokens = _conditioning_tokens(counter, prompt, p, ref2va, visuals, visual_of)
    return _Conditioning(key=key, tokens=tokens,
                         tagged=bool(visuals), video_elements=video_elements,
                         audio_elements=audio_elements,
                         conditioned=bool(visuals) or audio_elements != 0, media=found)
