"""Issue 30: every command a message suggests runs as shown, where it is shown.

Each test triggers a refusal or a failure the way a user meets it (the `h3bridge` command line in
a subprocess, HOME and the working folder in the test's own folder), collects the commands its
message shows in backticks, runs each one it can exactly as shown (shlex.split of the text, an
argument list, no shell; a placeholder such as DIR replaced by a folder of the test's) and checks
that it does what the message says. Every test runs twice: with this environment's console
scripts first on PATH (the message shows `h3bridge ...`), and with PATH lacking them, as in a
ComfyUI install from requirements.txt (the message shows `<this python> -m h3bridge ...`, and that
form must run).

Not run, and why: `git clone` (network), `h3bridge model download` / `hf download` (the 134 GiB
release from the hub: only their programs are checked to start, with --help), and the full
differential run (hours); each is still checked for its form.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from core_helpers import sim_engine_path
from upstream_helpers import UPSTREAM_SOURCE_ENV, USER_CACHE, upstream_engine_or_skip

VENV_BIN = Path(sys.executable).parent
SCRIPTS = ("h3bridge", "h3-sim", "h3-sim-model", "h3-sim-lib", "hf")
MODULES = {"h3bridge": "h3bridge", "h3-sim-model": "h3bridge.sim.fixture_cli", "hf": "huggingface_hub.cli.hf"}
FAST = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2"]
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class User:
    """Where the user runs things: HOME and the working folder in the test's folder, and a PATH
    with this environment's console scripts first ("scripts") or without them ("python -m")."""

    mode: str
    home: Path
    env: dict[str, str]

    def run(self, words: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(words, cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout)

    def h3bridge(self, *arguments: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
        """h3bridge as the user types it in this mode."""
        start = ["h3bridge"] if self.mode == "scripts" else [sys.executable, "-m", "h3bridge"]
        return self.run([*start, *map(os.fspath, arguments)])

    def expected_start(self, script: str) -> list[str]:
        """How a message must spell `script` here: its console script when it is installed beside this
        Python and on PATH (`hf` is not, in an environment that borrows huggingface_hub), else `-m`."""
        if self.mode == "scripts" and (VENV_BIN / script).is_file():
            return [script]
        return [sys.executable, "-m", MODULES[script]]

    def run_as_shown(self, shown: str, placeholders: dict[str, Path | str] | None = None,
                     timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`shown` exactly as the message wrote it, placeholders (DIR, ...) replaced by the test's paths."""
        values = {name: os.fspath(value) for name, value in (placeholders or {}).items()}
        words = [values.get(word, word) for word in shlex.split(shown)]
        done = self.run(words, timeout=timeout)
        # the table for the note: every suggested command run, and its outcome
        print(f"\nSUGGESTED [{self.mode}] {shown}  ->  exit {done.returncode}")
        return done


@pytest.fixture(params=["scripts", "python -m"])
def user(request: pytest.FixtureRequest, tmp_path: Path) -> User:
    home = tmp_path / "home"
    home.mkdir()
    others = [entry for entry in os.environ.get("PATH", "").split(os.pathsep)
              if entry and Path(entry).resolve() != VENV_BIN.resolve()]
    path = [str(VENV_BIN), *others] if request.param == "scripts" else others
    env = {**os.environ, "HOME": str(home), "PATH": os.pathsep.join(path),
           "H3BRIDGE_CACHE_DIR": str(home / ".cache" / "h3bridge")}
    env.pop("H3_BIN", None)
    env.pop("H3_MODEL_DIR", None)
    return User(request.param, home, env)


def commands_in(text: str) -> list[str]:
    """The commands a message shows: its backticked spans that start with a program."""
    return [span for span in re.findall(r"`([^`\n]+)`", text) if " " in span or span in SCRIPTS]


def checkout_start(script: str) -> list[str] | None:
    """runnable's form for a checkout no Python has installed (`python CHECKOUT [--module M]`): what
    a process that imported h3bridge from the checkout it runs in shows when the scripts are not on
    PATH (an unpacked sdist beside a non-editable install; ComfyUI's custom_nodes clone)."""
    module = MODULES[script]
    if not module.startswith("h3bridge") or not (REPO_ROOT / "__main__.py").is_file():
        return None
    return [sys.executable, str(REPO_ROOT), *([] if module == "h3bridge" else ["--module", module])]


def suggested(text: str, user: User, script: str, *arguments: str) -> str:
    """The one command in `text` that runs `script arguments...`, checked to be in this mode's form
    (without the scripts on PATH: `python -m`, or for a checkout no Python installed, the checkout)."""
    starts = [user.expected_start(script)]
    if user.mode != "scripts" and checkout_start(script) is not None:
        starts.append(checkout_start(script))
    found = [c for c in commands_in(text) for start in starts
             if same_words(shlex.split(c)[:len(start) + len(arguments)], [*start, *arguments])]
    assert found, f"no `{shlex.join([*starts[0], *arguments])} ...` in: {text}"
    return found[0]


def is_this_python(word: str) -> bool:
    """`word` is this environment's Python (python or python3: the same program)."""
    return os.path.isabs(word) and Path(word).exists() and os.path.samefile(word, sys.executable)


def same_words(shown: list[str], expected: list[str]) -> bool:
    return len(shown) == len(expected) and all(
        a == b or (b == sys.executable and is_this_python(a)) for a, b in zip(shown, expected))


def assert_no_other_form(text: str, user: User) -> None:
    """No h3bridge command in `text` is spelled in the other mode's form (a command that would not run)."""
    for shown in commands_in(text):
        words = shlex.split(shown)
        if words[0] in SCRIPTS:
            assert user.expected_start(words[0]) == [words[0]], f"`{shown}` names a console script not on PATH here"
        elif is_this_python(words[0]) and words[1:2] == ["-m"]:
            script = next(name for name, module in MODULES.items() if module == words[2])
            assert user.expected_start(script)[0] == sys.executable, f"`{shown}`: `{script}` is on PATH here"
    assert "huggingface-cli" not in text


def probe_size(clip: Path) -> tuple[int, int]:
    done = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=width,height",
                           "-of", "json", str(clip)], capture_output=True, text=True, check=True, timeout=60)
    stream = json.loads(done.stdout)["streams"][0]
    return stream["width"], stream["height"]


def tiny_model(user: User, name: str = "tiny") -> Path:
    from h3bridge.sim.fixture import write_fixture_model
    return write_fixture_model(user.home / name)


def upstream_folder(user: User) -> Path | None:
    """H3_UPSTREAM_SOURCE as a folder (the tarball extracted here, named as it unpacks: h3.c-8974cc0)."""
    source = os.environ.get(UPSTREAM_SOURCE_ENV)
    if not source:
        return None
    if Path(source).is_dir():
        return Path(source)
    from h3bridge.engine_build.build import SOURCE_LIMITS
    from h3bridge.safeio.archives import unpack_tar
    (user.home / "src").mkdir(parents=True, exist_ok=True)
    unpack_tar(source, user.home / "src", SOURCE_LIMITS)       # the project's one way (any Python 3.10+)
    return next((user.home / "src").glob("*/h3.h")).parent


# ----------------------------------------------------------------------------- engine not found

def test_engine_not_found_suggests_commands_that_run(user: User) -> None:
    model = tiny_model(user)
    done = user.h3bridge("generate", "-p", "a fox", *FAST, "-d", model, "--engine-path", user.home / "nope" / "h3",
                         "-o", user.home / "fox.mp4")
    assert done.returncode == 2, done.stderr
    message = done.stderr
    assert_no_other_form(message, user)
    assert "engine_path" not in message and "--engine-path" in message
    # the README's way: the pinned commit, then build-engine (not an unpinned clone && make)
    assert "`git clone https://github.com/antirez/h3.c DIR`" in message and "`git -C DIR checkout 8974cc0`" in message
    assert "&& make" not in message

    demo = user.run_as_shown(suggested(message, user, "h3bridge", "demo"))
    assert demo.returncode == 0, demo.stderr
    assert probe_size(user.home / "h3bridge-demo.mp4")[0] > 0

    fixture = user.run_as_shown(suggested(message, user, "h3-sim-model", "DIR"), {"DIR": user.home / "fixture"})
    assert fixture.returncode == 0, fixture.stderr
    verify = user.h3bridge("verify", user.home / "fixture")
    assert verify.returncode == 0 and "OK" in verify.stdout, verify.stdout + verify.stderr
    # "or give SIM as --engine-path with a model from `h3-sim-model DIR`": that engine and that model render
    simulator = re.search(r"or give (\S+) as --engine-path with a model", message)
    assert simulator, message
    rendered = user.h3bridge("generate", "-p", "a fox", *FAST, "-d", user.home / "fixture", "--engine-path",
                             simulator[1], "-o", user.home / "sim.mp4")
    print(f"\nSUGGESTED [{user.mode}] give {simulator[1]} as --engine-path  ->  exit {rendered.returncode}")
    assert rendered.returncode == 0 and probe_size(user.home / "sim.mp4") == (96, 64), rendered.stderr

    realistic = user.run_as_shown(suggested(message, user, "h3-sim-model", "--realistic", "DIR"),
                                  {"DIR": user.home / "realistic"})
    assert realistic.returncode == 0 and "sparse" in realistic.stdout, realistic.stderr
    info = user.h3bridge("info", user.home / "realistic")
    assert info.returncode == 0 and "small fixture" not in info.stdout, info.stdout + info.stderr

    build = suggested(message, user, "h3bridge", "build-engine", "DIR")
    folder = upstream_folder(user)
    if folder is None:
        pytest.skip(f"{UPSTREAM_SOURCE_ENV} is not set: `{build}` not run")
    upstream_engine_or_skip()        # built once into the user cache: the command below is a cache hit
    user.env["H3BRIDGE_CACHE_DIR"] = str(USER_CACHE)
    built = user.run_as_shown(build, {"DIR": folder}, timeout=900)
    assert built.returncode == 0, built.stderr
    program, library = (Path(line) for line in built.stdout.splitlines()[-2:])
    assert program.name == "h3" and os.access(program, os.X_OK) and library.is_file()
    # the folder the tarball unpacks to is no git clone, yet the build's commit is known (issue 30)
    doctor = user.h3bridge("doctor", "--engine-path", program, "-d", user.home / "realistic")
    assert "h3.c 8974cc0, the pinned commit" in doctor.stdout, doctor.stdout


def test_doctor_prints_its_fixes_in_flags(user: User) -> None:
    done = user.h3bridge("doctor", "--engine-path", user.home / "nope" / "h3", "-d", user.home / "no-model")
    assert done.returncode != 0
    assert_no_other_form(done.stdout, user)
    assert "(CLI:" not in done.stdout and "engine_path" not in done.stdout and "--engine-path" in done.stdout
    as_json = json.loads(user.h3bridge("doctor", "--engine-path", user.home / "nope" / "h3", "--json").stdout)
    fixes = " ".join(check["fix"] or "" for check in as_json["checks"])
    assert "--engine-path" in fixes and "engine_path" not in fixes and "(CLI:" not in fixes
    # without a model, the memory line points at `plan`: it runs, and says what the default request needs
    plan = re.search(r"see `([^`]+)`", done.stdout)
    if plan is not None:
        planned = user.run_as_shown(plan[1])
        assert planned.returncode in (0, 1) and "peak" in planned.stdout, planned.stdout + planned.stderr


# ----------------------------------------------------------------------------- canvas

def test_the_canvas_suggestion_renders(user: User) -> None:
    model = tiny_model(user)
    engine = sim_engine_path()
    base = ["-p", "a fox", "--frames", "22", "--steps", "2", "-d", model, "--engine-path", engine]
    done = user.h3bridge("generate", *base, "--width", "1920", "--height", "1080", "-o", user.home / "fox.mp4")
    assert done.returncode == 2 and "768*1344" in done.stderr, done.stderr
    fix = re.search(r"fix: use (--width \d+) and (--height \d+)", done.stderr)
    assert fix, done.stderr
    flags = [*shlex.split(fix[1]), *shlex.split(fix[2])]
    print(f"\nSUGGESTED [{user.mode}] use {fix[1]} and {fix[2]}  ->  ", end="")
    rendered = user.h3bridge("generate", *base, *flags, "-o", user.home / "fox.mp4")
    print(f"exit {rendered.returncode}")
    assert rendered.returncode == 0, rendered.stderr
    assert probe_size(user.home / "fox.mp4") == (1344, 768)


# ----------------------------------------------------------------------------- model folders

def test_model_messages_suggest_commands_that_run(user: User) -> None:
    model = tiny_model(user)
    engine = sim_engine_path()
    # a folder that is not there, and a repack file given as the folder: what it is, and the download
    repack = user.home / "minimax_h3_fl2va_bf16.safetensors"
    repack.write_bytes(b"\0" * 64)
    for given, words in ((user.home / "nothing", "does not exist"), (repack, "single-file checkpoint")):
        done = user.h3bridge("generate", "-p", "a fox", *FAST, "-d", given, "--engine-path", engine,
                             "-o", user.home / "fox.mp4")
        assert done.returncode == 2 and words in done.stderr, done.stderr
        assert_no_other_form(done.stderr, user)
        download = suggested(done.stderr, user, "h3bridge", "model", "download", "DIR")
        hub = suggested(done.stderr, user, "hf", "download", "MiniMaxAI/MiniMax-H3")
        for shown in (download, hub):       # 134 GiB from the hub is not fetched here: the program starts
            words = shlex.split(shown)
            started = user.run([*words[:words.index("download") + 1], "--help"])
            print(f"\nSUGGESTED [{user.mode}] {shown}  ->  not run (network); its program with --help: exit "
                  f"{started.returncode}")
            assert started.returncode == 0, started.stderr
    # an incomplete model: the first problem, and the command that lists them all
    (model / "FL2VA" / "transformer" / "config.json").unlink()
    (model / "FL2VA" / "tokenizer" / "tokenizer.json").unlink()
    done = user.h3bridge("generate", "-p", "a fox", *FAST, "-d", model, "--engine-path", engine,
                         "-o", user.home / "fox.mp4")
    assert done.returncode == 2, done.stderr
    listed = user.run_as_shown(suggested(done.stderr, user, "h3bridge", "info", "-d", str(model)))
    assert "transformer/config.json" in listed.stdout and "tokenizer/tokenizer.json" in listed.stdout, listed.stdout
    # a good model: info's OK line names the checksum run
    good = tiny_model(user, "good")
    info = user.h3bridge("info", good)
    assert info.returncode == 0, info.stderr
    assert_no_other_form(info.stdout, user)
    checked = user.run_as_shown(suggested(info.stdout, user, "h3bridge", "verify", "-d", str(good), "--checksums"))
    assert checked.returncode == 0 and "sha256" in checked.stdout, checked.stdout + checked.stderr


# ----------------------------------------------------------------------------- the small fixture on upstream's h3

def test_the_small_fixture_on_upstreams_h3_suggests_the_realistic_one(user: User) -> None:
    engine = upstream_engine_or_skip().program
    model = tiny_model(user)
    verify = user.h3bridge("verify", model)
    assert verify.returncode == 0 and "small fixture" in verify.stdout, verify.stdout
    doctor = user.h3bridge("doctor", "--engine-path", engine, "-d", model)
    assert re.search(r"MISSING model .*small fixture", doctor.stdout), doctor.stdout
    done = user.h3bridge("generate", "-p", "a fox", *FAST, "-d", model, "--engine-path", engine,
                         "-o", user.home / "fox.mp4")
    assert done.returncode == 1, done.stderr
    # upstream's own words, then the fix (not "check the model directory", which verify then passes)
    assert "weight model.language_model.embed_tokens.weight shape mismatch at dimension 0" in done.stderr
    assert_no_other_form(done.stderr, user)
    assert "--ssd-streaming" in done.stderr
    realistic = user.run_as_shown(suggested(done.stderr, user, "h3-sim-model", "--realistic", "DIR"),
                                  {"DIR": user.home / "realistic"})
    assert realistic.returncode == 0, realistic.stderr
    # "give DIR as --model-dir, with --ssd-streaming on a machine under ~32 GB"
    rendered = user.h3bridge("generate", "-p", "a fox", *FAST, "-d", user.home / "realistic", "--ssd-streaming",
                             "--engine-path", engine, "-o", user.home / "fox.mp4")
    print(f"\nSUGGESTED [{user.mode}] generate -d DIR --ssd-streaming on upstream's h3  ->  exit {rendered.returncode}")
    assert rendered.returncode == 0, rendered.stderr
    assert probe_size(user.home / "fox.mp4") == (96, 64)


# ----------------------------------------------------------------------------- the differential report

def test_the_differential_report_without_a_run_names_commands_that_run(user: User) -> None:
    done = user.run([sys.executable, str(REPO_ROOT / "bench" / "differential.py"), "--report",
                     "--out", str(user.home / "bench")])
    assert done.returncode == 2 and "no run is recorded" in done.stderr, done.stdout + done.stderr
    assert_no_other_form(done.stderr, user)
    build = suggested(done.stderr, user, "h3bridge", "build-engine", "H3C_SOURCE")
    record = next(c for c in commands_in(done.stderr) if "differential.py" in c)
    assert is_this_python(shlex.split(record)[0]) and shlex.split(record)[1] == str(REPO_ROOT / "bench" / "differential.py")
    print(f"\nSUGGESTED [{user.mode}] {record}  ->  not run (the full differential run takes hours)")
    source = os.environ.get(UPSTREAM_SOURCE_ENV)
    if not source:
        pytest.skip(f"{UPSTREAM_SOURCE_ENV} is not set: `{build}` not run")
    upstream_engine_or_skip()
    user.env["H3BRIDGE_CACHE_DIR"] = str(USER_CACHE)          # the shared build: a cache hit
    built = user.run_as_shown(build, {"H3C_SOURCE": source}, timeout=900)
    assert built.returncode == 0, built.stderr
    assert all(Path(line).is_file() for line in built.stdout.splitlines()[-2:])


# upstream's h3 at 8974cc0 on h3-sim's small fixture, verbatim from a run of build-engine's build
# (its stderr's last line is "h3: weight ... at dimension 0"; h3bridge reads the message after "h3: ")
UPSTREAM_SHAPE_MISMATCH = "weight model.language_model.embed_tokens.weight shape mismatch at dimension 0"


def test_the_shape_mismatch_fix_depends_on_the_model(tmp_path: Path) -> None:
    """Without upstream's build at hand too: the fix for upstream's own words names the realistic
    fixture when the model is the small one, and the official download otherwise."""
    from core_helpers import fast_request
    from h3bridge.engines.hints import failure_hint
    from h3bridge.fixes import python_words, said
    from h3bridge.sim.fixture import write_fixture_model
    small = write_fixture_model(tmp_path / "small")
    # the hint is a Fix (its settings as data, h3bridge.fixes): read here as Python says it
    fix = said(failure_hint(fast_request(), UPSTREAM_SHAPE_MISMATCH, model_dir=small), python_words) or ""
    assert "small fixture" in fix and "--realistic DIR`" in fix and "ssd_streaming" in fix, fix
    assert "check the model directory" not in fix
    realistic = write_fixture_model(tmp_path / "realistic", realistic=True, ref2va=False)
    fix = said(failure_hint(fast_request(), UPSTREAM_SHAPE_MISMATCH, model_dir=realistic), python_words) or ""
    assert "small fixture" not in fix and f"info -d {realistic}`" in fix and "model download DIR`" in fix, fix


def test_doctor_fails_the_small_fixture_for_an_engine_that_is_not_h3_sim(tmp_path: Path) -> None:
    """`doctor` said "ok model" for the small fixture beside build-engine's h3, which refuses it."""
    from h3bridge.sim.fixture import write_fixture_model
    small = write_fixture_model(tmp_path / "small")
    engine = tmp_path / "h3.c" / "h3"             # any h3 that is not the simulator
    engine.parent.mkdir()
    engine.write_text("#!/bin/sh\nexit 0\n")
    engine.chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path), "H3BRIDGE_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "h3bridge", "doctor", "--engine-path", str(engine), "-d", str(small)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert re.search(r"^MISSING model .*small fixture", done.stdout, re.M), done.stdout
    assert "--realistic DIR`" in done.stdout
    done = subprocess.run([sys.executable, "-m", "h3bridge", "doctor", "--engine-path", str(sim_engine_path()),
                           "-d", str(small)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert re.search(r"^ok +model .*small fixture", done.stdout, re.M), done.stdout
