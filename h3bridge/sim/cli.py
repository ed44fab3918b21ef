"""`h3-sim`: the command line of upstream main.c (h3.c at 8974cc0), driving the simulated engine.

Mirrors main.c: usage text (:15-64), parse_int / frames_from_seconds / parse_u64 (:66-104,
with macOS libc's EINVAL on an empty number), the 12-reference limit (:106-115), print_info
(:121-143), cli_progress (:156-172), cli_frame (:174-229) and main's order (:231-531): parse
(exit 2) -> missing -d (usage, 2) -> --seconds/--frames exclusion (2) -> --reuse warning ->
frames-dir mkdir (1) -> h3_load_dir (1) -> --info -> h3_generate (1 on failure) -> "h3: wrote".

Simulation-only environment: everything in engine.py / device.py, plus
  H3_SIM_LOG=path   append one JSON line per invocation: {"argv": [...], "cwd": "...", "pid": N, "time": T}
                    (T: the start, seconds since the epoch)
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import signal
import sys
import time

from . import terminal
from .device import DeviceConfigError
from .cli_state import CliState, terminal_protocol
from .engine import SimContext, SimError, generate
from .getopt import GetoptLong, LongOption
from .libc import strerror
from .params import (FPS, H3_VERSION, MAX_REFERENCES, ReferenceImageSize, ReferenceKind,
                     SimParams, SimReference)

USAGE = (
    "Usage: {0} -d MODEL_DIR [options]              # interactive\n"
    "       {0} -d MODEL_DIR -p PROMPT [-o OUTPUT] [options]\n"
    "       {0} -d MODEL_DIR --info\n\n"
    "Options:\n"
    "  -d, --model-dir PATH   MiniMax-H3 local directory\n"
    "  -p, --prompt TEXT      Raw H3 prompt\n"
    "  -o, --output PATH      Output MP4 (default: outputs/h3.mp4)\n"
    "      --width N          Output width (default: 864)\n"
    "      --height N         Output height (default: 480)\n"
    "      --render-width N   Lower internal model width (optional)\n"
    "      --render-height N  Lower internal model height (optional)\n"
    "      --frames N         Requested frames (default: 56)\n"
    "      --seconds N        Requested duration at 24 fps (instead of --frames)\n"
    "      --steps N          Denoising passes (default: 20)\n"
    "      --reuse N          Denoiser reuse: 1 close, 2 fast, 3 aggressive\n"
    "      --layers N         DiT blocks: 50 exact, 45 fast, 40 aggressive\n"
    "      --core-reuse N     Core refresh: 1 exact, 4 fast, 6 aggressive\n"
    "      --token-reduction  Pair video tokens in middle DiT blocks\n"
    "      --ssd-streaming    Stream original BF16 DiT layers from SSD\n"
    "      --use-int8-row-fc2 Faster one-scale int8 FC2 (M5)\n"
    "      --use-reference-rope  Disable native 256 RoPE adaptation\n"
    "      --use-slower-bf16-mlp  Force close-reference BF16/MPS MLP\n"
    "      --use-slower-bf16-qkv  Force close-reference BF16 QKV\n"
    "      --use-slower-bf16-attention-output  Force BF16 attention output\n"
    "      --use-slower-row-major-attention-output  Restore SDPA transpose\n"
    "      --use-slower-unfused-int8-inputs  Keep standalone quantizers\n"
    "      --use-slower-unfused-qkv-rope  Keep separate Q/K norm/RoPE\n"
    "      --use-slower-scalar-qkv-rms  Force scalar Q/K RMS loads\n"
    "      --use-slower-uncached-int8-scales  Reread projection scales\n"
    "      --use-slower-dynamic-fc1-k  Use runtime-bound FC1 K loop\n"
    "      --use-slower-grouped-quantizer  Force 256-thread FC2 quantizer\n"
    "      --seed N           Random seed (default: 42)\n"
    "      --first-frame PATH First-frame conditioning image\n"
    "      --last-frame PATH  Last-frame conditioning image\n"
    "      --ref-image PATH    Append an ordered Ref2VA image\n"
    "      --ref-image-size S  Image sizing: match (default) or max\n"
    "      --ref-video PATH    Append video, including embedded audio\n"
    "      --ref-silent-video PATH  Append video without its audio\n"
    "      --ref-video-audio VIDEO AUDIO  Append video + soundtrack\n"
    "      --ref-audio PATH    Append an ordered standalone audio clip\n"
    "      --frames-dir PATH  Write generated frames as PPM files\n"
    "      --show             Display a frame after every denoising step (M5)\n"
    "      --zoom N           Terminal image zoom (default: 2 for Retina)\n"
    "      --profile          Print per-phase Metal timing and allocation data\n"
    "      --info             Inspect model/device without mapping weights\n"
    "  -h, --help             Show this help\n"
)

_FLAG_SWITCHES = {  # no-argument long options that set an h3_params field to 1 (main.c:356-393)
    "token-reduction": "token_reduction", "ssd-streaming": "ssd_streaming",
    "use-int8-row-fc2": "use_int8_row_fc2", "use-reference-rope": "use_reference_rope",
    "use-slower-bf16-mlp": "use_slower_bf16_mlp", "use-slower-bf16-qkv": "use_slower_bf16_qkv",
    "use-slower-bf16-attention-output": "use_slower_bf16_attention_output",
    "use-slower-row-major-attention-output": "use_slower_row_major_attention_output",
    "use-slower-unfused-int8-inputs": "use_slower_unfused_int8_inputs",
    "use-slower-unfused-qkv-rope": "use_slower_unfused_qkv_rope",
    "use-slower-scalar-qkv-rms": "use_slower_scalar_qkv_rms",
    "use-slower-uncached-int8-scales": "use_slower_uncached_int8_scales",
    "use-slower-dynamic-fc1-k": "use_slower_dynamic_fc1_k",
    "use-slower-grouped-quantizer": "use_slower_grouped_quantizer",
}

# main.c:255-309, in upstream's order (the order decides ambiguity listings).
LONG_OPTIONS = (
    LongOption("model-dir", True, "d"), LongOption("prompt", True, "p"),
    LongOption("output", True, "o"), LongOption("width", True, "width"),
    LongOption("height", True, "height"), LongOption("render-width", True, "render-width"),
    LongOption("render-height", True, "render-height"), LongOption("frames", True, "frames"),
    LongOption("seconds", True, "seconds"), LongOption("steps", True, "steps"),
    LongOption("reuse", True, "reuse"), LongOption("layers", True, "layers"),
    LongOption("core-reuse", True, "core-reuse"),
    *(LongOption(name, False, name) for name in _FLAG_SWITCHES),
    LongOption("seed", True, "seed"), LongOption("first-frame", True, "first-frame"),
    LongOption("last-frame", True, "last-frame"), LongOption("ref-image", True, "ref-image"),
    LongOption("ref-image-size", True, "ref-image-size"), LongOption("ref-video", True, "ref-video"),
    LongOption("ref-silent-video", True, "ref-silent-video"),
    LongOption("ref-video-audio", True, "ref-video-audio"), LongOption("ref-audio", True, "ref-audio"),
    LongOption("frames-dir", True, "frames-dir"), LongOption("show", False, "show"),
    LongOption("zoom", True, "zoom"), LongOption("profile", False, "profile"),
    LongOption("info", False, "info"), LongOption("help", False, "h"),
)


class UsageExit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _fail(message: str, code: int) -> UsageExit:
    sys.stderr.write(f"h3: {message}\n")
    return UsageExit(code)


_C_SPACE = " \t\n\v\f\r"


def parse_int(value: str, label: str) -> int:
    """main.c parse_int: strtol base 10, whole string, 0..INT32_MAX, else exit 2."""
    match = re.fullmatch(rf"[{_C_SPACE}]*([+-]?[0-9]+)", value)
    parsed = int(match.group(1)) if match else -1   # no digits: macOS strtol sets EINVAL
    if not match or not (-(1 << 63) <= parsed < (1 << 63)) or parsed < 0 or parsed > 2**31 - 1:
        raise _fail(f"invalid {label}: {value}", 2)
    return parsed


def parse_u64(value: str, label: str) -> int:
    """main.c parse_u64: strtoull base 10 (a leading '-' negates modulo 2^64), else exit 2."""
    match = re.fullmatch(rf"[{_C_SPACE}]*([+-]?)([0-9]+)", value)
    if not match or int(match.group(2)) >= 1 << 64:
        raise _fail(f"invalid {label}: {value}", 2)
    magnitude = int(match.group(2))
    return (-magnitude) % (1 << 64) if match.group(1) == "-" else magnitude


_STRTOD = re.compile(
    rf"[{_C_SPACE}]*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
    r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?|[nN][aA][nN](?:\([0-9A-Za-z_]*\))?)")


def frames_from_seconds(value: str) -> int:
    """main.c frames_from_seconds: strtod, finite, > 0, llround(s * 24) in 1..INT32_MAX."""
    from .params import c_llround
    if not _STRTOD.fullmatch(value):
        raise _fail(f"invalid seconds: {value}", 2)
    text = value.strip(_C_SPACE)
    body = text.lstrip("+-")
    try:
        if body[:2].lower() == "0x":
            seconds = float.fromhex(text)
        elif body[:1].lower() == "n":
            seconds = math.nan
        else:
            seconds = float(text)
    except (ValueError, OverflowError):
        seconds = math.inf     # strtod overflow: HUGE_VAL with ERANGE
    frames = seconds * FPS
    if not math.isfinite(seconds) or seconds <= 0.0 or not math.isfinite(frames) \
            or frames > 2**31 - 1:
        raise _fail(f"invalid seconds: {value}", 2)
    rounded = c_llround(frames)
    if rounded < 1 or rounded > 2**31 - 1:
        raise _fail(f"invalid seconds: {value}", 2)
    return rounded


def _gib(value: int) -> float:
    return value / (1024.0 ** 3)


def print_info(ctx: SimContext) -> None:
    """main.c print_info (:126-143), to stdout."""
    device, model = ctx.device, ctx.model
    out = sys.stdout
    out.write(f"h3-metal {H3_VERSION}\n")
    out.write(f"Device: {device.name} ({device.architecture})\n")
    out.write(f"  physical memory       {_gib(device.physical_memory):.1f} GiB\n")
    out.write(f"  recommended GPU set   {_gib(device.recommended_working_set):.1f} GiB\n")
    out.write(f"  max Metal buffer      {_gib(device.max_buffer_length):.1f} GiB\n")
    out.write(f"  Apple GPU family      {device.apple_gpu_family}\n")
    out.write(f"  Metal 4               {'yes' if device.metal4 else 'no'}\n")
    out.write(f"  unified memory        {'yes' if device.unified_memory else 'no'}\n")
    out.write("Native checkpoint inventory (header-only):\n")
    for label, item in (("Qwen3-VL encoder", model.text_encoder),
                        ("FL2VA DiT", model.fl2va_transformer),
                        ("Ref2VA DiT", model.ref2va_transformer),
                        ("video VAE", model.video_vae), ("audio VAE", model.audio_vae)):
        out.write(f"  {label:<18} {item.files:2d} files  {item.tensors:4d} tensors  "
                  f"{_gib(item.tensor_bytes):7.3f} GiB\n")
    # No fflush in main.c: over a pipe these lines reach the reader at exit, after stderr.


def _log_invocation(argv: list[str]) -> None:
    path = os.environ.get("H3_SIM_LOG")
    if not path:
        return
    line = json.dumps({"argv": argv, "cwd": os.getcwd(), "pid": os.getpid(), "time": time.time()}) + "\n"
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode("utf-8", "surrogateescape"))
    finally:
        os.close(descriptor)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `h3-sim` console script; returns the exit status."""
    if argv is None:
        # As a program, die on SIGINT and SIGPIPE like a C program does (callers stop engines
        # with signals; `h3 --info | head -1` ends h3 by SIGPIPE).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = list(sys.argv if argv is None else argv)
    # C passes argv bytes through untouched (a path that is not UTF-8 comes back verbatim in
    # "h3: FFmpeg could not decode image ..."); Python's stderr would print "\udce9" instead.
    # (Only as a program: in-process callers own their streams.)
    for stream in (sys.stdout, sys.stderr) if argv is None else ():
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="surrogateescape")
    _log_invocation(args)
    if argv is None:
        # C stdio: stdout line-buffered on a TTY, fully buffered otherwise, whatever
        # PYTHONUNBUFFERED says; exit() flushes it (Python's shutdown does the same here).
        from .libc import c_stdio_stdout
        c_stdio_stdout()
    try:
        return _run(args)
    except UsageExit as stop:
        return stop.code
    finally:
        sys.stderr.flush()


def _run(argv: list[str]) -> int:
    program = argv[0] if argv else "h3"
    model_dir: str | None = None
    prompt: str | None = None
    output = "outputs/h3.mp4"
    params = SimParams()
    references: list[SimReference] = []
    cli = CliState()
    show = profile = info = False
    frames_given = seconds_given = seed_given = False

    def usage() -> None:
        sys.stderr.write(USAGE.format(program))

    def append(reference: SimReference) -> None:
        if len(references) >= MAX_REFERENCES:
            raise _fail("Ref2VA supports at most 12 references", 2)
        references.append(reference)

    parser = GetoptLong(argv, "d:p:o:h", LONG_OPTIONS)
    while (option := parser.next()) is not None:
        value = parser.optarg or ""
        if option == "d":
            model_dir = value
        elif option == "p":
            prompt = value
        elif option == "o":
            output = value
        elif option == "h":
            usage()
            return 0
        elif option in ("width", "height", "steps", "reuse", "layers"):
            field_name = {"reuse": "denoise_reuse", "layers": "dit_layers"}.get(option, option)
            setattr(params, field_name, parse_int(value, option))
        elif option == "render-width":
            params.render_width = parse_int(value, "render width")
        elif option == "render-height":
            params.render_height = parse_int(value, "render height")
        elif option == "frames":
            params.frames = parse_int(value, "frames")
            frames_given = True
        elif option == "seconds":
            params.frames = frames_from_seconds(value)
            seconds_given = True
        elif option == "core-reuse":
            params.core_reuse = parse_int(value, "core reuse")
        elif option in _FLAG_SWITCHES:
            setattr(params, _FLAG_SWITCHES[option], 1)
        elif option == "seed":
            params.seed = parse_u64(value, "seed")
            seed_given = True
        elif option == "first-frame":
            params.first_frame = value
        elif option == "last-frame":
            params.last_frame = value
        elif option == "ref-image":
            append(SimReference(ReferenceKind.IMAGE, value))
        elif option == "ref-image-size":
            if value == "match":
                params.reference_image_size = ReferenceImageSize.MATCH
            elif value == "max":
                params.reference_image_size = ReferenceImageSize.MAX
            else:
                raise _fail("--ref-image-size must be match or max", 2)
        elif option == "ref-video":
            append(SimReference(ReferenceKind.VIDEO, value, include_embedded_audio=True))
        elif option == "ref-silent-video":
            append(SimReference(ReferenceKind.VIDEO, value, include_embedded_audio=False))
        elif option == "ref-video-audio":
            # main.c:434-445 takes the AUDIO operand straight from argv[optind].
            if parser.optind >= len(argv):
                raise _fail("--ref-video-audio requires VIDEO and AUDIO", 2)
            append(SimReference(ReferenceKind.VIDEO_AUDIO, value, argv[parser.optind]))
            parser.optind += 1
        elif option == "ref-audio":
            append(SimReference(ReferenceKind.AUDIO, value))
        elif option == "frames-dir":
            cli.frames_dir = value
        elif option == "show":
            show = True
        elif option == "zoom":
            if not terminal.set_zoom(parse_int(value, "zoom")):
                raise _fail("--zoom must be at least 1", 2)
        elif option == "profile":
            profile = True
        elif option == "info":
            info = True
        else:
            usage()
            return 2
    if model_dir is None:
        usage()
        return 2
    if frames_given and seconds_given:
        raise _fail("--seconds and --frames are mutually exclusive", 2)
    if prompt is not None and 2 <= params.steps <= 7 and params.denoise_reuse > 1:
        sys.stderr.write(f"h3: warning: --reuse with only {params.steps} denoising steps leaves "
                         "very few fresh model evaluations\n")
    params.references = references
    if cli.frames_dir is not None:
        try:
            os.mkdir(cli.frames_dir, 0o755)
        except OSError as error:
            if error.errno != errno.EEXIST:
                raise _fail(f"cannot create frames directory {cli.frames_dir}: "
                            f"{strerror(error.errno or 0)}", 1) from None
    if profile:
        os.environ["H3_PROFILE"] = "1"
    try:
        ctx = SimContext.load_dir(model_dir)
    except SimError as error:
        raise _fail(error.message, 1) from None
    except DeviceConfigError as error:
        raise _fail(str(error), 1) from None
    if info:
        print_info(ctx)
    if prompt is not None:
        params.output_path = output
        on_frame = cli.frame if cli.frames_dir is not None else None
        if show:
            cli.terminal = terminal_protocol()
            if cli.terminal is None:
                sys.stderr.write("h3: warning: --show needs Kitty, Ghostty, iTerm2, WezTerm, "
                                 "or Konsole\n")
            else:
                sys.stderr.write(f"h3: graphical output uses {cli.terminal}\n")
                on_frame = cli.frame
                params.preview_denoise = 1
        try:
            generate(ctx, prompt, params, on_progress=cli.progress, on_frame=on_frame)
        except SimError as error:
            if cli.active:
                sys.stderr.write("\n")
            raise _fail(error.message, 1) from None
        if output:
            sys.stderr.write(f"h3: wrote {output}\n")
        if cli.frames_dir is not None:
            sys.stderr.write(f"h3: wrote frames to {cli.frames_dir}\n")
        return 0
    if not info:
        try:
            from . import interactive
        except ImportError:
            raise _fail("interactive mode is not available in this h3-sim build", 1) from None
        return int(interactive.run(ctx, model_dir, params, show, seed_given))
    return 0


if __name__ == "__main__":
    sys.exit(main())
