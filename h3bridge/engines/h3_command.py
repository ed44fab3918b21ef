"""h3's command line, as main.c defines it: the argv for a request, the phases it reports for it,
the messages it prints (`h3: ...`), and the operating system's limits on an argv.
"""
from __future__ import annotations
import os
import re
import sys
from typing import Mapping, Sequence
from ..errors import RequestError
from ..fixes import Fix, changes
from ..vocabulary import EngineKind
from ..request import GenerationRequest, Reference, ReferenceImageSize, ReferenceKind
from ..upstream_costs import expected_phases  # noqa: F401 (engines import it from here)


def absolute_path(path: str | os.PathLike[str]) -> str:
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
        args += [_REFERENCE_FLAGS[reference.kind], absolute_path(reference.path)]
        if reference.kind is ReferenceKind.VIDEO_AUDIO:
            assert reference.audio_path is not None
            args.append(absolute_path(reference.audio_path))
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
        args += ["--first-frame", absolute_path(request.first_frame)]
    if request.last_frame is not None:
        args += ["--last-frame", absolute_path(request.last_frame)]
    args += reference_arguments(request.references)
    if request.reference_image_size is not ReferenceImageSize.MATCH:
        args += ["--ref-image-size", request.reference_image_size.value]
    return args


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


def argument_limit_error(argv: Sequence[str], env: Mapping[str, str], prompt: str) -> RequestError:
    """The RequestError for a command line exec refuses (E2BIG), in the prompt's terms."""
    single, total_limit = _argument_limits()
    prompt_bytes = len(os.fsencode(prompt))
    alternative = Fix("shorten the prompt, or render it in the warm session ({}): it sends the prompt to h3 over "
                      "stdin, where its length does not count", (changes(engine=EngineKind.SESSION),))
    if single is not None and prompt_bytes + 1 > single:
        return RequestError(f"the prompt is {prompt_bytes} bytes; h3 takes it as one command-line argument, and "
                            f"this system allows at most {single - 1} bytes in one (MAX_ARG_STRLEN)",
                            field="prompt", hint=alternative)
    used = _command_line_bytes(argv, env)
    return RequestError(f"the engine's command line and environment come to {used} bytes ({prompt_bytes} of "
                        f"them the prompt), over this system's limit of {total_limit} (ARG_MAX)",
                        field="prompt", hint=Fix(alternative.text + "; or unset large environment variables",
                                                 alternative.groups))


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
        raise argument_limit_error(argv, env, prompt)
