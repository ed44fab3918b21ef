"""Differential checks: h3-sim and the libh3 C double against upstream h3.c's own code.

    python bench/differential.py --upstream-h3 PATH/h3 --upstream-lib PATH/libh3.so [-j2]
        [--out DIR] [--only CATEGORY ...] [--sample N] [--timeout S] [--reuse-upstream]

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
LANG=C.UTF-8, and H3_SIM_TIME_SCALE=0 (a simulator variable upstream ignores).

Results are kept in DIR (default bench/.differential): observations per side as JSON lines,
and differences.jsonl with both sides of every disagreement; --reuse-upstream takes the
upstream observations of the previous run instead of running upstream again.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
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


def _environment(case: dict[str, object], workspace: Path, case_dir: Path) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(case_dir / "home"),
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


def platform_reason(sim: dict[str, object], upstream: dict[str, object]) -> str | None:
    """Why a difference is the C library's, not h3-sim's (None when it is not explained)."""
    messages = sim.get("messages") or []
    if messages and _EMPTY_NUMBER.match(str(messages[0])) and not any(   # type: ignore[index]
            _EMPTY_NUMBER.match(str(line)) for line in upstream.get("messages") or []):   # type: ignore[union-attr]
        return ("an empty number: macOS strtol/strtoull set EINVAL when nothing converts, so "
                "upstream on a Mac (and h3-sim) refuses `--width ''`; glibc sets no error, so the "
                "Linux build takes it as 0 and goes on")
    if any(re.match(r"^(h3: )?cannot read (video|audio) VAE config ", line) for line in _error_lines(sim)) and any(
            re.match(r"^(h3: )?invalid (video|audio) VAE config ", line) for line in _error_lines(upstream)):
        return ("a folder where a VAE config.json belongs: on macOS fopen/fseek/ftell accept it and "
                "fread fails (\"cannot read\"); on Linux ftell of a directory is not a size, so "
                "the size check fails first (\"invalid\")")
    return None


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


def summarise(cases: list[dict[str, object]], sim: dict[str, dict], upstream: dict[str, dict]) -> dict[str, object]:
    table: dict[str, Counter] = defaultdict(Counter)
    for case in cases:
        key = str(case["id"])
        if key not in sim or key not in upstream:
            continue
        row = table[str(case["category"])]
        row["cases"] += 1
        aspects = differing_aspects(sim[key], upstream[key])
        row["agree"] += not aspects
        row["platform"] += bool(aspects) and platform_reason(sim[key], upstream[key]) is not None
        row["libc"] += not aspects and bool(differing_aspects(sim[key], upstream[key], libc=False))
        for aspect in aspects:
            row[aspect] += 1
        if case["kind"] == "capi":
            agree, total = calls_agreeing(sim[key], upstream[key], case)
            row["calls"] += total
            row["calls agree"] += agree
    return table


def print_table(table: dict[str, Counter]) -> None:
    print(f"{'category':<14} {'cases':>6} {'agree':>6} {'%':>6} {'libc':>5} {'platf':>5}   "
          "differing aspects")
    total = Counter()
    for category in sorted(table):
        row = table[category]
        total.update(row)
        aspects = ", ".join(f"{a} {row[a]}" for a in ASPECTS if a != "calls" and row[a])
        share = 100.0 * row["agree"] / row["cases"] if row["cases"] else 0.0
        extra = f"; calls {row['calls agree']}/{row['calls']}" if row["calls"] else ""
        print(f"{category:<14} {row['cases']:6d} {row['agree']:6d} {share:6.1f} {row['libc']:5d} "
              f"{row['platform']:5d}   {aspects}{extra}")
    share = 100.0 * total["agree"] / total["cases"] if total["cases"] else 0.0
    print(f"{'all':<14} {total['cases']:6d} {total['agree']:6d} {share:6.1f} {total['libc']:5d} "
          f"{total['platform']:5d}")
    print("(agree: every aspect equal after the normalisations in the module docstring; libc: of "
          "those, cases that agree only once getopt's libc wording is compared as kinds; platf: "
          "differing cases explained by glibc vs macOS libc, see platform_reason)")


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


def explain(path: Path, limit: int = 3) -> None:
    """Group the differences of a run by the aspect and the first point where they part."""
    groups: dict[str, list[str]] = defaultdict(list)
    for line in path.read_text().splitlines():
        record = json.loads(line)
        sim, upstream = libc_normalise(record["sim"]), libc_normalise(record["upstream"])
        if platform_reason(sim, upstream):
            groups[f"platform: {platform_reason(sim, upstream)[:60]}"].append(record["id"])
            continue
        aspect = record["aspects"][0]
        where = _first_difference(sim.get(aspect), upstream.get(aspect))
        where = re.sub(r"\d+", "#", where) if aspect in ("phases", "calls") else where
        groups[f"{record['case']['category']} {aspect}: {where}"].append(record["id"])
    for key, ids in sorted(groups.items(), key=lambda item: -len(item[1])):
        print(f"{len(ids):5d}  {key}\n       e.g. {' '.join(ids[:limit])}")


def sample_cases(cases: list[dict[str, object]], per_category: int) -> list[dict[str, object]]:
    """A deterministic few cases of every category (evenly spaced in generation order)."""
    by_category: dict[str, list[dict[str, object]]] = defaultdict(list)
    for case in cases:
        by_category[str(case["category"])].append(case)
    chosen = []
    for items in by_category.values():
        step = max(len(items) // per_category, 1)
        chosen += items[::step][:per_category]
    return chosen


def run_all(cases: list[dict[str, object]], sides: list[Side], workspace: Path, runs: Path,
            jobs: int, timeout: float, progress: bool = True) -> dict[str, dict[str, dict]]:
    shaders = workspace / SHADERS
    upstream = [side for side in sides if side.name == "upstream" and not side.forked]
    source = Path(upstream[0].command[0]).with_name(SHADERS) if upstream else None
    if not shaders.exists():
        shaders.write_bytes(source.read_bytes() if source and source.exists() else b"// stand-in\n")
    observed: dict[str, dict[str, dict]] = {side.name: {} for side in sides}
    tasks = [(side, case) for case in cases for side in sides]
    done = 0

    def one(task: tuple[Side, dict[str, object]]) -> None:
        nonlocal done
        side, case = task
        observed[side.name][str(case["id"])] = run_case(side, case, workspace, runs, timeout, shaders)
        done += 1
        if progress and done % 100 == 0:
            print(f"  {done}/{len(tasks)} runs", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, tasks))
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
    parser.add_argument("--sim-exec", action="store_true",
                        help="run h3-sim as a fresh process per case instead of forked")
    parser.add_argument("--count", action="store_true", help="print the case counts and exit")
    parser.add_argument("--explain", action="store_true",
                        help="group OUT/differences.jsonl of the last run and exit")
    args = parser.parse_args(argv)
    if args.explain:
        explain(args.out / "differences.jsonl")
        return 0

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
    started = time.monotonic()
    observed = run_all(cases, sides, workspace, runs, args.jobs, args.timeout)
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
    for name, records in observed.items():
        if (name == "upstream" and reused) or (name == "sim" and args.sim_from):
            continue
        with open(args.out / f"{name}.jsonl", "w") as handle:
            for key, observation in records.items():
                handle.write(json.dumps({"id": key, "observation": observation}) + "\n")
    print(f"{len(cases)} cases in {time.monotonic() - started:.0f} s "
          f"(sides: {', '.join(observed)}; -j{args.jobs})")
    if "upstream" not in observed:
        print("no upstream side: pass --upstream-h3 (and --upstream-lib) to compare")
        return 0
    table = summarise(cases, observed["sim"], observed["upstream"])
    print_table(table)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
