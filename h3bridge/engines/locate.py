"""Where the engine, the model and the media tools are: explicit paths, H3_BIN / H3_MODEL_DIR, PATH,
H3_FFMPEG / H3_FFPROBE, and the environment an engine runs with.
"""
from __future__ import annotations
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping
from ..errors import EngineNotFoundError, ModelError
from ..request import GenerationRequest


ENGINE_ENV = "H3_BIN"


MODEL_DIR_ENV = "H3_MODEL_DIR"


# Field names appear bare (`engine_path`), never as `name=value`: the CLI turns them into its flags
# (cli.in_cli_words) and ComfyUI shows its node input of the same name.
ENGINE_BUILD_HINT = (
    "build h3 on an Apple Silicon Mac: `git clone https://github.com/antirez/h3.c && cd h3.c && make`, "
    "then give the path of the h3 it builds as engine_path (CLI: --engine-path), set H3_BIN, or put h3 on "
    "PATH. To try h3bridge without a Mac, give the simulator h3-sim (installed with h3bridge) as "
    "engine_path, with a fixture model from `h3-sim-model DIR`"
    # the real h3 cannot run here: the one-step way to see h3bridge work comes first for this machine
    + ("." if platform.system() == "Darwin" else
       ", or run `h3bridge demo`, which does both and renders a clip end to end (synthetic patterns)."))


FFMPEG_HINT = ("install FFmpeg (`brew install ffmpeg` on macOS, `apt-get install ffmpeg` on Debian/Ubuntu), "
               "or point H3_FFMPEG / H3_FFPROBE at the programs (apps started from the Dock lack Homebrew's PATH)")


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
