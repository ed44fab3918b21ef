"""What to do about a failed job: one fix per cause, in the user's words, for every engine.
"""
from __future__ import annotations
import signal
from pathlib import Path

from ..errors import H3BridgeError
from ..fixes import Blank, Fix, changes, given, literal
from ..progress import ProgressEvent
from ..request import MIN_LAYERS, GenerationRequest
from .locate import FFMPEG_HINT


def out_of_memory_hint(request: GenerationRequest) -> Fix:
    """What to try after macOS killed the engine (SIGKILL is how it ends a process out of memory),
    leaving out what this request already does."""
    options = [] if request.ssd_streaming else ["{}"]
    groups = [] if request.ssd_streaming else [changes(ssd_streaming=True)]
    options += ["fewer frames", "a smaller canvas or render canvas"]
    if request.layers > MIN_LAYERS:
        options.append("fewer DiT layers ({})")
        groups.append(changes(layers=Blank("N")))
    from ..runnable import h3bridge_command
    return Fix(f"SIGKILL usually means macOS ran out of memory; check `{literal(h3bridge_command('plan'))}` (with "
               "this request's flags), then try " + ", ".join(options[:-1]) + " or " + options[-1], tuple(groups))


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


def shape_mismatch_hint(model_dir: Path | None) -> str | Fix:
    """The fix for h3's "weight NAME shape mismatch at dimension N" (h3_weights.c): upstream hard-codes
    the released shapes. On h3-sim's small fixture that is the whole story (the fixture upstream
    runs is `h3-sim-model --realistic`); on anything else the folder is not the official release."""
    from ..model.inventory import inspect_model
    from ..runnable import command, h3bridge_command
    try:
        small = model_dir is not None and inspect_model(model_dir).small_fixture
    except H3BridgeError:
        small = False
    if small:
        return Fix(literal(f"{model_dir} is h3-sim's small fixture model, which only h3-sim runs: for this h3 write "
                           f"the released shapes with `{command('h3-sim-model', '--realistic', 'DIR')}` (sparse "
                           "files, no disk used)") + " and give {}, with {} on a machine under ~32 GB; or give {}",
                   (changes(model_dir=Blank("DIR")), changes(ssd_streaming=True), changes(engine_path="h3-sim")))
    where = "DIR" if model_dir is None else model_dir
    return (f"h3 loads only the official MiniMax-H3 release's tensor shapes: check the folder with "
            f"`{h3bridge_command('info', '-d', where)}`, and download the official layout "
            f"(`{h3bridge_command('model', 'download', 'DIR')}`) if it is another checkpoint")


def failure_hint(request: GenerationRequest, message: str | None, *, signal_number: int | None = None,
                 stalled: bool = False, model_dir: Path | None = None) -> str | Fix | None:
    """The fix line for an engine that failed (`message`: h3's last error), died from
    `signal_number`, or was stopped by the watchdog (`stalled`). None leaves h3's message to
    speak for itself. `model_dir`: the engine's model folder, read only for a model error."""
    if stalled:
        return Fix("h3 reports nothing while it decodes the video (the tiled video VAE decode) and little while "
                   "it loads from a slow disk: for a very large clip raise {}; otherwise see the engine log for "
                   "where it stopped", (given("stall_timeout"),))
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
        # the setting to drop, said as the user set it (`--int8-row-fc2`, `int8_row_fc2=True`)
        return Fix("drop {} (M5 only) and try again", (changes(int8_row_fc2=True),))
    if "metal" in lowered:
        from ..runnable import h3bridge_command
        return (f"the GPU gave up on the work, most often for lack of memory: check `{h3bridge_command('plan')}`, close other "
                "GPU-heavy apps, and see the engine log")
    if "shape mismatch" in lowered:
        return shape_mismatch_hint(model_dir)
    if "safetensors" in lowered or "model" in lowered or "tokenizer" in lowered or "config.json" in lowered:
        from ..runnable import h3bridge_command
        return f"check the model directory: `{h3bridge_command('verify', '-d', model_dir if model_dir is not None else 'DIR')}`"
    return None
