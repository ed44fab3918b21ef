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
from ..engine_build.record import PINNED_COMMIT
from ..errors import EngineNotFoundError, ModelError
from ..fixes import Blank, Fix, changes, given, joined, literal
from ..request import GenerationRequest
from ..runnable import command, h3bridge_command


ENGINE_ENV = "H3_BIN"


MODEL_DIR_ENV = "H3_MODEL_DIR"


# Field names appear bare (`engine_path`), never as `name=value`: the CLI turns them into its flags
# (cli.engine.cli_words) and ComfyUI shows its node input of the same name. Commands are built by
# runnable (as they run where the message is shown: console script or `python -m`), and the h3.c
# commit is the pin build-engine and doctor check, so message, README and doctor agree.
PINNED_SHORT = PINNED_COMMIT[:7]
UPSTREAM_URL = "https://github.com/antirez/h3.c"


def engine_source_steps(folder: str = "DIR") -> str:
    """How to get the pinned h3.c source and build it with build-engine, as commands to run one by one."""
    return (f"`git clone {UPSTREAM_URL} {folder}`, `git -C {folder} checkout {PINNED_SHORT}` (the commit h3bridge "
            f"is tested with), then `{h3bridge_command('build-engine', folder)}`")


def simulator_for_engine_path() -> str:
    """h3-sim as the user can give it as the engine path here: its name when it is the one on PATH,
    else the program installed beside this Python, else a checkout's bin/h3-sim (a ComfyUI clone
    installed from requirements.txt has no console scripts), else the bare name."""
    import sys
    import sysconfig

    from ..runnable import script_runs_here
    if script_runs_here("h3-sim"):
        return "h3-sim"
    checkout = Path(__file__).resolve().parents[2] / "bin" / "h3-sim"
    for candidate in (Path(sysconfig.get_path("scripts")) / "h3-sim", Path(sys.executable).parent / "h3-sim", checkout):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return "h3-sim"


def _engine_build_hint(system: str) -> Fix:
    """How to get an engine (a Fix: it names the engine path, which each interface says its way)."""
    where = Fix("give the h3 path it prints as {}, set H3_BIN, or put h3 on PATH", (given("engine_path"),))
    if system == "Darwin":
        return joined(f"build the pinned h3.c: {engine_source_steps()} (upstream's own make, with Xcode's command "
                      "line tools, on an Apple Silicon Mac); ", where)      # type: ignore[return-value]
    # The real (Metal) h3 cannot run here: the one-step way to see h3bridge work comes first.
    return joined(f"the Metal h3 runs only on an Apple Silicon Mac. Here, `{h3bridge_command('demo')}` renders a clip "
                  f"end to end with the simulator h3-sim and a fixture model (synthetic patterns); or give "
                  f"{simulator_for_engine_path()} as ", Fix("{}", (given("engine_path"),)),
                  f" with a model from `{command('h3-sim-model', 'DIR')}`. Upstream's own C also runs here, "
                  f"over h3bridge's portable CPU backend, for testing (on a model of the released shapes, e.g. "
                  f"`{command('h3-sim-model', '--realistic', 'DIR')}`): {engine_source_steps()}; ",
                  where)      # type: ignore[return-value]


def capitalized(fix: Fix) -> Fix:
    """`fix` starting a sentence."""
    return Fix(fix.text[:1].upper() + fix.text[1:], fix.groups)


ENGINE_BUILD_HINT = _engine_build_hint(platform.system())


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
        build = h3bridge_command("build-engine", path.absolute())
        raise EngineNotFoundError(
            f"the h3 engine from {source} is a folder with no h3 program in it: {path.absolute()}",
            hint=f"this looks like an h3.c source that was never built: run `{build}` (h3bridge is tested with "
                 f"h3.c {PINNED_SHORT}: `git -C {path.absolute()} checkout {PINNED_SHORT}` first in a clone), then "
                 f"give the h3 path it prints" if unbuilt else
                 joined("give the h3 program itself (the path build-engine prints) or the h3.c folder that "
                        "holds it. ", capitalized(ENGINE_BUILD_HINT)))
    if not path.is_file():
        # A bare name ("h3-sim") given explicitly or in H3_BIN: look it up on PATH.
        found = shutil.which(raw) if os.sep not in raw else None
        if found is None:
            raise EngineNotFoundError(f"the h3 engine from {source} does not exist: {raw}", hint=ENGINE_BUILD_HINT)
        path = Path(found)
    if not os.access(path, os.X_OK):
        raise EngineNotFoundError(f"the h3 engine from {source} is not executable: {path}",
                                  hint=joined(f"`chmod +x {path}`, or build it again (", ENGINE_BUILD_HINT, ")"))
    return path.absolute()


def engine_working_directory(engine_path: Path) -> Path:
    """Where h3 must run: its real (symlink-resolved) directory, because h3 compiles
    `h3_shaders.metal` at run time from a relative path (h3.c passes "h3_shaders.metal" to
    every Metal loader), so a symlink to h3 in ~/bin must still run from the h3.c checkout."""
    return engine_path.resolve().parent


def locate_model_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The model directory: `explicit`, else env H3_MODEL_DIR. Must be a directory."""
    # the inventory's wording (lazily: it reads headers with numpy, which finding an engine never needs)
    from ..model.inventory import DOWNLOAD_HINT, not_a_model_folder_error
    raw = os.fspath(explicit) if explicit is not None and os.fspath(explicit) else os.environ.get(MODEL_DIR_ENV)
    if not raw:
        raise ModelError("no MiniMax-H3 model directory given",
                         hint=Fix("pass {} or set " + literal(f"{MODEL_DIR_ENV}; {DOWNLOAD_HINT}; to try h3bridge with "
                                                              f"the simulator h3-sim, `{command('h3-sim-model', 'DIR')}` "
                                                              "writes a fixture model"),
                                  (changes(model_dir=Blank("DIR")),)))
    path = Path(raw).expanduser().absolute()
    if not path.is_dir():
        raise not_a_model_folder_error(path)
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
