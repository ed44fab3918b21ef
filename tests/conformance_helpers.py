"""The conformance walk (tests/test_conformance.py, bench/conformance_counts.py): every entry point
h3bridge has, found by walking the code rather than listed by hand, and the hostile inputs each
one is fed.

* the command line: the real argparse parser `h3bridge.cli.build_parser()` builds, every
  subcommand and nested subcommand (through `_subparsers`), every argument classified by
  `argument_kind` (a new argument nobody classified makes the walk fail, so it is classified
  the day it is added);
* the server: h3bridge's own body fields (`wire.FIELDS`, the file parts), both peer dialects'
  fields (`dialects.VLLM_MARKERS`, `SGLANG_MARKERS`, the fields refused or pinned in every
  dialect, vLLM-Omni's `extra_params` keys, SGLang's `target` and `conditions[]` keys);
* the storyboard keys (`storyboard.STORY_KEYS`, `SHOT_KEYS`, the request's fields);
* the ComfyUI node inputs: every `io.<Type>.Input("name", ...)` in the `define_schema` of every
  `io.ComfyNode` class under h3bridge/comfy (read from the source: ComfyUI, which the node
  modules import, is not installed here).

Each command-line case runs `h3bridge.cli.main(argv)` in a forked child (the parent has imported
everything once, so a case costs a fork, not an interpreter start), in its own process group, with
its output in files and a hang guard that kills the group; the verdict is the exit status, the
stderr, and a snapshot of the case's folder before and after.
"""
from __future__ import annotations

import argparse
import ast
import enum
import json
import os
import select
import signal
import stat
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import h3bridge
from h3bridge.cli.main import build_parser

HANG_SECONDS = 10.0          # a refusal takes well under a second; this only tells a hang apart
SPARSE_BYTES = 64 << 30      # a "huge" file that costs no disk
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


# ----------------------------------------------------------------------------- the command line

class ArgKind(str, enum.Enum):
    FLAG = "flag"                # takes no value
    CHOICE = "choice"            # argparse checks the value against its choices
    INPUT_FILE = "input file"    # a path h3bridge reads (a file, or a file or folder)
    INPUT_DIR = "input folder"   # a folder h3bridge reads
    OUTPUT_FILE = "output file"  # a file h3bridge writes (never over anything but a regular file)
    OUTPUT_DIR = "output folder"  # a folder h3bridge makes or keeps its own files in
    NUMBER = "number"            # a count, size or length: never negative
    SIGNED = "signed number"     # a number whose negative values mean something (a seed, a strength)
    TEXT = "text"                # free text (a prompt): any characters a prompt may hold
    NAME = "name"                # a name, key, address or URL: one line of printable text


# Every argument that takes a value, by its dest, once for every subcommand that has it (one
# vocabulary: the same dest means the same thing everywhere). Numbers with type=int/float are
# classified from their type; a dest here overrides that. A new argument whose kind cannot be
# told from its action must be added here: test_every_argument_is_classified fails until it is.
ARGUMENT_KINDS: dict[str, ArgKind] = {
    # inputs
    "first_frame": ArgKind.INPUT_FILE, "last_frame": ArgKind.INPUT_FILE, "references": ArgKind.INPUT_FILE,
    "engine_path": ArgKind.INPUT_FILE, "library_path": ArgKind.INPUT_FILE, "storyboard": ArgKind.INPUT_FILE,
    "source": ArgKind.INPUT_FILE, "loras": ArgKind.INPUT_FILE,
    "model_dir": ArgKind.INPUT_DIR, "model_dir_positional": ArgKind.INPUT_DIR, "h3c_dir": ArgKind.INPUT_DIR, "h3_dir": ArgKind.INPUT_DIR,
    "folders": ArgKind.INPUT_DIR,
    # outputs
    "output": ArgKind.OUTPUT_FILE, "preview_dir": ArgKind.OUTPUT_DIR, "job_dir": ArgKind.OUTPUT_DIR,
    "data_dir": ArgKind.OUTPUT_DIR, "directory": ArgKind.OUTPUT_DIR, "output_dir": ArgKind.OUTPUT_DIR,
    # numbers that are not type=int/float
    "stall_timeout": ArgKind.NUMBER, "workers": ArgKind.NUMBER, "max_size": ArgKind.NUMBER, "memory_gb": ArgKind.NUMBER, "limit": ArgKind.NUMBER, "max_queued": ArgKind.NUMBER,
    "seed": ArgKind.SIGNED,
    # text and names
    "prompt": ArgKind.TEXT,
    "chip": ArgKind.NAME, "revision": ArgKind.NAME, "repo": ArgKind.NAME, "remote": ArgKind.NAME,
    "server": ArgKind.NAME, "vllm_omni": ArgKind.NAME, "sglang": ArgKind.NAME, "key_env": ArgKind.NAME,
    "peer_key_env": ArgKind.NAME, "master_key_env": ArgKind.NAME, "model_name": ArgKind.NAME,
    "host": ArgKind.NAME, "api_key": ArgKind.NAME, "cors_origin": ArgKind.NAME, "server_key_env": ArgKind.NAME,
    "servers_file": ArgKind.INPUT_FILE,
}
# Per subcommand, where one dest means something else there: (command path, dest) -> kind.
ARGUMENT_KINDS_IN: dict[tuple[str, str], ArgKind] = {
    ("lora fold", "output"): ArgKind.OUTPUT_DIR,       # the folded model's folder (must not exist)
    ("demo", "output"): ArgKind.OUTPUT_FILE,
    ("selftest", "engines"): ArgKind.CHOICE,         # --engine KIND: its type= takes only an engine's name
}


@dataclass(frozen=True)
class Argument:
    command: str                 # "generate", "model download"
    action: argparse.Action
    kind: ArgKind | None         # None: not classified

    @property
    def flag(self) -> str | None:
        """The spelling to pass it with (the long one), None for a positional."""
        options = self.action.option_strings
        if not options:
            return None
        long = [o for o in options if o.startswith("--")]
        return (long or options)[0]

    @property
    def name(self) -> str:
        return f"{self.command} {self.flag or self.action.dest}"


def argument_kind(command: str, action: argparse.Action) -> ArgKind | None:
    if action.nargs == 0:
        return ArgKind.FLAG
    if action.choices is not None:
        return ArgKind.CHOICE
    explicit = ARGUMENT_KINDS_IN.get((command, action.dest), ARGUMENT_KINDS.get(action.dest))
    if explicit is not None:
        return explicit
    if action.type in (int, float) or getattr(action.type, "reads_number", False):     # safeio.numbers' flags
        return ArgKind.NUMBER
    return None


def walk_parser(parser: argparse.ArgumentParser | None = None) -> tuple[list[str], list[Argument]]:
    """Every subcommand (leaves: the ones that run something) and every argument of each."""
    parser = parser or build_parser()
    commands: list[str] = []
    arguments: list[Argument] = []

    def walk(current: argparse.ArgumentParser, path: list[str]) -> None:
        subparsers = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if path and not subparsers:
            commands.append(" ".join(path))
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if sub not in seen:
                        seen.add(sub)
                        walk(sub, [*path, name])
            elif isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or not path:
                continue
            else:
                arguments.append(Argument(" ".join(path), action, argument_kind(" ".join(path), action)))
    seen: set[argparse.ArgumentParser] = set()
    walk(parser, [])
    return commands, arguments


# ----------------------------------------------------------------------------- hostile values

@dataclass(frozen=True)
class Hostile:
    name: str
    value: object                # what is passed (a path as str, a number's text, ...)
    guarded: Path | None = None  # a thing that must be there, unchanged, afterwards


class HostileFiles:
    """The hostile things a path can name, made in `folder` (a device node only as root)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.fifo = folder / "fifo"
        os.mkfifo(self.fifo)
        self.zero_link = folder / "zero-link"
        self.zero_link.symlink_to("/dev/zero")
        self.device: Path | None = None
        if IS_ROOT:
            self.device = folder / "zero-device"
            os.mknod(self.device, 0o666 | stat.S_IFCHR, os.makedev(1, 5))     # what /dev/zero is
        self.folder_path = folder / "a-folder"
        self.folder_path.mkdir()
        self.dangling = folder / "dangling-link"
        self.dangling.symlink_to(folder / "nowhere")
        self.unreadable = folder / "unreadable"
        self.unreadable.write_bytes(b"secret")
        self.unreadable.chmod(0)
        self.unreadable_dir = folder / "unreadable-folder"
        self.unreadable_dir.mkdir()
        self.unreadable_dir.chmod(0)
        self.sparse = folder / "sparse-64g"
        with open(self.sparse, "wb") as handle:
            handle.truncate(SPARSE_BYTES)

    def for_input(self, *, folder_expected: bool) -> list[Hostile]:
        cases = [Hostile("fifo", str(self.fifo), self.fifo), Hostile("link to /dev/zero", str(self.zero_link)),
                 Hostile("dangling link", str(self.dangling))]
        if self.device is not None:
            cases.append(Hostile("device node", str(self.device), self.device))
        if folder_expected:
            cases.append(Hostile("huge sparse file", str(self.sparse), self.sparse))
            if not IS_ROOT:          # root reads a mode-000 folder anyway
                cases.append(Hostile("unreadable folder", str(self.unreadable_dir)))
        else:
            cases += [Hostile("folder", str(self.folder_path)), Hostile("huge sparse file", str(self.sparse), self.sparse)]
            if not IS_ROOT:          # root reads a mode-000 file anyway
                cases.append(Hostile("unreadable file", str(self.unreadable)))
        return cases

    def for_output(self, *, folder_expected: bool) -> list[Hostile]:
        cases = [Hostile("fifo", str(self.fifo), self.fifo), Hostile("link to /dev/zero", str(self.zero_link), self.zero_link),
                 Hostile("dangling link", str(self.dangling), self.dangling)]
        if self.device is not None:
            cases.append(Hostile("device node", str(self.device), self.device))
        cases.append(Hostile("huge sparse file", str(self.sparse), self.sparse) if folder_expected
                     else Hostile("folder", str(self.folder_path), self.folder_path))
        return cases


HUGE_400 = "9" * 400
HUGE_5000 = "9" * 5000
CONTROL = "a\x01b\x1b[31mc\x7f"
LONG = "x" * 100_000


def hostile_numbers(*, signed: bool) -> list[Hostile]:
    cases = [Hostile("400 digits", HUGE_400), Hostile("5000 digits", HUGE_5000), Hostile("-400 digits", "-" + HUGE_400),
             Hostile("NaN", "nan"), Hostile("infinity", "inf"), Hostile("-infinity", "-inf"),
             Hostile("nested array", "[[1]]"), Hostile("wrong type", "abc")]     # on a command line, all text
    if not signed:
        cases.append(Hostile("negative", "-1"))
    return cases


def hostile_strings() -> list[Hostile]:
    return [Hostile("control characters", CONTROL), Hostile("100000 characters", LONG)]


# ----------------------------------------------------------------------------- running a case

@dataclass
class Outcome:
    status: int | None           # None: killed by the hang guard
    stdout: str
    stderr: str
    seconds: float

    @property
    def hung(self) -> bool:
        return self.status is None

    @property
    def untyped(self) -> bool:
        """A Python traceback (or our child's marker for an exception main let out)."""
        return "Traceback (most recent call last)" in self.stderr


UNTYPED_STATUS = 70      # the child's status when main() let an exception out


def run_main_forked(argv: Sequence[str], *, cwd: Path, env: dict[str, str], capture: Path,
                    timeout: float = HANG_SECONDS, main: Callable[[Sequence[str]], int] | None = None) -> Outcome:
    """`h3bridge.cli.main(argv)` in a forked child: its own process group (the guard kills the
    engine it may have started too), stdin from /dev/null, stdout and stderr in files under
    `capture`, `cwd` and `env` its own. The parent waits on a pidfd with `timeout`."""
    if main is None:
        from h3bridge.cli.main import main as cli_main
        main = cli_main
    capture.mkdir(parents=True, exist_ok=True)
    out_path, err_path = capture / "stdout", capture / "stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:      # the child: never returns
        status = UNTYPED_STATUS
        try:
            os.setpgid(0, 0)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
            os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
            sys.stdin = open(0, closefd=False)
            sys.stdout = open(1, "w", closefd=False, errors="replace")
            sys.stderr = open(2, "w", closefd=False, errors="replace")
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
                signal.signal(signum, signal.SIG_DFL)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            try:
                status = main(list(argv))
            except SystemExit as leaving:
                status = leaving.code if isinstance(leaving.code, int) else (0 if leaving.code is None else 1)
        except BaseException:      # noqa: BLE001 - an untyped error is what the walk counts
            traceback.print_exc()
            status = UNTYPED_STATUS
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(status if isinstance(status, int) and 0 <= status < 256 else UNTYPED_STATUS)
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    status: int | None
    if ready:
        _, raw = os.waitpid(pid, 0)
        status = os.waitstatus_to_exitcode(raw)
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        status = None
    seconds = time.monotonic() - started
    return Outcome(status, out_path.read_text(errors="replace"), err_path.read_text(errors="replace"), seconds)


def snapshot(root: Path, *, skip: Sequence[Path] = ()) -> dict[str, tuple]:
    """Every entry under `root` (links not followed): kind, size, mtime, inode, link target."""
    skipped = {str(p) for p in skip}
    found: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in skipped]
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            if path in skipped:
                continue
            info = os.lstat(path)
            target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
            size = info.st_size if not stat.S_ISDIR(info.st_mode) else 0
            found[path] = (stat.S_IFMT(info.st_mode), size, info.st_mtime_ns if not stat.S_ISDIR(info.st_mode) else 0,
                           info.st_ino, target, info.st_rdev)
    return found


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """What a case wrote, replaced or removed, in words."""
    said = [f"wrote {path}" for path in sorted(set(after) - set(before))]
    said += [f"removed {path}" for path in sorted(set(before) - set(after))]
    said += [f"changed {path}" for path in sorted(set(before) & set(after)) if before[path] != after[path]]
    return said


# ----------------------------------------------------------------------------- the server

def server_fields() -> list[tuple[str, str]]:
    """(dialect, field) for every field a `POST /v1/videos` body may name: h3bridge's own, then
    vLLM-Omni's and SGLang's (their marker fields, the fields refused or pinned in every dialect,
    and the nested keys: `extra_params.KEY`, `target.KEY`, `conditions[0].KEY`)."""
    from h3bridge.server import dialects
    from h3bridge.wire import videos as wire
    found: list[tuple[str, str]] = []
    for body_field in wire.FIELDS:
        found.append(("h3bridge", body_field.name))
        if body_field.alias:
            found.append(("h3bridge", body_field.alias))
    shared = sorted({*dialects._CANNOT, *dialects._ONLY, "flow_shift", "quality"})
    found += [("h3bridge", name) for name in shared]
    # A dialect's own fields, and the shared ones, but never the other peer's (a body that mixes
    # them is refused for the mix, naming the other dialect's field).
    for name in sorted({*dialects.VLLM_MARKERS, *shared, "flow_shift", "fps"} - dialects.SGLANG_MARKERS):
        found.append(("vllm-omni", name))
    found += [("vllm-omni", f"extra_params.{key}") for key in dialects._VLLM_EXTRA_KEYS]
    for name in sorted({*dialects.SGLANG_MARKERS, *shared} - dialects.VLLM_MARKERS):
        found.append(("sglang", name))
    found += [("sglang", f"target.{key}") for key in ("short_edge", "aspect_ratio", "duration_seconds")]
    found += [("sglang", f"conditions[0].{key}") for key in ("type", "uri", "role", "frame_index", "start_time_seconds")]
    return found


# JSON texts of the hostile values a body field can be given (typed JSON: the value's JSON text).
JSON_HOSTILE: dict[str, str] = {
    "400 digits": HUGE_400, "5000 digits": HUGE_5000, "-400 digits": "-" + HUGE_400,
    "400-digit text": '"%s"' % HUGE_400, "5000-digit text": '"%s"' % HUGE_5000,
    "NaN": "NaN", "infinity": "Infinity", "-infinity": "-Infinity", "NaN text": '"nan"', "infinity text": '"inf"',
    "negative": "-1", "nested array": "[[[1]]]", "object": '{"a": {"b": 1}}', "wrong type": "true",
    "control characters": '"a\\u0001b\\u001b[31mc\\u007f"', "100000 characters": '"%s"' % LONG,
}


def server_body(dialect: str, field_name: str, value_json: str, partner: tuple[str, object] | None = None) -> str:
    """A JSON body giving `field_name` (dotted: a nested key) the value, in `dialect`'s shape. The
    dialect is chosen by a neutral field of its own (`user` for vLLM-Omni, `n: 1` for SGLang)."""
    marker = {"h3bridge": "", "vllm-omni": '"user": "conformance", ', "sglang": '"n": 1, '}[dialect]
    if partner is not None:        # a field only valid with another (render_width with render_height)
        marker += '"%s": %s, ' % (partner[0], json.dumps(partner[1]))
    if field_name.startswith("extra_params."):
        inner = '{"%s": %s}' % (field_name.split(".", 1)[1], value_json)
        return '{%s"prompt": "x", "extra_params": %s}' % (marker, inner)
    if field_name.startswith("target."):
        inner = '{"%s": %s}' % (field_name.split(".", 1)[1], value_json)
        return '{%s"prompt": "x", "target": %s}' % (marker, inner)
    if field_name.startswith("conditions[0]."):
        key = field_name.split(".", 1)[1]
        condition = {"type": '"image"', "uri": '"data:image/png;base64,AAAA"', "role": '"reference"'}
        condition[key] = value_json
        inner = "{" + ", ".join('"%s": %s' % item for item in condition.items()) + "}"
        return '{%s"prompt": "x", "conditions": [%s]}' % (marker, inner)
    if field_name == "prompt":
        return '{%s"prompt": %s}' % (marker, value_json)
    return '{%s"prompt": "x", "%s": %s}' % (marker, field_name, value_json)


# ----------------------------------------------------------------------------- ComfyUI node inputs

@dataclass(frozen=True)
class NodeInput:
    node: str            # the node class
    name: str            # the input's name
    type: str            # String, Int, Float, Boolean, Combo, Image, DynamicCombo, Custom, ...


def comfy_node_inputs(package: Path | None = None) -> list[NodeInput]:
    """Every input of every ComfyUI node class (a class deriving from `io.ComfyNode`) under
    h3bridge/comfy, read from the source of its `define_schema` and of the module's helper
    functions it calls (ComfyUI is not needed: the modules are parsed, not imported)."""
    package = package or Path(h3bridge.__file__).parent / "comfy"
    found: list[NodeInput] = []
    for module in sorted(package.glob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        helpers = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        for node in tree.body:
            if not isinstance(node, ast.ClassDef) or not any(
                    isinstance(base, ast.Attribute) and base.attr == "ComfyNode" for base in node.bases):
                continue
            schema = next((item for item in node.body if isinstance(item, ast.FunctionDef)
                           and item.name == "define_schema"), None)
            if schema is None:
                continue
            seen: set[str] = set()
            for name, kind in _inputs_in(schema, helpers, set()):
                if name not in seen:
                    seen.add(name)
                    found.append(NodeInput(node.name, name, kind))
    return found


def _inputs_in(function: ast.FunctionDef, helpers: dict[str, ast.FunctionDef], visited: set[str]) -> Iterator[tuple[str, str]]:
    visited = visited | {function.name}
    for call in ast.walk(function):
        if not isinstance(call, ast.Call):
            continue
        target = call.func
        if isinstance(target, ast.Attribute) and target.attr == "Input" and call.args \
                and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
            owner = target.value
            kind = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else "?"
            yield call.args[0].value, kind
        elif isinstance(target, ast.Name) and target.id in helpers and target.id not in visited:
            yield from _inputs_in(helpers[target.id], helpers, visited)
    # nested helper functions (def inside the helper) are walked with it by ast.walk


# ----------------------------------------------------------------------------- counts

@dataclass
class Counts:
    entry_points: dict[str, int] = field(default_factory=dict)
    cases: int = 0
    untyped: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)       # an answer that is not the interface's own refusal

    def line(self) -> str:
        walked = ", ".join(f"{n} {what}" for what, n in self.entry_points.items())
        return (f"conformance: walked {walked}; {self.cases} hostile cases; {len(self.untyped)} untyped errors, "
                f"{len(self.hangs)} hangs, {len(self.writes)} writes, {len(self.wrong)} other wrong answers")


# ----------------------------------------------------------------------------- command-line cases

@dataclass
class CliWorld:
    """What a command needs besides the argument under test: a model, the simulator as the engine,
    a storyboard, a LoRA file, a folder for outputs; and the folders a case runs in."""

    root: Path               # everything a case may touch (snapshotted)
    engine: Path
    model: Path
    story: Path
    lora: Path
    out: Path
    home: Path
    cwd: Path
    hostile: HostileFiles
    base_env: dict[str, str]

    @classmethod
    def make(cls, root: Path, engine: Path, base_env: dict[str, str]) -> "CliWorld":
        from h3bridge.sim.fixture import write_fixture_model
        inputs = root / "inputs"
        inputs.mkdir(parents=True)
        model = write_fixture_model(inputs / "MiniMax-H3")
        story = inputs / "story.toml"
        story.write_text('width = 64\nheight = 32\nsteps = 2\n\n[[shot]]\nprompt = "a lighthouse"\nframes = 22\n',
                         encoding="utf-8")
        lora = inputs / "style.safetensors"
        lora.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")     # an empty safetensors header
        out, home, cwd = root / "out", root / "home", root / "cwd"
        for folder in (out, home, cwd):
            folder.mkdir()
        env = {**base_env, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
               "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
               "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "100"}
        for name in ("H3_MODEL_DIR", "H3_BIN", "H3_LIBRARY", "H3BRIDGE_API_KEY"):
            env.pop(name, None)
        return cls(root, engine, model, story, lora, out, home, cwd, HostileFiles(root / "hostile"), env)


# Arguments walked but not fed, and why.
NOT_FED: dict[tuple[str, str], str] = {
    ("demo", "prompt"): "demo renders a whole clip with the bundled simulator for any prompt (generate --prompt is fed)",
}


# The values each command gets for the arguments it needs, by dest (a callable takes the world),
# and the flags it always gets. A command the walk finds with no entry here fails
# test_every_command_has_a_base_invocation: add it the day the command is added.
BASE_VALUES: dict[str, dict[str, object]] = {
    "generate": {"prompt": "x", "engine_path": lambda w: w.engine, "model_dir": lambda w: w.model,
                 "output": lambda w: w.out / "clip.mp4", "width": "96", "height": "64", "frames": "22", "steps": "2"},
    "doctor": {"engine_path": lambda w: w.engine, "model_dir": lambda w: w.model},
    "info": {"model_dir": lambda w: w.model},
    "verify": {"model_dir": lambda w: w.model},
    "plan": {"model_dir": lambda w: w.model},
    "demo": {"output": lambda w: w.out / "demo.mp4"},
    "build-engine": {"source": lambda w: w.out / "no-such-h3.c"},
    "build-library": {"h3c_dir": lambda w: w.out / "no-such-h3.c"},
    "model download": {"directory": lambda w: w.out / "model"},
    "fleet": {"server": "http://127.0.0.1:9"},
    "hexgrid": {"width": "64", "height": "32", "output": lambda w: w.out / "grid.png"},
    "history": {},
    "stats": {},
    "lora fold": {"model_dir": lambda w: w.model, "loras": lambda w: w.lora, "output": lambda w: w.out / "folded"},
    "lora list": {"folders": lambda w: w.model},
    "lora prune": {"folders": lambda w: w.model, "max_size": "100G"},
    "serve": {"engine_path": lambda w: w.engine, "model_dir": lambda w: w.model, "data_dir": lambda w: w.out / "data",
              "host": "127.0.0.1", "port": "0"},
    "story": {"storyboard": lambda w: w.story, "output": lambda w: w.out / "film.mp4",
              "engine_path": lambda w: w.engine, "model_dir": lambda w: w.model},
    "selftest": {"engine_path": lambda w: w.engine, "model_dir": lambda w: w.model,
                 "output_dir": lambda w: w.out / "selftest"},
}
BASE_FLAGS: dict[str, list[str]] = {"generate": ["--quiet"], "demo": ["--quiet"], "story": ["--quiet"],
                                    "verify": ["--quiet"], "selftest": ["--quick"]}
# The flag that lets a command replace its output (so refusing a FIFO or a device is the
# command's own rule, not "it exists").
OVERWRITE_FLAGS = ("--overwrite",)


def subparser_for(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    current = parser
    for word in command.split():
        action = next(a for a in current._actions if isinstance(a, argparse._SubParsersAction))
        current = action.choices[word]
    return current


# Two arguments that give one value (`info -d PATH` or `info PATH`): feeding one, the base value
# of the other is left out (both given is refused).
SAME_VALUE: dict[str, str] = {"model_dir_positional": "model_dir"}


def build_argv(parser: argparse.ArgumentParser, command: str, world: CliWorld, override: Argument | None = None,
               value: str | None = None, *, overwrite: bool = False) -> list[str]:
    """The command's base invocation with `override`'s value replaced by `value` (`--flag=value`,
    so a value starting with "-" stays a value; positionals after "--")."""
    sub = subparser_for(parser, command)
    values = {dest: (given(world) if callable(given) else given)
              for dest, given in BASE_VALUES.get(command, {}).items()}
    options: list[str] = list(BASE_FLAGS.get(command, []))
    positionals: list[str] = []
    for action in sub._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if override is not None and action is override.action:
            shown = [value] * (action.nargs if isinstance(action.nargs, int) and action.nargs > 1 else 1)
        elif action.dest in values and action.nargs != 0 and (
                override is None or SAME_VALUE.get(action.dest, action.dest)
                != SAME_VALUE.get(override.action.dest, override.action.dest)):
            shown = [str(values[action.dest])]
        else:
            continue
        if action.option_strings:
            flag = ([o for o in action.option_strings if o.startswith("--")] or action.option_strings)[0]
            if len(shown) == 1:
                options.append(f"{flag}={shown[0]}")
            else:
                options += [flag, *shown]
        else:
            positionals += shown
    if overwrite and any(o in sub._option_string_actions for o in OVERWRITE_FLAGS):
        options.append(next(o for o in OVERWRITE_FLAGS if o in sub._option_string_actions))
    return [*command.split(), *options, *(["--", *positionals] if positionals else [])]


@dataclass(frozen=True)
class CliCase:
    argument: Argument
    hostile: Hostile
    argv: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.argument.name}: {self.hostile.name}"


def cli_cases(parser: argparse.ArgumentParser, world: CliWorld, arguments: Sequence[Argument]) -> list[CliCase]:
    cases: list[CliCase] = []
    for argument in arguments:
        kind = argument.kind
        if kind in (ArgKind.FLAG, None) or (argument.command, argument.action.dest) in NOT_FED:
            continue
        output = kind in (ArgKind.OUTPUT_FILE, ArgKind.OUTPUT_DIR)
        if kind in (ArgKind.INPUT_FILE, ArgKind.INPUT_DIR):
            hostiles = world.hostile.for_input(folder_expected=kind is ArgKind.INPUT_DIR)
        elif output:
            hostiles = world.hostile.for_output(folder_expected=kind is ArgKind.OUTPUT_DIR)
        elif kind in (ArgKind.NUMBER, ArgKind.SIGNED):
            hostiles = hostile_numbers(signed=kind is ArgKind.SIGNED)
        elif kind is ArgKind.CHOICE:
            hostiles = [Hostile("not a choice", "not-a-choice"), Hostile("control characters", CONTROL)]
        else:
            hostiles = hostile_strings()
        for hostile in hostiles:
            argv = build_argv(parser, argument.command, world, argument, str(hostile.value), overwrite=output)
            cases.append(CliCase(argument, hostile, tuple(argv)))
    return cases
