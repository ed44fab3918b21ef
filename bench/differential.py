"""Differential checks: h3-sim and the libh3 C double against upstream h3.c's own code.

    python bench/differential.py --upstream-h3 PATH/h3 --upstream-lib PATH/libh3.so [-j2]
        [--out DIR] [--only CATEGORY ...] [--sample N] [--timeout S] [--resume] [--report]

Runs every case of bench/differential_cases.py (>= 2,000 CLI argument lists, >= 200
interactive-session scripts, >= 500 C-API calls) on both sides and prints, per category, how
many cases (and, for the C API, calls) agree, with the aspect that differs: exit status, the
stderr message lines, the progress phase sequence, stdout, files written (names; PPM sizes;
for MP4s the video's width, height and frame count and the audio's rate, channels and sample
count, never pixel values or byte sizes, which depend on the pixels a backend fills), return
values and h3_last_error text. Without --upstream-h3 the upstream side is skipped (nothing to
compare); `--upstream-h3 sim` compares the simulator with itself (a check of the runner).

What is normalised, on both sides alike (and nothing else):
  - the case's own folder (a fresh one per side) -> {CASE}; the workspace -> {WS}
  - the interactive session folder /tmp/h3-XXXXXX -> /tmp/h3-{SESSION} (mkdtemp's random name)
  - timings: "Done -> PATH [1.23s]" -> [{T}s]; numbers in "h3 profile:" lines (times and
    allocations, the backend's own) -> {N}, with their padding
  - FFmpeg's own log lines name an object's address ("[NULL @ 0x55...]") -> {ADDRESS}
  - a random seed ("Seed: " followed by 6+ digits, only ever printed for `!seed random`) and
    `!save`'s default name h3-<time(NULL)>.mp4
Both programs run with argv[0] = "h3", cwd = the case folder, HOME = {CASE}/home, TERM=dumb,
LANG=C.UTF-8, H3_SIM_TIME_SCALE=0 (a simulator variable upstream ignores), and a silent `open`
first on PATH (the session's `!open` spawns it; see _environment).

Results are kept in DIR (default bench/.differential): each side's observations as JSON
lines, appended as each case ends (OUT/sim.jsonl, OUT/upstream.jsonl), so `--resume` after a
stop runs only what is missing (and what timed out); differences.jsonl holds both sides of every
disagreement; `--report` prints the figures and every difference again from the stored
observations without running anything; --reuse-upstream takes the upstream observations of the
previous run instead of running upstream again.

The figures: per category, the cases, those both sides ran to an outcome (neither timed out),
those that agree and those that differ, each difference listed under its cause; a cause that is
the platform's (glibc vs macOS libc, Linux vs macOS kernel) is a KnownDifference naming the place
in upstream's source. The exit status is 1 when some difference has no known cause.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from differential_cases import build_workspace, count_calls, generate_cases  # noqa: E402

SIM_SNIPPET = ("import sys; sys.argv[0] = 'h3'; from h3bridge.sim.cli import main; "
               "sys.exit(main())")
ASPECTS = ("status", "messages", "phases", "stdout", "files", "calls")


@dataclass(frozen=True)
class Side:
    """One implementation: a way to run `h3 ARGS...` and a libh3 shared library.

    `forked`: h3-sim runs in a child forked from a server that has already imported it
    (multiprocessing's forkserver) instead of a fresh interpreter: the same program, with its
    own pid, session, cwd, environment, fds 0-2 (stdin a pipe holding the script), argv[0]
    "h3" and exit status, at a fiftieth of the start-up cost. `--sim-exec` runs it as a
    fresh process instead; both give the same observations (checked with --compare-sim-modes)."""

    name: str
    command: tuple[str, ...]     # argv before the case's arguments; argv[0] is set to "h3"
    library: str | None
    forked: bool = False

    @classmethod
    def sim(cls, *, forked: bool = True) -> "Side":
        from h3bridge.sim.library import build_double
        return cls("sim", (sys.executable, "-c", SIM_SNIPPET), str(build_double()), forked)

    @classmethod
    def upstream(cls, h3: str, library: str | None) -> "Side":
        return cls("upstream", (str(Path(h3).resolve()),), library and str(Path(library).resolve()))

    def argv(self, args: list[str]) -> tuple[str, list[str]]:
        """(executable, argv) with argv[0] = "h3" as main.c sees it."""
        if self.command[0] == sys.executable:
            return sys.executable, [sys.executable, *self.command[1:], *args]
        return self.command[0], ["h3", *self.command[1:], *args]


# ---------------------------------------------------------------- running

def _resolve(text: str, workspace: Path, case_dir: Path) -> str:
    def replace(match: re.Match[str]) -> str:
        kind, name = match.group(1), match.group(2)
        if kind == "MODEL":
            return str(workspace / "models" / name)
        if kind == "MEDIA":
            return str(workspace / "media" / name)
        return str(case_dir)
    return re.sub(r"\{(MODEL|MEDIA|CASE)(?::([^}]*))?\}", replace, text)


OPEN_STAND_IN = Path("bin/open")     # under the workspace; see _environment


def _write_open_stand_in(workspace: Path) -> None:
    path = workspace / OPEN_STAND_IN
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        temporary = path.with_name(f".open.{os.getpid()}.{threading.get_ident()}")
        temporary.write_text("#!/bin/sh\n# macOS open(1) prints nothing when it opens a file\nexit 0\n")
        temporary.chmod(0o755)
        temporary.rename(path)


def _environment(case: dict[str, object], workspace: Path, case_dir: Path) -> dict[str, str]:
    # The session's `!open` spawns `open PATH` (h3_cli.c open_video, and h3-sim alike) without
    # waiting: on a Mac LaunchServices opens the clip and prints nothing; Linux's `open` is
    # xdg-open, whose "not found" lines land in the session's stderr at a moment of its own.
    # Both sides get a silent `open`, as on a Mac.
    path = f"{workspace / OPEN_STAND_IN.parent.name}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env = {"PATH": path, "HOME": str(case_dir / "home"),
           "TERM": "dumb", "LANG": "C.UTF-8", "H3_SIM_TIME_SCALE": "0", "H3_SIM_SHADERS": "1",
           "PYTHONPATH": str(HERE.parent)}
    for key, value in dict(case.get("env") or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = _resolve(str(value), workspace, case_dir)
    return env


def _run_process(executable: str, argv: list[str], env: dict[str, str], cwd: Path, stdin: bytes,
                 timeout: float) -> tuple[int | str, bytes, bytes]:
    process = subprocess.Popen(argv, executable=executable, env=env, cwd=cwd,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(stdin, timeout=timeout)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        return "timeout", out, err


_FORKSERVER = None


def _forkserver():
    global _FORKSERVER
    if _FORKSERVER is None:
        import multiprocessing
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["h3bridge.sim.cli", "h3bridge.sim.interactive",
                                        "h3bridge.sim.engine"])
        _FORKSERVER = context
    return _FORKSERVER


def _sim_child(args: list[str], env: dict[str, str], cwd: str, stdin: bytes, out: str, err: str,
               status: str) -> None:
    """The body of a forked h3-sim run (see Side)."""
    os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    read, write = os.pipe()
    os.write(write, stdin)      # scripts are far below a pipe's 64 KiB: no writer needed
    os.close(write)
    os.dup2(read, 0)
    os.close(read)
    for fd, path in ((1, out), (2, err)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    sys.argv = ["h3", *args]
    from h3bridge.sim.cli import main as sim_main
    code = sim_main()
    sys.stdout.flush()
    sys.stderr.flush()
    # multiprocessing reports 255 when reading a child's status from the forkserver fails
    # (seen once in 2,000 runs); the child's own word is kept beside it.
    with open(status, "w") as handle:
        handle.write(str(code))
    os._exit(code)


def _run_forked(args: list[str], env: dict[str, str], cwd: Path, stdin: bytes,
                timeout: float, scratch: Path) -> tuple[int | str, bytes, bytes]:
    out, err = scratch.with_suffix(".out"), scratch.with_suffix(".err")
    said = scratch.with_suffix(".status")
    process = _forkserver().Process(target=_sim_child,
                                    args=(args, env, str(cwd), stdin, str(out), str(err), str(said)))
    process.start()
    process.join(timeout)
    status: int | str
    if process.is_alive():
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.join()
        status = "timeout"
    else:
        status = process.exitcode   # type: ignore[assignment]
        if said.exists():
            status = int(said.read_text())
            said.unlink()
        try:
            os.killpg(process.pid, signal.SIGKILL)   # what the run left behind (as Popen's would)
        except (ProcessLookupError, PermissionError):
            pass
    data = out.read_bytes(), err.read_bytes()
    out.unlink()
    err.unlink()
    return status, data[0], data[1]


def _media_facts(path: Path) -> object:
    """An MP4's stream facts (never pixel values or byte sizes)."""
    import av
    try:
        with av.open(str(path)) as container:
            facts: dict[str, object] = {}
            for stream in container.streams:
                if stream.type == "video":
                    packets = sum(1 for packet in container.demux(stream) if packet.size)
                    facts["video"] = [stream.codec_context.width, stream.codec_context.height, packets]
            container.seek(0)
            for stream in container.streams:
                if stream.type == "audio":
                    samples = sum(frame.samples for frame in container.decode(stream))
                    facts["audio"] = [stream.codec_context.sample_rate,
                                      stream.codec_context.channels, samples]
            return facts
    except Exception as error:   # a half-written or broken file is a fact too
        return f"unreadable: {type(error).__name__}"


def _files(root: Path) -> dict[str, object]:
    found: dict[str, object] = {}
    if not root.exists():
        return found
    for path in sorted(root.rglob("*")):
        relative = str(path.relative_to(root))
        if relative in ("capi-case.json", "capi-result.json", SHADERS):
            continue
        if path.is_symlink():
            found[relative] = "symlink"
        elif path.is_dir():
            found[relative + "/"] = "dir"
        elif path.suffix == ".mp4":
            found[relative] = _media_facts(path)
        elif path.name == ".h3_history":
            found[relative] = path.read_text(errors="replace")
        else:
            found[relative] = path.stat().st_size
    return found


SHADERS = "h3_shaders.metal"
SESSION_DIR = re.compile(r"/tmp/h3-[A-Za-z0-9]{6}")
PROGRESS = re.compile(r"\r(.{25}) +(-?\d+)/(-?\d+) *")


def _session_files(stdout: str) -> dict[str, object]:
    """The interactive session's mkdtemp folder: its files, then the folder is removed."""
    found: dict[str, object] = {}
    for folder in sorted(set(SESSION_DIR.findall(stdout))):
        path = Path(folder)
        if path.is_dir():
            for name, facts in _files(path).items():
                found[f"/tmp/h3-{{SESSION}}/{name}"] = facts
            shutil.rmtree(path, ignore_errors=True)
    return found


def normalise(text: str, case_dir: Path, workspace: Path) -> str:
    text = text.replace(str(case_dir), "{CASE}").replace(str(workspace), "{WS}")
    text = SESSION_DIR.sub("/tmp/h3-{SESSION}", text)
    text = re.sub(r"\[\d+\.\d+s\]", "[{T}s]", text)
    text = re.sub(r"Seed: \d{6,}", "Seed: {RANDOM}", text)
    text = re.sub(r"h3-\d{9,}\.mp4", "h3-{TIME}.mp4", text)
    return _value_rules(text)


def _value_rules(text: str) -> str:
    """The rules for values (not paths), also applied when stored observations are compared."""
    text = re.sub(r"\[(\w+) @ 0x[0-9a-f]+\]", r"[\1 @ {ADDRESS}]", text)   # FFmpeg's log context
    text = re.sub(r"^(h3 profile:.*)$", lambda m: re.sub(r"= *(-?\d+(\.\d+)?|\{N\})", "={N}", m.group(1)),
                  text, flags=re.M)
    return text


def split_stderr(text: str) -> tuple[list[str], list[list[object]]]:
    """(message lines, progress records) of an h3 stderr stream (main.c cli_progress format)."""
    phases = [[m.group(1).rstrip(), int(m.group(2)), int(m.group(3))] for m in PROGRESS.finditer(text)]
    rest = PROGRESS.sub("\n", text)
    return [line for line in rest.split("\n") if line.strip()], phases


def run_case(side: Side, case: dict[str, object], workspace: Path, runs: Path,
             timeout: float, shaders: Path) -> dict[str, object]:
    case_dir = runs / side.name / str(case["id"])
    if case_dir.exists():
        shutil.rmtree(case_dir)
    (case_dir / "home").mkdir(parents=True)
    # Upstream compiles its shaders from the working directory: every case runs beside them
    # (and h3-sim checks the same with H3_SIM_SHADERS=1, set in _environment).
    (case_dir / SHADERS).symlink_to(shaders)
    _write_open_stand_in(workspace)
    env = _environment(case, workspace, case_dir)
    started = time.monotonic()
    if case["kind"] == "capi":
        observation = _run_capi(side, case, workspace, case_dir, env, timeout)
    else:
        args = [_resolve(arg, workspace, case_dir) for arg in case["args"]]   # type: ignore[union-attr]
        stdin = _resolve(str(case.get("stdin") or ""), workspace, case_dir)
        data = stdin.encode("utf-8", "surrogateescape")
        if side.forked:
            status, out, err = _run_forked(args, env, case_dir, data, timeout,
                                           runs / side.name / f".{case['id']}")
        else:
            executable, argv = side.argv(args)
            status, out, err = _run_process(executable, argv, env, case_dir, data, timeout)
        stdout = out.decode("utf-8", "replace")
        files = _files(case_dir)
        files.update(_session_files(stdout))
        messages, phases = split_stderr(normalise(err.decode("utf-8", "replace"), case_dir, workspace))
        observation = {"status": status, "messages": messages, "phases": phases,
                       "stdout": normalise(stdout, case_dir, workspace),
                       "files": json.loads(normalise(json.dumps(files), case_dir, workspace))}
    observation["seconds"] = round(time.monotonic() - started, 2)
    shutil.rmtree(case_dir, ignore_errors=True)
    return observation


def _run_capi(side: Side, case: dict[str, object], workspace: Path, case_dir: Path,
              env: dict[str, str], timeout: float) -> dict[str, object]:
    if side.library is None:
        return {"status": "no library"}
    model = case["model"]
    spec = {"model": model if model in (None, "") else str(workspace / "models" / str(model)),
            "ops": case["ops"], "media": str(workspace / "media"), "case_dir": str(case_dir)}
    (case_dir / "capi-case.json").write_text(json.dumps(spec))
    result_path = case_dir / "capi-result.json"
    status, out, err = _run_process(
        sys.executable, [sys.executable, str(HERE / "differential_capi.py"), side.library,
                         str(case_dir / "capi-case.json"), str(result_path)],
        env, case_dir, b"", timeout)
    try:
        calls = json.loads(result_path.read_text())
    except (OSError, ValueError):
        calls = []
    messages, phases = split_stderr(normalise(err.decode("utf-8", "replace"), case_dir, workspace))
    # A Python traceback of the worker is the runner's problem, kept whole for reading.
    return {"status": status, "messages": messages, "phases": phases,
            "stdout": normalise(out.decode("utf-8", "replace"), case_dir, workspace),
            "files": json.loads(normalise(json.dumps(_files(case_dir)), case_dir, workspace)),
            "calls": json.loads(normalise(json.dumps(calls), case_dir, workspace))}


# ---------------------------------------------------------------- comparing

# getopt_long's diagnostics come from the C library: upstream on a Mac prints Apple Libc's
# (which h3-sim mirrors), a Linux build of upstream glibc's ("'--x'" for "`--x'", the full
# option name where Apple repeats what was typed, a "possibilities:" list). Compared as kinds.
GETOPT_LINES = [
    (re.compile(r"^(h3: )unrecognized option [`'](.*)'$"), r"\1<getopt: unrecognized \2>"),
    (re.compile(r"^(h3: )option [`'](.*)' is ambiguous(; possibilities:.*)?$"), r"\1<getopt: ambiguous>"),
    (re.compile(r"^(h3: )option [`'](.*)' doesn't allow an argument$"), r"\1<getopt: no argument>"),
    (re.compile(r"^(h3: )option [`'](.*)' requires an argument$"), r"\1<getopt: requires>"),
    (re.compile(r"^(h3: )(?:invalid|illegal) option -- '?(.)'?$"), r"\1<getopt: invalid \2>"),
    (re.compile(r"^(h3: )option requires an argument -- '?(.)'?$"), r"\1<getopt: requires \2>"),
]


def libc_normalise(observation: dict[str, object], *, libc: bool = True) -> dict[str, object]:
    messages = []
    for line in observation.get("messages") or []:   # type: ignore[union-attr]
        line = _value_rules(line)
        for pattern, replacement in GETOPT_LINES if libc else ():
            line = pattern.sub(replacement, line)
        messages.append(line)
    return {**observation, "messages": messages, "stdout": _value_rules(str(observation.get("stdout", "")))}


_EMPTY_NUMBER = re.compile(r"^h3: invalid (width|height|render width|render height|frames|steps|reuse|"
                           r"layers|core reuse|zoom|seed): $")


def _error_lines(observation: dict[str, object]) -> list[str]:
    """The engine's error text of an observation: the CLI's stderr message lines, and the
    h3_last_error text of each C-API call (the library reports the same failures)."""
    lines = [str(line) for line in observation.get("messages") or []]   # type: ignore[union-attr]
    lines += [str(call.get("error")) for call in observation.get("calls") or []   # type: ignore[union-attr]
              if isinstance(call, dict) and call.get("error")]
    return lines


@dataclass(frozen=True)
class KnownDifference:
    """A cause of differences that is the platform's, not h3-sim's: upstream on a Mac (which h3-sim
    and the double mirror) and upstream built here part because the C library or the kernel does,
    in the named place of upstream's source."""

    name: str
    explanation: str

    def matches(self, sim: dict[str, object], upstream: dict[str, object]) -> bool:
        if self is EMPTY_NUMBER:
            messages = sim.get("messages") or []
            return bool(messages) and bool(_EMPTY_NUMBER.match(str(messages[0]))) and not any(  # type: ignore[index]
                _EMPTY_NUMBER.match(str(line)) for line in upstream.get("messages") or [])   # type: ignore[union-attr]
        if self is VAE_CONFIG_FOLDER:
            return any(re.match(r"^(h3: )?cannot read (video|audio) VAE config ", line)
                       for line in _error_lines(sim)) and any(
                re.match(r"^(h3: )?invalid (video|audio) VAE config ", line) for line in _error_lines(upstream))
        return False


EMPTY_NUMBER = KnownDifference(
    "empty number (libc strtol)",
    "`--width ''` and the other numeric flags given an empty value: main.c parse_int (lines 66-75) "
    "and parse_u64 (lines 95-103) refuse a value when strtol/strtoull set errno or stop before "
    "its end. On an empty string nothing converts; macOS libc sets errno = EINVAL, so upstream on "
    "a Mac (and h3-sim) prints \"h3: invalid width: \" and exits 2; glibc leaves errno 0 (C and "
    "POSIX make EINVAL optional) and *end is the terminating NUL, so the Linux build takes 0 and "
    "goes on to a later check or a render")
VAE_CONFIG_FOLDER = KnownDifference(
    "a folder as a VAE config.json (kernel/libc)",
    "a directory where the video or audio VAE's config.json belongs: h3_video_vae.c lines "
    "280-297 (and h3_audio_vae.c 311-327, h3_video_encoder.c 250-264) fopen it, fseek to the end "
    "and check 1 <= ftell <= 1 MiB before fread. On macOS a directory's end is its small "
    "st_size, the check passes and fread fails with EISDIR: \"cannot read video VAE config\"; on "
    "Linux lseek(SEEK_END) of an ext4 directory returns the end of its htree hash space "
    "(ftell = LLONG_MAX, measured here), so the size check fails first: \"invalid video VAE config\"")
KNOWN_DIFFERENCES = (EMPTY_NUMBER, VAE_CONFIG_FOLDER)


def known_difference(sim: dict[str, object], upstream: dict[str, object]) -> KnownDifference | None:
    """The platform cause of a difference (None when h3-sim or the double is to blame)."""
    sim, upstream = libc_normalise(sim), libc_normalise(upstream)
    return next((known for known in KNOWN_DIFFERENCES if known.matches(sim, upstream)), None)


def platform_reason(sim: dict[str, object], upstream: dict[str, object]) -> str | None:
    """Why a difference is the C library's, not h3-sim's (None when it is not explained)."""
    known = known_difference(sim, upstream)
    return known.explanation if known else None


def differing_aspects(a: dict[str, object], b: dict[str, object], *, libc: bool = True) -> list[str]:
    a, b = libc_normalise(a, libc=libc), libc_normalise(b, libc=libc)
    return [aspect for aspect in ASPECTS if a.get(aspect) != b.get(aspect)]


def calls_agreeing(a: dict[str, object], b: dict[str, object], case: dict[str, object]) -> tuple[int, int]:
    """(agreeing, total) C-API calls of a case: one per op plus h3_load_dir; a call missing on
    one side (a crash) disagrees."""
    left, right = a.get("calls") or [], b.get("calls") or []
    total = max(len(left), len(right))   # type: ignore[arg-type]
    agree = sum(1 for index in range(total)
                if index < len(left) and index < len(right) and left[index] == right[index])   # type: ignore[index,arg-type]
    return agree, total


def ran(observation: dict[str, object] | None) -> bool:
    """The side produced an outcome: not killed by the runner's timeout (and, for the C API, it
    has a library)."""
    return observation is not None and observation.get("status") not in ("timeout", "no library")


CLI_CATEGORIES = ("cli-args", "cli-validate", "cli-model", "cli-env", "cli-render")


def summarise(cases: list[dict[str, object]], sim: dict[str, dict], upstream: dict[str, dict]) -> dict[str, Counter]:
    """Per category: cases, both ran, agree, differ (of those, explained by a KnownDifference),
    the differing aspects and, for the C API, the calls."""
    table: dict[str, Counter] = defaultdict(Counter)
    for case in cases:
        key = str(case["id"])
        row = table[str(case["category"])]
        row["cases"] += 1
        if not (ran(sim.get(key)) and ran(upstream.get(key))):
            continue
        row["both ran"] += 1
        aspects = differing_aspects(sim[key], upstream[key])
        row["agree"] += not aspects
        row["differ"] += bool(aspects)
        row["explained"] += bool(aspects) and known_difference(sim[key], upstream[key]) is not None
        row["libc"] += not aspects and bool(differing_aspects(sim[key], upstream[key], libc=False))
        for aspect in aspects:
            row[aspect] += 1
        if case["kind"] == "capi":
            agree, total = calls_agreeing(sim[key], upstream[key], case)
            row["calls"] += total
            row["calls agree"] += agree
    return table


def print_table(table: dict[str, Counter]) -> None:
    print(f"{'category':<14} {'cases':>6} {'both ran':>8} {'agree':>6} {'%':>6} {'differ':>6} "
          f"{'explained':>9}   differing aspects")

    def line(name: str, row: Counter) -> None:
        aspects = ", ".join(f"{a} {row[a]}" for a in ASPECTS if a != "calls" and row[a])
        share = 100.0 * row["agree"] / row["both ran"] if row["both ran"] else 0.0
        extra = f"{'; ' if aspects else ''}calls {row['calls agree']}/{row['calls']} agree" if row["calls"] else ""
        print(f"{name:<14} {row['cases']:6d} {row['both ran']:8d} {row['agree']:6d} {share:6.1f} "
              f"{row['differ']:6d} {row['explained']:9d}   {aspects}{extra}")

    order = [c for c in CLI_CATEGORIES if c in table] + sorted(c for c in table if c not in CLI_CATEGORIES)
    cli, total = Counter(), Counter()
    for category in order:
        line(category, table[category])
        total.update(table[category])
        if category in CLI_CATEGORIES:
            cli.update(table[category])
            if category == [c for c in order if c in CLI_CATEGORIES][-1]:
                line("  CLI, all", cli)
    line("all", total)
    print("(both ran: neither side timed out; agree: every aspect equal after the normalisations in "
          "the module docstring, getopt's libc wording compared as kinds (" f"{total['libc']}"
          " cases); explained: differing by a platform cause listed below)")


def print_differences(cases: list[dict[str, object]], sim: dict[str, dict], upstream: dict[str, dict]) -> int:
    """Every case that did not agree, grouped by cause, with its explanation; returns how many
    are not explained by a known platform cause."""
    groups: dict[str, list[str]] = defaultdict(list)
    reasons: dict[str, str] = {}
    for case in cases:
        key = str(case["id"])
        a, b = sim.get(key), upstream.get(key)
        if not (ran(a) and ran(b)):
            why = ", ".join(f"{name} {'not run' if o is None else o.get('status')}"
                            for name, o in (("h3-sim", a), ("upstream", b)) if not ran(o))
            groups[f"did not run to an outcome: {why}"].append(key)
            continue
        aspects = differing_aspects(a, b)   # type: ignore[arg-type]
        if not aspects:
            continue
        known = known_difference(a, b)   # type: ignore[arg-type]
        if known:
            groups[known.name].append(key)
            reasons[known.name] = known.explanation
            continue
        left, right = libc_normalise(a), libc_normalise(b)   # type: ignore[arg-type]
        where = _first_difference(left.get(aspects[0]), right.get(aspects[0]))
        groups[f"NOT EXPLAINED, {aspects[0]}: {where}"].append(key)
    unexplained = 0
    print("Differences by cause (every case):" if groups else "No differences.")
    for name, ids in sorted(groups.items(), key=lambda item: (item[0].startswith("NOT"), -len(item[1]))):
        unexplained += len(ids) if name.startswith("NOT") else 0
        print(f"{len(ids):5d}  {name}")
        if name in reasons:
            print(textwrap.fill(reasons[name], 100, initial_indent="       ", subsequent_indent="       "))
        print(textwrap.fill(" ".join(ids), 100, initial_indent="       cases: ", subsequent_indent="       "))
    return unexplained


def _first_difference(a: object, b: object) -> str:
    """A short text naming where two observations of one aspect part."""
    if isinstance(a, list) and isinstance(b, list):
        for index, (left, right) in enumerate(zip(a, b)):
            if left != right:
                return f"[{index}] sim {json.dumps(left)[:160]} | upstream {json.dumps(right)[:160]}"
        return f"length sim {len(a)} | upstream {len(b)}: extra {json.dumps((a[len(b):] or b[len(a):])[:2])[:200]}"
    if isinstance(a, str) and isinstance(b, str):
        left, right = a.splitlines(), b.splitlines()
        return _first_difference(left, right)
    return f"sim {json.dumps(a)[:200]} | upstream {json.dumps(b)[:200]}"


def sample_cases(cases: list[dict[str, object]], per_category: int, start: int = 0) -> list[dict[str, object]]:
    """A deterministic few cases of every category (evenly spaced in generation order, from the
    category's case number `start`)."""
    by_category: dict[str, list[dict[str, object]]] = defaultdict(list)
    for case in cases:
        by_category[str(case["category"])].append(case)
    chosen = []
    for items in by_category.values():
        step = max(len(items) // per_category, 1)
        chosen += items[start::step][:per_category]
    return chosen


def load_journal(path: Path) -> dict[str, dict]:
    """The observations of a side's journal (OUT/<side>.jsonl), later lines winning; a line cut
    short by a kill is skipped (that case runs again)."""
    found: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            found[record["id"]] = record["observation"]
    return found


def run_all(cases: list[dict[str, object]], sides: list[Side], workspace: Path, runs: Path,
            jobs: int, timeout: float, progress: bool = True, journal: Path | None = None,
            previous: dict[str, dict[str, dict]] | None = None) -> dict[str, dict[str, dict]]:
    """Every case on every side. With `journal` (a folder), each observation is appended to
    journal/<side>.jsonl as soon as it is made, so a run that is stopped loses only the cases
    in flight (see --resume); the cases in `previous` (side -> id -> observation) are not run
    again."""
    shaders = workspace / SHADERS
    upstream = [side for side in sides if side.name == "upstream" and not side.forked]
    source = Path(upstream[0].command[0]).with_name(SHADERS) if upstream else None
    if not shaders.exists():
        shaders.write_bytes(source.read_bytes() if source and source.exists() else b"// stand-in\n")
    observed: dict[str, dict[str, dict]] = {side.name: dict((previous or {}).get(side.name, {}))
                                            for side in sides}
    tasks = [(side, case) for case in cases for side in sides
             if str(case["id"]) not in observed[side.name]]
    done = 0

    handles = {side.name: open(journal / f"{side.name}.jsonl", "a") for side in sides} if journal else {}
    writing = threading.Lock()

    def one(task: tuple[Side, dict[str, object]]) -> None:
        nonlocal done
        side, case = task
        observation = run_case(side, case, workspace, runs, timeout, shaders)
        observed[side.name][str(case["id"])] = observation
        with writing:
            if side.name in handles:
                handles[side.name].write(json.dumps({"id": str(case["id"]), "observation": observation}) + "\n")
                handles[side.name].flush()
            done += 1
        if progress and done % 100 == 0:
            print(f"  {done}/{len(tasks)} runs", file=sys.stderr, flush=True)

    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, tasks))
    finally:
        for handle in handles.values():
            handle.close()
    return observed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream-h3", help="upstream's h3 program ('sim' = h3-sim again)")
    parser.add_argument("--upstream-lib", help="upstream's libh3.so")
    parser.add_argument("--out", type=Path, default=HERE / ".differential")
    parser.add_argument("--workspace", type=Path, help="models and media (default OUT/workspace)")
    parser.add_argument("--only", nargs="*", help="categories to run (cli-args cli-validate "
                        "cli-model cli-env cli-render session capi)")
    parser.add_argument("--ids", nargs="*", help="case ids to run")
    parser.add_argument("--sample", type=int, help="run only N cases per category")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case and side")
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--reuse-upstream", action="store_true",
                        help="take upstream's observations from OUT/upstream.jsonl")
    parser.add_argument("--sim-from", type=Path, action="append",
                        help="take h3-sim's observations from this sim.jsonl of an earlier run "
                             "(repeatable; later files win) instead of running it")
    parser.add_argument("--upstream-from", type=Path,
                        help="take upstream's observations from this upstream.jsonl of an earlier run")
    parser.add_argument("--resume", action="store_true",
                        help="keep the observations already in OUT/<side>.jsonl (all but timeouts) "
                             "and run only the rest")
    parser.add_argument("--sim-exec", action="store_true",
                        help="run h3-sim as a fresh process per case instead of forked")
    parser.add_argument("--count", action="store_true", help="print the case counts and exit")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: print the figures and every difference of the "
                             "observations stored in OUT/sim.jsonl and OUT/upstream.jsonl")
    args = parser.parse_args(argv)

    cases = generate_cases(args.seed)
    if args.count:
        kinds = Counter(str(case["kind"]) for case in cases)
        calls = sum(count_calls(case) for case in cases if case["kind"] == "capi")
        print(f"cli {kinds['cli']} cases, sessions {kinds['session']}, "
              f"capi {kinds['capi']} groups / {calls} calls")
        return 0
    if args.only:
        cases = [case for case in cases if case["category"] in args.only]
    if args.ids:
        cases = [case for case in cases if case["id"] in args.ids]
    if args.sample:
        cases = sample_cases(cases, args.sample)
    if args.report:
        stored = {side: load_journal(args.out / f"{side}.jsonl") for side in ("sim", "upstream")}
        wanted = {str(case["id"]) for case in cases}
        missing = [side for side, found in stored.items() if not wanted & found.keys()]
        if missing:
            # a table of zeros would read as "every case failed to run"; nothing ran at all
            print(no_run_recorded(args.out, missing), file=sys.stderr)
            return 2
        return report(cases, stored["sim"], stored["upstream"])
    args.out.mkdir(parents=True, exist_ok=True)
    workspace = build_workspace(args.workspace or args.out / "workspace").resolve()
    runs = Path(tempfile.mkdtemp(prefix="runs-", dir=args.out))
    sides = [] if args.sim_from else [Side.sim(forked=not args.sim_exec)]
    upstream_saved = args.out / "upstream.jsonl"
    reused: dict[str, dict] = {}
    if args.reuse_upstream or args.upstream_from:
        for line in (args.upstream_from or upstream_saved).read_text().splitlines():
            record = json.loads(line)
            reused[record["id"]] = record["observation"]
    elif args.upstream_h3 == "sim":
        sim = Side.sim(forked=False)
        sides.append(Side("upstream", sim.command, sim.library))
    elif args.upstream_h3:
        sides.append(Side.upstream(args.upstream_h3, args.upstream_lib))
    previous: dict[str, dict[str, dict]] = {}
    for side in sides:
        journal = args.out / f"{side.name}.jsonl"
        if args.resume:
            # A case that timed out (the machine was loaded) is run again.
            previous[side.name] = {key: value for key, value in load_journal(journal).items()
                                   if value.get("status") != "timeout"}
        else:
            journal.write_text("")
    started = time.monotonic()
    observed = run_all(cases, sides, workspace, runs, args.jobs, args.timeout,
                       journal=args.out, previous=previous)
    shutil.rmtree(runs, ignore_errors=True)
    wanted = {str(c["id"]) for c in cases}
    for path in args.sim_from or []:
        observed.setdefault("sim", {})
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["id"] in wanted:
                observed["sim"][record["id"]] = record["observation"]
    if reused:
        observed["upstream"] = {key: value for key, value in reused.items() if key in wanted}
    print(f"{len(cases)} cases in {time.monotonic() - started:.0f} s "
          f"(sides: {', '.join(observed)}; -j{args.jobs})")
    if "upstream" not in observed:
        print("no upstream side: pass --upstream-h3 (and --upstream-lib) to compare")
        return 0
    status = report(cases, observed["sim"], observed["upstream"])
    with open(args.out / "differences.jsonl", "w") as handle:
        for case in cases:
            key = str(case["id"])
            a, b = observed["sim"].get(key), observed["upstream"].get(key)
            if a is None or b is None:
                continue
            aspects = differing_aspects(a, b)
            if aspects:
                handle.write(json.dumps({"id": key, "case": case, "aspects": aspects,
                                         "sim": a, "upstream": b}) + "\n")
    return status


def no_run_recorded(out: Path, sides: list[str]) -> str:
    """What --report says when OUT holds no observations of a side for the chosen cases: where it
    looked, and the commands that record a run (build-engine prints the h3 and libh3 paths)."""
    from h3bridge.runnable import h3bridge_command
    journals = " and ".join(str(out / f"{side}.jsonl") for side in sides)
    record = [sys.executable, str(Path(__file__).resolve()), "--upstream-h3", "H3", "--upstream-lib", "LIBH3"]
    if out.resolve() != (HERE / ".differential").resolve():
        record += ["--out", str(out)]
    return (f"differential.py: no run is recorded: {journals} hold no observations of these cases, so there is "
            f"nothing to report.\n  fix: record one: `{h3bridge_command('build-engine', 'H3C_SOURCE')}` prints "
            f"upstream's h3 (H3) and libh3 (LIBH3) built from an h3.c clone or tarball (H3C_SOURCE); then "
            f"`{shlex.join(record)}` (--sample N runs only N cases per category), "
            "then --report again")


def report(cases: list[dict[str, object]], sim: dict[str, dict], upstream: dict[str, dict]) -> int:
    """The figures and every difference; status 1 when a difference is not explained."""
    print_table(summarise(cases, sim, upstream))
    print()
    return 1 if print_differences(cases, sim, upstream) else 0


if __name__ == "__main__":
    sys.exit(main())
