"""The `h3bridge` command line.

Each subcommand is one `add_*_command(subparsers)` function registered in
SUBCOMMANDS; it sets `handler=` (a function taking the parsed args and returning
an exit status). Add a subcommand by writing such a function and appending it.

Exit status: 0 ok, 1 failure (message and fix on stderr), 2 bad arguments or a request
refused before anything ran (including an output that already exists), 130 cancelled
(Ctrl-C), 143 terminated (SIGTERM), 129 hung up (SIGHUP).
"""
from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..cancel import CancelToken
from .engine import (    # shared with story.py and serve.py
    EXIT_CANCELLED,
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    FLAG_FOR_FIELD,
    PhaseProgressBars,
    run_with_signals,
    add_engine_options,
    add_engine_run_options,
    cancel_on_signals,
    cancelled_status,
    cli_hint,
    cli_message,
    cli_word,
    cli_words,
    engine_from_args,
    add_model_dir_argument,
    machine_facts_of,
    model_dir_from_args,
    model_folder,
    preview_writer_from_args,
)
from ..engines.fallback import choose_engine
from ..errors import GenerationCancelled, H3BridgeError
from ..fixes import Fix, said

if TYPE_CHECKING:
    from ..model.memory import MemoryPlan
# Number flags go through safeio.numbers (bounded digits, finite); the ranges are the request's own rules.
from .flags import float_flag, int_flag, int_list_flag
from ..runnable import h3bridge_command
from ..request import (
    DEFAULT_HEIGHT,
    DEFAULT_SEED,
    DEFAULT_STEPS,
    DEFAULT_WIDTH,
    MAX_LAYERS,
    PRESETS,
    GenerationRequest,
    Reference,
    ReferenceImageSize,
    ReferenceKind,
    SlowerPath,
)

EXIT_STATUS_HELP = ("exit status: 0 ok, 1 failed, 2 bad arguments or refused before anything ran, "
                    "130 cancelled (Ctrl-C), 143 terminated (SIGTERM), 129 hung up (SIGHUP)")
DEFAULT_OUTPUT = "outputs/h3.mp4"   # main.c: `-o` default, relative to the working directory


# ----------------------------------------------------------------------------- request options
# (the engine options, engines, signals and progress display shared with `story` and `serve`
# are in engine.py)

class _AppendReference(argparse.Action):
    """Keeps every --ref-* flag in one ordered list: upstream references are ordered."""

    def __init__(self, option_strings: Sequence[str], dest: str, kind: ReferenceKind, **kwargs: object) -> None:
        self.kind = kind
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        references = list(getattr(namespace, self.dest, None) or [])
        if self.kind is ReferenceKind.VIDEO_AUDIO:
            video, audio = values
            references.append(Reference(self.kind, Path(video), Path(audio)))
        else:
            references.append(Reference(self.kind, Path(values)))
        setattr(namespace, self.dest, references)


class _RenamedFlag(argparse.Action):
    """An old spelling of a flag: sets what the current one sets (a list value extends) and says,
    once per run, what the flag is called now."""

    def __init__(self, option_strings: Sequence[str], dest: str, value: object, current: str,
                 **kwargs: object) -> None:
        self.value, self.current = value, current
        super().__init__(option_strings, dest, nargs=0, help=argparse.SUPPRESS, **kwargs)  # type: ignore[arg-type]

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        print(f"h3bridge: notice: {option_string} is now {self.current} (the old spelling still works for now)",
              file=sys.stderr)
        if isinstance(self.value, list):
            setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), *self.value])
        else:
            setattr(namespace, self.dest, self.value)


def _seed_or_seeds(max_items: int) -> Callable[[str], int | tuple[int, ...]]:
    """generate's --seed: one seed (an int, as every other command's --seed) or one per take (a tuple)."""
    numbers = int_list_flag(max_items=max_items)

    def seed_flag(text: str) -> int | tuple[int, ...]:
        values = numbers(text)
        return values[0] if len(values) == 1 else values
    seed_flag.__name__ = numbers.__name__
    seed_flag.reads_number = True      # type: ignore[attr-defined]  (the conformance walk's marker)
    return seed_flag


def add_request_options(parser: argparse.ArgumentParser, *, seed_list: bool = False) -> None:
    """Every GenerationRequest field as an h3-named flag (main.c option table); `seed_list`: --seed
    also takes one seed per take (`--seed 3,9,12`, generate's takes)."""
    group = parser.add_argument_group("clip")
    group.add_argument("-p", "--prompt", required=True, help="the H3 prompt")
    group.add_argument("--preset", choices=sorted(PRESETS),
                       help="steps/layers/reuse bundle: " + ", ".join(
                           f"{name} ({p.steps} steps, {p.layers} layers, reuse {p.reuse})"
                           for name, p in PRESETS.items()) + "; explicit flags win")
    group.add_argument("--width", type=int_flag(), default=DEFAULT_WIDTH, help=f"output width (default {DEFAULT_WIDTH})")
    group.add_argument("--height", type=int_flag(), default=DEFAULT_HEIGHT,
                       help=f"output height (default {DEFAULT_HEIGHT})")
    group.add_argument("--render-width", type=int_flag(), help="lower internal model width (with --render-height)")
    group.add_argument("--render-height", type=int_flag(), help="lower internal model height (with --render-width)")
    length = group.add_mutually_exclusive_group()
    length.add_argument("--frames", type=int_flag(), help="frames: 22, 39, 56, ... 362 (5 + 17n; default 56)")
    length.add_argument("--seconds", type=float_flag(), help="duration at 24 fps, rounded up to a legal length")
    if seed_list:
        from ..takes import MAX_TAKES
        group.add_argument("--seed", type=_seed_or_seeds(MAX_TAKES), default=DEFAULT_SEED,
                           help=f"random seed (default {DEFAULT_SEED}); with --takes N the takes use this seed and "
                                "the ones above it, or give one seed per take: --seed 3,9,12")
    else:
        group.add_argument("--seed", type=int_flag(), default=DEFAULT_SEED, help=f"random seed (default {DEFAULT_SEED})")
    quality = parser.add_argument_group("speed and quality")
    quality.add_argument("--steps", type=int_flag(), help=f"denoising passes 2..1000 (default {DEFAULT_STEPS})")
    quality.add_argument("--reuse", type=int_flag(), help="denoiser reuse: 1 close, 2 fast, 3 aggressive")
    quality.add_argument("--layers", type=int_flag(), help=f"DiT blocks 35..{MAX_LAYERS}: 50 exact, 45 fast, 40 aggressive")
    quality.add_argument("--core-reuse", type=int_flag(), help="core refresh 1..6: 1 exact, 4 fast, 6 aggressive")
    quality.add_argument("--token-reduction", action="store_true", help="pair video tokens in middle DiT blocks")
    quality.add_argument("--ssd-streaming", action="store_true",
                         help="stream BF16 DiT layers from SSD (24-32 GB Macs)")
    # Named as the request's fields (vocabulary.py), as storyboards, the server and the nodes name them.
    quality.add_argument("--int8-row-fc2", action="store_true", help="faster one-scale int8 FC2 (M5)")
    quality.add_argument("--reference-rope", action="store_true", help="disable native 256 RoPE adaptation")
    quality.add_argument("--slower-paths", nargs="+", action="extend", metavar="NAME",
                         choices=[slower.value for slower in SlowerPath],
                         help="force upstream's slower close-reference paths: "
                              + ", ".join(slower.value for slower in SlowerPath))
    # h3's own spellings, which h3bridge used before: still accepted, with a notice
    quality.add_argument("--use-int8-row-fc2", dest="int8_row_fc2", action=_RenamedFlag, value=True,
                         current="--int8-row-fc2")
    quality.add_argument("--use-reference-rope", dest="reference_rope", action=_RenamedFlag, value=True,
                         current="--reference-rope")
    for slower in SlowerPath:
        quality.add_argument(f"--use-slower-{slower.value}", dest="slower_paths", action=_RenamedFlag,
                             value=[slower.value], current=f"--slower-paths {slower.value}")
    media = parser.add_argument_group("conditioning (anchors XOR ordered references)")
    media.add_argument("--first-frame", type=Path, metavar="PATH", help="first-frame image (FL2VA)")
    media.add_argument("--last-frame", type=Path, metavar="PATH", help="last-frame image (FL2VA)")
    for flag, kind, help_text in (
            ("--ref-image", ReferenceKind.IMAGE, "append a reference image"),
            ("--ref-video", ReferenceKind.VIDEO, "append a reference video with its soundtrack"),
            ("--ref-silent-video", ReferenceKind.SILENT_VIDEO, "append a reference video without audio"),
            ("--ref-audio", ReferenceKind.AUDIO, "append a reference audio clip (2-15 s)")):
        media.add_argument(flag, dest="references", action=_AppendReference, kind=kind, metavar="PATH",
                           help=help_text)
    media.add_argument("--ref-video-audio", dest="references", action=_AppendReference,
                       kind=ReferenceKind.VIDEO_AUDIO, nargs=2, metavar=("VIDEO", "AUDIO"),
                       help="append a reference video with a separate soundtrack")
    media.add_argument("--ref-image-size", choices=[s.value for s in ReferenceImageSize],
                       default=ReferenceImageSize.MATCH.value, help="reference image sizing (default match)")


def request_from_args(args: argparse.Namespace) -> GenerationRequest:
    """Build the GenerationRequest the flags describe (preset first, explicit flags win)."""
    fields: dict[str, object] = dict(
        width=args.width, height=args.height, render_width=args.render_width, render_height=args.render_height,
        frames=args.frames, seconds=args.seconds, token_reduction=args.token_reduction,
        # generate's --seed may list one seed per take: the request is the first take's
        seed=args.seed[0] if isinstance(args.seed, tuple) else args.seed,
        ssd_streaming=args.ssd_streaming, int8_row_fc2=args.int8_row_fc2,
        reference_rope=args.reference_rope, first_frame=args.first_frame, last_frame=args.last_frame,
        references=tuple(args.references or ()), reference_image_size=ReferenceImageSize(args.ref_image_size),
        slower_paths=frozenset(SlowerPath(name) for name in args.slower_paths or ()))
    for name in ("steps", "reuse", "layers", "core_reuse"):
        value = getattr(args, name)
        if value is not None:
            fields[name] = value
    if args.preset:
        return GenerationRequest.from_preset(args.preset, args.prompt, **fields)
    return GenerationRequest(prompt=args.prompt, **fields)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- generate

def add_generate_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="render one clip (MP4 with audio)",
                                   description="Render one MiniMax-H3 clip through the h3 engine.")
    add_request_options(parser, seed_list=True)
    from ..takes import MAX_PARALLEL_TAKES, MAX_TAKES
    takes = parser.add_argument_group("takes (one request, several seeds)")
    takes.add_argument("--takes", type=int_flag(1, MAX_TAKES), metavar="N",
                       help=f"render N takes (1-{MAX_TAKES}) with seeds from --seed upward (or the seeds --seed "
                            "lists): -o clip.mp4 writes clip.take1.mp4 ... clip.takeN.mp4 and the contact sheet "
                            "clip.takes.png; a warm engine (--engine session or library) loads the model once")
    takes.add_argument("--parallel", type=int_flag(), default=1, metavar="N",
                       help=f"with --remote and --takes: render up to N takes at once as server jobs "
                            f"(1-{MAX_PARALLEL_TAKES}; default 1), spread over a fleet behind a proxy")
    output = parser.add_argument_group("output")
    output.add_argument("-o", "--output", default=DEFAULT_OUTPUT,
                        help=f"output MP4 (default {DEFAULT_OUTPUT}; '' writes no MP4)")
    output.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    output.add_argument("--read-frames", action="store_true",
                        help="also read every frame back into memory (its shape appears in --json); the MP4 "
                             "is the result, so this is off by default")
    output.add_argument("--no-frames", action="store_true", help=argparse.SUPPRESS)   # the default; kept for scripts
    output.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    output.add_argument("--quiet", action="store_true", help="no progress bars")
    add_engine_run_options(parser)
    parser.set_defaults(handler=run_generate)


def result_summary(result, *, wall: float | None = None, waited: float = 0.0) -> dict[str, object]:
    """The machine-readable part of a GenerationResult (for --json); `wall`: the seconds the
    whole job took here, waiting for the engine (`waited`) included."""
    return {
        "video_path": None if result.video_path is None else str(result.video_path),
        "width": result.width, "height": result.height, "frame_count": result.frame_count,
        "fps": result.fps, "seed": result.seed, "sample_rate": result.sample_rate,
        "frames_shape": None if result.frames is None else list(result.frames.shape),
        "audio_shape": None if result.audio is None else list(result.audio.shape),
        "clip_seconds": clip_seconds(result),
        "wall_seconds": result.timings.get("total") if wall is None else wall, "waited_seconds": waited,
        "timings": result.timings, "command": result.command, "engine_variables": result.engine_variables,
    }


def clip_seconds(result) -> float:
    """The clip's length when played (frames at its frame rate), not the time it took to make."""
    return result.frame_count / result.fps if result.fps else 0.0


def summary_line(result, *, wall: float | None = None, waited: float = 0.0) -> str:
    """The one line `generate` ends with: where the clip is, its size and length when played,
    and the wall-clock time the job took (`wall`, waiting for the engine included, and said)."""
    where = result.video_path if result.video_path is not None else "(no MP4 kept)"
    wall = result.timings.get("total", 0.0) if wall is None else wall
    return (f"wrote {where}: {result.width}x{result.height}, {result.frame_count} frames "
            f"({clip_seconds(result):.1f} s clip at {result.fps:g} fps), seed {result.seed}; "
            f"rendered in {wall:.1f} s wall time"
            + (f" ({waited:.1f} s of it waiting for the engine)" if waited >= 0.05 else ""))


def preflight_or_status(args: argparse.Namespace, request: GenerationRequest, engine, previews,
                        cancel: CancelToken) -> int | None:
    """generate's checks before an engine starts (one clip or its takes): the model and the memory
    plan for the engine that will run it (none for a server: it checks its own model). None to go
    on; the exit status when a SIGTERM or Ctrl-C stopped the check (the engine is closed then)."""
    planned = choose_engine(engine, request).engine      # the engine that will run it: planned for
    model_dir = getattr(engine, "model_dir", None)
    with cancel_on_signals(cancel) as received:     # a SIGTERM while the library's facts load stops its worker too
        if model_dir is not None:
            try:       # the model check first, then the library's facts (its worker opens the model)
                preflight_generate(request, model_dir, force=getattr(args, "force", False), quiet=args.quiet,
                                   session=planned.capabilities.warm_model,
                                   machine=lambda: machine_facts_of(engine, cancel), preview=previews is not None)
            except GenerationCancelled as error:
                engine.close()
                return cancelled_status(error, received)
    return None


def run_generate(args: argparse.Namespace) -> int:
    if args.takes is not None or isinstance(args.seed, tuple) or args.parallel != 1:
        return run_takes(args)
    request = request_from_args(args).validate()
    previews = preview_writer_from_args(args)      # --preview-dir: checked before anything starts
    engine = engine_from_args(args)
    cancel = CancelToken()
    refused = preflight_or_status(args, request, engine, previews, cancel)
    if refused is not None:
        return refused
    bars = PhaseProgressBars(enabled=not args.quiet, note=previews.note if previews is not None else None)
    options = dict(overwrite=args.overwrite, want_frames=args.read_frames and not args.no_frames, want_audio=True,
                   on_progress=bars, on_preview=previews, cancel=cancel)
    # a session hands what it cannot take to one-shot, saying so (engine.say_running_one_shot)
    run = run_with_signals(engine, bars, cancel, lambda pause: engine.generate(
        request, args.output or None, pause=pause, **options))  # type: ignore[arg-type]
    if run.status is not None:
        return run.status
    result, wall = run.outcome, run.wall_seconds
    if args.json:
        print(json.dumps(result_summary(result, wall=wall, waited=bars.waited), indent=2))
    else:
        try:
            print(summary_line(result, wall=wall, waited=bars.waited), file=sys.stderr)
        except OSError:
            pass      # nobody reads stderr any more; the clip is there all the same
    return EXIT_OK


def run_takes(args: argparse.Namespace) -> int:
    """`generate --takes N` (or --seed A,B,C): N clips named from -o and their contact sheet, on one engine."""
    from ..errors import RequestError
    from ..takes import MAX_PARALLEL_TAKES, generate_takes, seeds_for, sheet_output, take_output
    seeds = list(args.seed) if isinstance(args.seed, tuple) else [args.seed]
    takes = args.takes if args.takes is not None else len(seeds)
    listed = seeds if len(seeds) > 1 else None
    if listed is not None and takes != len(listed):
        raise RequestError(f"--takes {takes} but --seed lists {len(listed)} seeds ({','.join(map(str, listed))})",
                           field="takes", hint=f"give {takes} seeds to --seed, or --takes {len(listed)} (or drop "
                                               "--takes: one take per listed seed)")
    if not 1 <= args.parallel <= MAX_PARALLEL_TAKES:
        raise RequestError(f"--parallel {args.parallel}: takes rendered at once must be from 1 to {MAX_PARALLEL_TAKES}",
                           field="parallel", hint=f"give --parallel a number from 1 to {MAX_PARALLEL_TAKES}, or "
                                                  "drop it to render take after take")
    if args.parallel > 1 and not getattr(args, "remote", None):
        raise RequestError(f"--parallel {args.parallel} needs --remote URL: this machine's engine renders one clip "
                           "at a time (a warm one, --engine session, renders take after take with the model "
                           "loaded once)", field="parallel",
                           hint="add --remote URL (an `h3bridge serve`, or a proxy in front of several), or drop --parallel")
    if not args.output:
        raise RequestError("--takes writes one clip per take, named from -o, and there is no -o",
                           field="output", hint="give -o PATH.mp4 (take 1 is written as PATH.take1.mp4)")
    request = request_from_args(args).validate()
    chosen = seeds_for(request, takes, listed)
    from ..takes import check_take_outputs
    check_take_outputs(args.output, len(chosen), overwrite=args.overwrite)     # before any engine starts
    previews = preview_writer_from_args(args)
    engine = engine_from_args(args)
    cancel = CancelToken()
    refused = preflight_or_status(args, request, engine, previews, cancel)
    if refused is not None:
        return refused
    bars = PhaseProgressBars(enabled=not args.quiet, note=previews.note if previews is not None else None)

    def starting(take: int, seed: int) -> None:
        if args.quiet:
            return
        bars.close()
        try:
            print(f"h3bridge: take {take}/{len(chosen)} (seed {seed}) -> {take_output(args.output, take)}",
                  file=sys.stderr, flush=True)
        except OSError:
            pass

    run = run_with_signals(engine, bars, cancel, lambda pause: generate_takes(
        engine, request, args.output, seeds=chosen, overwrite=args.overwrite,
        want_frames=args.read_frames and not args.no_frames, want_audio=True, on_progress=bars,
        on_preview=previews, on_take=starting, cancel=cancel, parallel=args.parallel, pause=pause))
    if run.status is not None:
        return run.status
    result, wall = run.outcome, run.wall_seconds
    if args.json:
        print(json.dumps({"takes": [{"take": number, **result_summary(take)}
                                    for number, take in enumerate(result.takes, 1)],
                          "seeds": result.seeds, "contact_sheet": str(result.contact_sheet),
                          "wall_seconds": wall, "waited_seconds": bars.waited}, indent=2))
    else:
        try:
            for number, take in enumerate(result.takes, 1):
                print(f"h3bridge: take {number}: {take.video_path} (seed {take.seed})", file=sys.stderr)
            print(f"wrote {len(result.takes)} takes and the contact sheet {sheet_output(args.output)}: "
                  f"{request.width}x{request.height}, {request.frame_count} frames each; rendered in {wall:.1f} s "
                  "wall time", file=sys.stderr)
        except OSError:
            pass
    return EXIT_OK


# ----------------------------------------------------------------------------- demo

DEMO_PROMPT = "A red fox runs through snow at dawn"
DEMO_NAME = "h3bridge-demo"
SYNTHETIC_NOTE = "synthetic test patterns from h3-sim, not model output"


def add_demo_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="render a clip end to end with the bundled simulator (synthetic; no Mac, h3 or model needed)",
        description="Render one clip through `generate` with h3-sim, the simulator of the h3 command line that "
                    "ships with h3bridge, and a tiny fixture model it writes into h3bridge's cache folder. "
                    f"The clip holds {SYNTHETIC_NOTE}. Nothing is overwritten: the default name is "
                    f"{DEMO_NAME}.mp4 in the current folder, numbered ({DEMO_NAME}-2.mp4, ...) when taken.")
    parser.add_argument("-p", "--prompt", default=DEMO_PROMPT, help=f"the prompt (default {DEMO_PROMPT!r})")
    parser.add_argument("-o", "--output", metavar="PATH",
                        help=f"output MP4, or a folder to put a new {DEMO_NAME}*.mp4 in "
                             f"(default: a new {DEMO_NAME}*.mp4 in the current folder)")
    parser.add_argument("--overwrite", action="store_true", help="replace the -o file if it exists")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.set_defaults(handler=run_demo)


def bundled_simulator() -> Path:
    """The h3-sim program installed with this h3bridge: beside the interpreter's own scripts
    (a venv's bin/, even when it is not activated), then the user scheme's, then PATH."""
    import shutil
    import sysconfig

    from ..errors import EngineNotFoundError
    folders = [sysconfig.get_path("scripts")]
    try:
        folders.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    for folder in folders:
        candidate = Path(folder) / "h3-sim"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("h3-sim")
    if found:
        return Path(found)
    raise EngineNotFoundError("h3-sim, the simulator installed with h3bridge, was not found",
                              hint="reinstall h3bridge (pip install -e .), which installs the h3-sim program")


def demo_output(output: str | None) -> Path:
    """-o as given when it names a file; otherwise the first free DEMO_NAME[-n].mp4 in -o's folder or
    the current one (the engine still publishes without replacing, should another demo take it)."""
    folder = Path(output) if output is not None else Path.cwd()
    if output is not None and not (folder.is_dir() or output.endswith(os.sep)):
        return folder
    number = 1
    while True:
        candidate = folder / (f"{DEMO_NAME}.mp4" if number == 1 else f"{DEMO_NAME}-{number}.mp4")
        if not os.path.lexists(candidate):
            return candidate
        number += 1


def run_demo(args: argparse.Namespace) -> int:
    # The demo is the one place the bridge runs the simulator on purpose: it imports the fixture
    # writer to make its model, and runs h3-sim as the engine through the very `generate` path a
    # real h3 takes.
    from ..engines.output import resolve_output
    from ..sim.fixture import cached_fixture_model
    from ..userdirs import cache_dir
    output = demo_output(args.output)
    resolve_output(output, overwrite=args.overwrite)     # a FIFO, device, folder or link: refused before any work
    engine = bundled_simulator()
    model = cached_fixture_model(cache_dir() / "demo-model")
    print(f"h3bridge demo: {SYNTHETIC_NOTE} (engine {engine}, fixture model {model})", file=sys.stderr)
    # `--flag=value`: a prompt or a path that starts with "-" stays a value
    generate = build_parser().parse_args(
        ["generate", f"--prompt={args.prompt}", f"--engine-path={engine}", f"--model-dir={model}",
         f"--output={output}"]
        + ["--overwrite"] * args.overwrite + ["--quiet"] * args.quiet + ["--json"] * args.json)
    status = run_generate(generate)
    if status == EXIT_OK:
        print(f"h3bridge demo: {output} holds {SYNTHETIC_NOTE}", file=sys.stderr)
    return status


# ----------------------------------------------------------------------------- doctor

def add_doctor_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help="check the engine, FFmpeg, model and memory",
                                   description="Say what h3bridge can find on this machine and what is missing.")
    add_engine_options(parser)
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.set_defaults(handler=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    import psutil

    from ..engines.locate import engine_working_directory, locate_engine, locate_media_tools, locate_model_dir
    from ..model.inventory import inspect_model, small_fixture_note
    from ..runnable import command

    checks: list[dict[str, object]] = []

    def record(name: str, ok: bool, detail: "str | Fix", fix: "str | Fix | None" = None) -> None:
        # a finding that names settings carries them as data (h3bridge.fixes); on the command line,
        # text and JSON alike, they are said as flags (--engine-path)
        checks.append({"check": name, "ok": ok, "detail": said(detail, cli_words),
                       "fix": None if ok or fix is None else said(fix, cli_words)})

    def record_error(name: str, error: H3BridgeError) -> None:
        checks.append({"check": name, "ok": False, "detail": cli_message(error), "fix": cli_hint(error)})

    engine_path = None
    try:
        engine_path = locate_engine(args.engine_path)
        shaders = engine_working_directory(engine_path) / "h3_shaders.metal"
        # The real h3 compiles this file at run time from its own directory; simulators need none.
        note = "" if shaders.is_file() else f" (no h3_shaders.metal in {shaders.parent}: the real h3 needs it there)"
        record("engine", True, f"{engine_path}{note}")
        record(*engine_commit_check(engine_path))
    except H3BridgeError as error:
        record_error("engine", error)
    tools = locate_media_tools()
    from ..engines.locate import FFMPEG_HINT
    for name, path in (("ffmpeg", tools.ffmpeg), ("ffprobe", tools.ffprobe)):
        record(name, path is not None, str(path) if path else f"{name} not found", FFMPEG_HINT)
    try:
        model_dir = locate_model_dir(args.model_dir)
        # The same header-only inventory that `h3bridge info` and the generate pre-flight use.
        inventory = inspect_model(model_dir)
        errors = inventory.errors
        # h3-sim's small fixture passes every header check, yet only h3-sim runs it: say so, and with
        # another engine (upstream's build, the Metal h3) it is not a model that engine can use.
        fixture_only = inventory.small_fixture and not errors
        sim_engine = engine_path is not None and is_simulator(engine_path)
        record("model", not errors and (not fixture_only or sim_engine or engine_path is None),
               f"{inventory.root}" + (f" ({'; '.join(p.message for p in errors)})" if errors else
                                      f" (FL2VA{' + Ref2VA' if inventory.has_ref2va else ', no Ref2VA: references unavailable'})")
               + (f"; {small_fixture_note().say(cli_words)}" if fixture_only else ""),
               "; ".join(dict.fromkeys(said(p.fix, cli_words) or "" for p in errors)) or
               (f"for {engine_path}, write the released shapes: "
                f"`{command('h3-sim-model', '--realistic', 'DIR')}`, then give DIR as --model-dir"
                if fixture_only else None))
    except H3BridgeError as error:
        record_error("model", error)
        model_dir = None
    memory = psutil.virtual_memory()
    gib = memory.total / 2**30
    record("memory", True, f"{gib:.1f} GiB total, {memory.available / 2**30:.1f} GiB available; "
           + default_request_advice(model_dir))
    from ..history.calibration import load_calibration, preset_advice   # written by `h3bridge selftest`
    calibration = load_calibration(engine_path=None if engine_path is None else str(engine_path))
    record("speed", True, (f"calibrated: {calibration.describe()}; " if calibration is not None else
                           f"not calibrated (`{h3bridge_command('selftest')}` measures this machine); ")
           + preset_advice(calibration))
    from ..lora import compiled
    record("lora fold", True, f"compiled kernels ({compiled.name()})" if compiled.available() else
           f"{compiled.name()}; `pip install 'h3bridge[fast-fold]'` folds with about a third less CPU, same bytes")
    from ..engines.priority import probe_background
    background_works, background_gives = probe_background()
    record("background", background_works, f"--background gives {background_gives}",
           "--background cannot lower the engine's priority here; render without it")
    machine = f"{platform.system()} {platform.machine()}"
    apple = platform.system() == "Darwin" and platform.machine() == "arm64"
    record("platform", True, machine + ("" if apple else
                                        " (the Metal h3 needs an Apple Silicon Mac; here h3-sim runs, and build-engine "
                                        "builds upstream's own C over the portable CPU backend for testing)"))
    if args.json:
        print(json.dumps({"ok": all(c["ok"] for c in checks), "checks": checks}, indent=2))
    else:
        for check in checks:
            mark = "ok     " if check["ok"] else "MISSING"
            print(f"{mark} {check['check']:<9} {check['detail']}")
            if check["fix"]:
                print(f"          fix: {check['fix']}")
    return EXIT_OK if all(c["ok"] for c in checks) else EXIT_FAILURE


def is_simulator(engine_path: Path) -> bool:
    """The engine is h3-sim, also under another name (a link `h3` -> h3-sim on PATH, as the docs set up)."""
    try:
        return engine_path.resolve().name.startswith("h3-sim") or engine_path.name.startswith("h3-sim")
    except OSError:
        return engine_path.name.startswith("h3-sim")


def engine_commit_check(engine_path: Path) -> tuple[str, bool, str, str | None]:
    """doctor's "h3 build" line: the h3.c commit the engine was built from (as build-engine
    recorded it: h3 itself does not report its commit) and whether it is the pinned one."""
    from ..engine_build.record import PINNED_COMMIT, build_record
    pinned = PINNED_COMMIT[:7]
    if is_simulator(engine_path):
        return ("h3 build", True, f"h3-sim, h3bridge's simulator of h3.c {pinned}", None)
    found = build_record(engine_path)
    if found is None or found.commit is None:
        why = ("h3 does not report its commit (its --info prints only H3_VERSION) and build-engine has no "
               "record of building it" if found is None else f"built from {found.source}, which is not a git "
               "clone or `git archive` tarball")
        return ("h3 build", True, f"commit unknown: {why}; h3bridge is tested with h3.c {pinned}", None)
    changes = " with local changes" if found.commit.endswith("+changes") else ""
    commit = found.commit.split("+")[0][:7]
    if found.matches_pin:
        return ("h3 build", True, f"h3.c {commit}{changes}, the pinned commit", None)
    source = Path(found.source)
    if (source / ".git").exists():
        fix = (f"build the pinned commit: `git -C {found.source} checkout {pinned}`, then "
               f"`{h3bridge_command('build-engine', found.source)}`")
    else:       # a tarball, or a folder that is no clone (or no longer there): get the pinned source
        from ..engines.locate import engine_source_steps
        fix = f"build the pinned commit: {engine_source_steps()}"
    return ("h3 build", False, f"h3.c {commit}{changes}, not the pinned {pinned} h3bridge is tested with", fix)


# ----------------------------------------------------------------------------- model: info, verify, plan
# (model/: inventory.py, verify.py, memory.py)

def default_request_advice(model_dir: Path | None = None) -> str:
    """What the memory plan says about upstream's default request (864x480, 56 frames, 50 layers)
    on this machine (doctor). Planned exactly as `generate` plans it (memory.preflight: sized
    from the model folder's own shards), so the two never disagree about the same request; only
    without a usable model folder is it sized from the released model's shapes."""
    from ..model.memory import plan_memory, preflight
    from ..model.inventory import format_bytes
    request = GenerationRequest("doctor")
    plan = None
    if model_dir is not None:
        try:
            plan = preflight(request, model_dir, force=True)    # force: report, never refuse
        except H3BridgeError:
            plan = None          # the model check above already reported what is wrong
    sized = "" if plan is not None else ", sized for the released model"
    if plan is None:
        plan = plan_memory(request, None)
    what = f"the default request ({request.width}x{request.height}, {request.frame_count} frames{sized})"
    if plan.fits:
        return f"{what} fits without --ssd-streaming (planned peak {format_bytes(plan.peak)} of " \
               f"{format_bytes(plan.budget)} usable)"
    if plan.suggestion is None:
        return f"{what} does not fit even at the smallest settings (see `{_plan_command(model_dir)}`)"
    return f"{what} needs {cli_words(plan.suggestion.settings)} here (see `{_plan_command(model_dir)}`)"


def _plan_command(model_dir: Path | None) -> str:
    """`h3bridge plan` for doctor's model folder, as it runs here (its default request is doctor's)."""
    return h3bridge_command("plan", *(["-d", model_dir] if model_dir is not None else []))


def preflight_generate(request: GenerationRequest, model_dir: Path, *, force: bool, session: bool = False,
                       machine: object = None, preview: bool = False, quiet: bool = False) -> None:
    """Model check + memory plan before starting an engine (`session`: a warm engine, which keeps
    the DiT and the video decoder loaded); a refusal prints the plan's table (unless `quiet`),
    and its verdict once, as the error `main` prints."""
    from ..errors import MemoryPlanError
    from ..model.memory import preflight
    try:
        plan = preflight(request, model_dir, force=force, session=session, machine=machine, preview=preview)
    except MemoryPlanError as error:
        if error.plan is not None:
            if not quiet:
                print(error.plan.render(verdict=False), file=sys.stderr)   # type: ignore[attr-defined]
        raise
    print("".join(f"h3bridge: warning: {said(warning, cli_words)}\n" for warning in plan.model_warnings), end="",
          file=sys.stderr)
    if force and not plan.fits:
        print(f"h3bridge: --force: {plan.verdict(cli_words)}", file=sys.stderr)


def add_info_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("info", help="inventory a model directory (files, tensors, sizes, problems)",
                                   description="Inventory a MiniMax-H3 model directory from its shard headers "
                                               "(no tensor data read) and report layout problems with fixes.")
    add_model_dir_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the inventory as JSON")
    parser.set_defaults(handler=run_info)


def run_info(args: argparse.Namespace) -> int:
    from ..model.inventory import inspect_model
    inventory = inspect_model(model_dir_from_args(args))
    print(json.dumps(inventory.to_dict(cli_words), indent=2) if args.json else inventory.table(cli_words))
    return EXIT_FAILURE if inventory.errors else EXIT_OK


def add_verify_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("verify", help="check every shard's header (and with --checksums, its SHA-256)",
                                   description="Check every shard header; with --checksums hash every shard and "
                                               "compare with the Hugging Face hashes or h3bridge's manifest.")
    add_model_dir_argument(parser)
    parser.add_argument("--checksums", action="store_true",
                        help="hash every shard (all cores) and compare; results cached by path, size and mtime")
    parser.add_argument("--rewrite-manifest", action="store_true",
                        help="record the current hashes as the reference (after replacing a file on purpose)")
    parser.add_argument("--workers", type=int_flag(1, MAX_WORKERS), help="hashing threads (default: all cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--verbose", action="store_true",
                        help="list every shard with its size and status (default: only problems and a summary)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(handler=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from ..model.verify import verify_model
    report = verify_model(model_dir_from_args(args), checksums=args.checksums or args.rewrite_manifest,
                          workers=args.workers, progress=False if args.quiet else None,
                          rewrite_manifest=args.rewrite_manifest)
    print(json.dumps(report.to_dict(cli_words), indent=2) if args.json else
          report.table(verbose=args.verbose, words=cli_words))
    return EXIT_OK if report.ok else EXIT_FAILURE


def add_plan_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan", help="peak memory per phase for a request, and what to change if it "
                                                "does not fit", description="Plan a request's unified-memory use "
                                   "on this machine (or a given one) without starting an engine. Exit 0 if it fits, 1 if not.")
    add_request_options(parser)
    for action in parser._actions:
        if action.dest == "prompt":     # the plan barely depends on the prompt
            action.required, action.default = False, "A red fox runs through snow at dawn"
    machine = parser.add_argument_group("machine and model")
    machine.add_argument("-d", "--model-dir", metavar="PATH", type=Path,
                         help="size the plan from this model's shards (default: $H3_MODEL_DIR, else upstream's shapes)")
    machine.add_argument("--show", action="store_true", help="plan for h3's live preview (--show, ~10 GiB more)")
    machine.add_argument("--memory-gb", type=_positive_gigabytes, metavar="GB",
                         help="plan for a Mac with this much unified memory instead of this machine")
    machine.add_argument("--chip", metavar="NAME", type=_chip_name, help='with --memory-gb: the chip, e.g. "Apple M5 Max"')
    from .engine import OldEngineFlag, add_engine_choice
    from ..vocabulary import EngineKind
    # the engine to plan for, as generate names it: a warm one (session, library) keeps the DiT
    # and the video decoder loaded between clips
    add_engine_choice(machine, parser, kinds=PLAN_ENGINES, default=EngineKind.ONE_SHOT)
    machine.add_argument("--session", dest="session", action=OldEngineFlag, kind=EngineKind.SESSION)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(handler=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    import os

    from ..engines.locate import MODEL_DIR_ENV
    from ..model.memory import MachineFacts, plan_memory
    from ..model.inventory import inspect_model
    request = request_from_args(args).validate(check_files=False)
    if args.memory_gb is not None:
        machine = MachineFacts.mac(args.memory_gb, args.chip or "Apple M4 Pro")
    else:
        machine = MachineFacts.detect()
    model_dir = args.model_dir or (Path(os.environ[MODEL_DIR_ENV]) if os.environ.get(MODEL_DIR_ENV) else None)
    if model_dir is not None:
        model_folder(model_dir, "--model-dir")
    _check_plan_media(request)
    inventory = inspect_model(model_dir) if model_dir is not None else None
    if inventory is not None:
        for problem in inventory.errors:
            print(f"h3bridge: model: {problem.message}\n  fix: {said(problem.fix, cli_words)}", file=sys.stderr)
    from .engine import engine_kind
    from ..vocabulary import EngineKind
    warm = engine_kind(args) is not EngineKind.ONE_SHOT       # the library's worker keeps its model warm too
    plan = plan_memory(request, inventory, machine=machine, preview=args.show, session=warm)
    print(json.dumps(plan_json(plan), indent=2) if args.json else plan.render(words=cli_words))
    return EXIT_OK if plan.fits else EXIT_FAILURE


def plan_json(plan: "MemoryPlan") -> dict[str, object]:
    """`plan --json`: the plan's fields, its suggestion's settings also as the flags to pass."""
    data = plan.to_dict()
    if plan.suggestion is not None:
        data["suggestion"]["flags"] = [cli_word(change) for change in plan.suggestion.settings]  # type: ignore[index]
    return data


def _check_plan_media(request: GenerationRequest) -> None:
    """The plan reads no media, but a path that is not a file (a FIFO, a device, a folder, a dangling
    link) is refused as `generate` would refuse it: a reference that was a FIFO hung the plan."""
    from ..errors import RequestError
    from ..safeio.paths import non_regular_kind, symlink_note
    named = [("first_frame", request.first_frame), ("last_frame", request.last_frame)]
    for reference in request.references:
        named += [("references", reference.path), ("references", reference.audio_path)]
    for field, path in named:
        kind = non_regular_kind(path) if path is not None else None
        if kind is not None:
            raise RequestError(f"{FLAG_FOR_FIELD.get(field, '--ref-*')} {str(path)!r} is {kind}{symlink_note(path)}, "
                               "not a media file", field=field, hint="give the path of an image, video or audio file")


MAX_WORKERS = 1024
PLAN_ENGINES = ("one-shot", "session", "library")      # the engines on this machine (a server plans its own)
MAX_CHIP_CHARS = 100


def _chip_name(text: str) -> str:
    """--chip: one short line of printable text, as Apple names its chips."""
    if not text.isprintable() or not 0 < len(text) <= MAX_CHIP_CHARS:
        raise argparse.ArgumentTypeError(f"the chip name must be one line of at most {MAX_CHIP_CHARS} printable "
                                         'characters, e.g. "Apple M5 Max"')
    return text


def _positive_gigabytes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size; give the Mac's unified memory "
                                         "in GB, e.g. 64")
    return value


# ----------------------------------------------------------------------------- entry point

SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_generate_command, add_doctor_command,
                                                                   add_info_command, add_verify_command,
                                                                   add_plan_command, add_demo_command]
from .build import add_build_engine_command, add_build_library_command   # noqa: E402 (upstream's h3 + libh3; build-library deprecated)
SUBCOMMANDS += [add_build_engine_command, add_build_library_command]
from .model import add_model_command   # noqa: E402 (`model download`: the checkpoint from the hub)
SUBCOMMANDS += [add_model_command]
from .selftest import add_selftest_command   # noqa: E402 (issue 33: check, calibrate, report)
SUBCOMMANDS += [add_selftest_command]


class H3BridgeParser(argparse.ArgumentParser):
    """argparse with "did you mean" (the root parser and, through `parser_class`, every subcommand's).

    An unknown option is said by the subcommand it was given to, with its usage and the closest of
    its options (`unrecognized argument: --widht (did you mean --width?)`), even when a required
    argument is missing too (argparse would only say that); a mistyped subcommand or choice gets
    the closest valid one."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        arguments = list(sys.argv[1:] if args is None else args)
        subcommand = self._subparsers is not None and any(
            isinstance(action, argparse._SubParsersAction) for action in self._subparsers._group_actions)
        if self.prog != ROOT_PROG and not subcommand:
            unknown = self._unknown_options(arguments)      # before argparse's "required" check hides them
            if unknown:
                self.error(self._unrecognized(unknown))
        namespace, extras = super().parse_known_args(arguments, namespace)
        if extras and self.prog != ROOT_PROG:       # said here, with this subcommand's usage, not the root's
            self.error(self._unrecognized(extras))
        return namespace, extras

    def _unknown_options(self, arguments: list[str]) -> list[str]:
        unknown = []
        for text in arguments:
            if text == "--":
                break
            found = self._parse_optional(text)
            # Python 3.12.7+ returns a list of (action, option, separator, value), older ones one tuple
            options = found if isinstance(found, list) else [found] if found is not None else []
            if options and all(option[0] is None for option in options):
                unknown.append(text)
        return unknown

    def _unrecognized(self, extras: list[str]) -> str:
        flags = sorted(option for action in self._actions if action.help is not argparse.SUPPRESS
                       for option in action.option_strings)
        said = []
        for text in extras:
            name = text.split("=", 1)[0]
            close = difflib.get_close_matches(name, flags, n=3, cutoff=0.6) if name.startswith("-") else []
            said.append(text + (f" (did you mean {' or '.join(close)}?)" if close else ""))
        return f"unrecognized argument{'s' if len(said) > 1 else ''}: {', '.join(said)}"

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if action.choices is None or value in action.choices:
            return
        if isinstance(action, argparse._SubParsersAction):      # the hidden alias (build-library) is not offered
            offered = [choice.dest for choice in action._choices_actions]
        else:
            offered = [str(choice) for choice in action.choices]
        close = difflib.get_close_matches(str(value), offered, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else f"choose from {', '.join(offered)}"
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} ({hint})")


ROOT_PROG = "h3bridge"

# `h3bridge --help` lists the subcommands by what users do; every visible subcommand is in exactly
# one group (build_parser checks, tests/test_cli_vocabulary.py too).
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "render": ("generate", "story", "demo", "plan"),
    "models": ("model", "info", "verify", "lora"),
    "engines": ("build-engine", "doctor", "selftest"),
    "serve": ("serve", "fleet"),
    "tools": ("history", "stats", "hexgrid"),
}
# Old subcommands that still run, hidden from --help (each says its current name when run).
HIDDEN_COMMANDS = ("build-library",)


def grouped_commands(subparsers: argparse._SubParsersAction) -> str:
    """The subcommand list of `h3bridge --help`, a heading per COMMAND_GROUPS entry."""
    helps = {choice.dest: choice.help or "" for choice in subparsers._choices_actions}
    grouped = [name for names in COMMAND_GROUPS.values() for name in names]
    stray = sorted(set(helps) ^ set(grouped)) + sorted({name for name in grouped if grouped.count(name) > 1})
    if stray:
        raise AssertionError(f"cli.COMMAND_GROUPS must list every subcommand once: {', '.join(stray)}")
    width = max(len(name) for name in grouped) + 2
    lines = []
    for group, names in COMMAND_GROUPS.items():
        lines.append(f"{group}:")
        lines += [f"  {name:<{width}}{helps[name]}" for name in names]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = H3BridgeParser(prog=ROOT_PROG, description="MiniMax-H3 through antirez's h3.c engine.",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    from .. import __version__
    parser.add_argument("--version", action="version", version=f"h3bridge {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS,
                                       parser_class=H3BridgeParser)
    from .fleet import add_fleet_command         # a LiteLLM proxy config for many servers, h3bridge/fleet
    from .hexgrid import add_hexgrid_command     # the H3 hexagon tiling (Uber's grid), h3bridge/hexgrid
    from .history import add_history_command, add_stats_command     # the job history, h3bridge/history
    from .lora import add_lora_command           # LoRAs folded into a copy of the model, h3bridge/lora
    from .serve import add_serve_command    # the OpenAI Videos API server, h3bridge/server
    from .story import add_story_command         # storyboards of chained shots, h3bridge/story
    for add_command in [*SUBCOMMANDS, add_fleet_command, add_hexgrid_command, add_history_command, add_stats_command,
                        add_lora_command, add_serve_command, add_story_command]:
        add_command(subparsers)
    parser.epilog = (f"commands (h3bridge COMMAND --help for each):\n{grouped_commands(subparsers)}\n\n"
                     f"{EXIT_STATUS_HELP}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)     # exits 2 on bad arguments, as argparse does
    try:
        status = args.handler(args)
        sys.stdout.flush()      # a reader that left (`| head`) shows here, not in Python's exit
        return status
    except BrokenPipeError:
        # Whoever read stdout stopped reading (`h3bridge history --json | head`): that is their
        # choice, not a failure. Nothing more can be written there, so it is pointed at
        # /dev/null, or Python's own flush at exit would report the broken pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except GenerationCancelled as error:
        print(f"h3bridge: {error.message}", file=sys.stderr)
        return EXIT_CANCELLED
    except KeyboardInterrupt:
        print("h3bridge: interrupted", file=sys.stderr)
        return EXIT_CANCELLED
    except H3BridgeError as error:
        print(f"h3bridge: {cli_error_text(error)}", file=sys.stderr)
        engine_message = getattr(error, "engine_message", None)
        if engine_message and engine_message not in error.message:
            print(f"  h3 said: {engine_message}", file=sys.stderr)
        log = _save_engine_log(getattr(error, "stderr", None))
        if log is not None:
            print(f"  engine log: {log}", file=sys.stderr)
        # A refusal (bad flags, an output that exists, a missing or damaged model, no engine,
        # a plan or a disk that cannot take the clip) came before anything ran: exit 2.
        return EXIT_USAGE if error.before_start else EXIT_FAILURE
    except OSError as error:     # the file system refused something we did not foresee
        print(f"h3bridge: {error.strerror or error}" + (f": {error.filename}" if error.filename else ""),
              file=sys.stderr)
        return EXIT_FAILURE


def cli_error_text(error: H3BridgeError) -> str:
    """An error as the command line says it: the settings its message names and its fix, said as
    flags (h3bridge.fixes); text that names none is shown as the library wrote it."""
    message, hint = cli_message(error), cli_hint(error)
    return f"{message}\n  fix: {hint}" if hint else message


def _save_engine_log(stderr: str | None) -> Path | None:
    """The engine's whole stderr, kept in h3bridge's cache directory for the failure's hint
    ("see the engine log"); None when there is none or it cannot be written."""
    if not stderr:
        return None
    import time

    from ..userdirs import cache_dir
    try:
        folder = cache_dir() / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"h3-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        path.write_text(stderr.replace("\r", "\n"), encoding="utf-8", errors="replace")
        return path
    except OSError:
        return None


if __name__ == "__main__":   # pragma: no cover
    sys.exit(main())
