"""One vocabulary on the command line (issue 30): the engine choice spelled one way in `generate`,
`story` and `serve` (vocabulary.EngineKind), the old spellings with a notice, contradictions
refused; -d/--model-dir on every command that takes a model folder; `--help` grouped by what users
do; build-library a hidden alias; "did you mean" said by the subcommand that was given."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import h3bridge
from core_helpers import model_dir, sim_engine_path, sim_invocations, sim_log  # noqa: F401  (fixtures)
from h3bridge.cli.main import COMMAND_GROUPS, HIDDEN_COMMANDS, build_parser, main
from h3bridge.cli.engine import model_dir_from_args
from h3bridge.cli.engine import engine_from_args, engine_kind
from h3bridge.engines.fallback import FallbackEngine
from h3bridge.engines.library import LibraryEngine
from h3bridge.engines.oneshot import OneShotEngine
from h3bridge.engines.remote import RemoteEngine
from h3bridge.engines.session import SessionEngine
from h3bridge.errors import RequestError
from h3bridge.vocabulary import ENGINE_KINDS, EngineKind

CLIP = ["--width", "96", "--height", "64", "--frames", "22", "--steps", "2"]
URL = "http://127.0.0.1:9"


@pytest.fixture(autouse=True)
def _private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.delenv("H3_MODEL_DIR", raising=False)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def command_line(command: str, *flags: str) -> list[str]:
    """`command` with what it needs to parse, then `flags`."""
    needs = {"generate": ["generate", "-p", "fox"], "story": ["story", "film.toml"], "serve": ["serve"]}[command]
    return [*needs, *flags]


# ----------------------------------------------------------------------------- the engine choice

# (command, old flags, the current flags meaning the same, the kind, the notice's words)
OLD_SPELLINGS = [
    ("generate", ["--engine", "cli"], ["--engine", "one-shot"], EngineKind.ONE_SHOT,
     "--engine cli is now --engine one-shot"),
    ("generate", ["--session"], ["--engine", "session"], EngineKind.SESSION, "--session is now --engine session"),
    ("generate", ["--engine", "cli", "--session"], ["--engine", "session"], EngineKind.SESSION,
     "--engine cli --session is now --engine session"),
    ("generate", ["--engine", "oneshot"], ["--engine", "one-shot"], EngineKind.ONE_SHOT,
     "--engine oneshot is now --engine one-shot"),
    ("story", ["--one-shot"], ["--engine", "one-shot"], EngineKind.ONE_SHOT, "--one-shot is now --engine one-shot"),
    ("story", ["--session"], ["--engine", "session"], EngineKind.SESSION, "--session is now --engine session"),
    ("story", ["--engine", "cli"], ["--engine", "one-shot"], EngineKind.ONE_SHOT,
     "--engine cli is now --engine one-shot"),
    ("serve", ["--engine", "oneshot"], ["--engine", "one-shot"], EngineKind.ONE_SHOT,
     "--engine oneshot is now --engine one-shot"),
]


@pytest.mark.parametrize("command, old, new, kind, notice", OLD_SPELLINGS,
                         ids=[f"{c} {' '.join(o)}" for c, o, *_ in OLD_SPELLINGS])
def test_an_old_spelling_chooses_the_same_engine_with_a_notice(command: str, old: list[str], new: list[str],
                                                               kind: EngineKind, notice: str, model_dir: Path,  # noqa: F811
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    engine = ["--engine-path", str(sim_engine_path()), "-d", str(model_dir)]
    current = parse(*command_line(command, *new, *engine))
    assert engine_kind(current) is kind
    assert "notice" not in capsys.readouterr().err        # the current spelling says nothing
    given = parse(*command_line(command, *old, *engine))
    assert engine_kind(given) is kind
    err = capsys.readouterr().err
    assert err == f"h3bridge: notice: {notice} (the old spelling still works for now)\n"
    assert engine_kind(given) is kind and capsys.readouterr().err == ""      # read once, said once
    chosen, expected = engine_from_args(given), engine_from_args(current)
    try:
        assert _renders_on(chosen) is _renders_on(expected)
        assert _renders_on(chosen) is (SessionEngine if kind is EngineKind.SESSION else OneShotEngine)
    finally:
        chosen.close()
        expected.close()


@pytest.mark.parametrize("command, default", [("generate", EngineKind.ONE_SHOT), ("story", EngineKind.SESSION),
                                              ("serve", EngineKind.SESSION)])
def test_the_defaults_are_as_before(command: str, default: EngineKind) -> None:
    assert engine_kind(parse(*command_line(command))) is default


def test_every_kind_is_spelled_the_same_in_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """generate and story offer every kind, serve the ones on its own machine; --help lists them."""
    sub = build_parser()._subparsers._group_actions[0].choices
    for command, kinds in (("generate", ENGINE_KINDS), ("story", ENGINE_KINDS),
                           ("serve", ("one-shot", "session", "library"))):
        [action] = [a for a in sub[command]._actions if "--engine" in a.option_strings]
        assert tuple(action.choices) == kinds
        assert "{" + ",".join(kinds) + "}" in sub[command].format_help()
        for kind in kinds:
            if kind != "remote":
                assert engine_kind(parse(*command_line(command, "--engine", kind))) is EngineKind(kind)
    assert engine_kind(parse(*command_line("generate", "--engine", "remote", "--remote", URL))) is EngineKind.REMOTE
    assert engine_kind(parse(*command_line("story", "--remote", URL))) is EngineKind.REMOTE    # no notice
    assert capsys.readouterr().err == ""


def test_the_engine_kind_is_public() -> None:
    assert h3bridge.EngineKind is EngineKind and "EngineKind" in h3bridge.__all__
    assert "EngineKind" in dir(h3bridge)


# (argv, the flags named, the fix: in the current spellings, runnable as shown)
CONTRADICTIONS = [
    (command_line("generate", "--engine", "library", "--session"), ["--engine library", "--session"],
     "keep one: --engine library or --engine session"),
    (command_line("generate", "--engine", "one-shot", "--session"), ["--engine one-shot", "--session"],
     "keep one: --engine one-shot or --engine session"),
    (command_line("story", "--engine", "library", "--one-shot"), ["--engine library", "--one-shot"],
     "keep one: --engine library or --engine one-shot"),
    (command_line("story", "--session", "--one-shot"), ["--session", "--one-shot"],
     "give one engine: --engine session or --engine one-shot"),
    (command_line("generate", "--remote", URL, "--engine", "session"), [f"--remote {URL}", "--engine session"],
     "drop --engine session to render on the server, or drop --remote to render here"),
    (command_line("generate", "--remote", URL, "--engine", "library"), [f"--remote {URL}", "--engine library"],
     "drop --engine library to render on the server, or drop --remote to render here"),
    (command_line("story", "--remote", URL, "--one-shot"), [f"--remote {URL}", "--one-shot"],
     "drop --one-shot to render on the server, or drop --remote to render here"),
    (command_line("generate", "--remote", URL, "--session"), [f"--remote {URL}", "--session"],
     "drop --session to render on the server, or drop --remote to render here"),
]


@pytest.mark.parametrize("argv, flags, fix", CONTRADICTIONS, ids=[" ".join(a) for a, *_ in CONTRADICTIONS])
def test_contradicting_engine_flags_are_refused_naming_both(argv: list[str], flags: list[str], fix: str) -> None:
    with pytest.raises(RequestError) as refused:
        engine_kind(parse(*argv))
    assert all(flag in refused.value.message for flag in flags), refused.value.message
    assert "contradict" in refused.value.message and refused.value.before_start
    assert refused.value.hint == fix


def test_contradictions_exit_2_before_anything_runs(tmp_path: Path, model_dir: Path, sim_log: Path,  # noqa: F811
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["generate", "-p", "fox", *CLIP, "--engine", "library", "--session", "--engine-path",
                   str(sim_engine_path()), "-d", str(model_dir), "-o", str(tmp_path / "fox.mp4"), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2 and "--engine library and --session contradict each other" in err
    assert "fix: keep one: --engine library or --engine session" in err
    assert sim_invocations(sim_log) == [] and not (tmp_path / "fox.mp4").exists()


def test_engine_remote_needs_a_url() -> None:
    with pytest.raises(RequestError) as refused:
        engine_kind(parse(*command_line("generate", "--engine", "remote")))
    assert "--engine remote" in refused.value.message and "no --remote URL" in refused.value.message
    assert refused.value.hint.startswith("add --remote URL")


def test_serve_refuses_the_remote_engine(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--engine", "remote"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith("usage: h3bridge serve")
    assert "argument --engine: remote is not an engine `h3bridge serve` runs (it runs one-shot, session, library)" in err
    assert "h3bridge fleet" in err


@pytest.mark.parametrize("flags, named, fix", [
    (["--library-path", "/nowhere/libh3.dylib"], "--library-path chooses the library engine's files, and the "
                                                 "engine is one-shot", "add --engine library, or drop --library-path"),
    (["--h3-dir", "/nowhere"], "--h3-dir chooses the library engine's files, and the engine is one-shot",
     "add --engine library --library-path PATH (or set $H3_LIBRARY), or drop --h3-dir"),
    (["--session", "--h3-dir", "/nowhere"], "the engine is session", "add --engine library"),
    (["--remote", URL, "--library-path", "/l"], "--library-path chooses the library engine's files, and the engine "
                                                "is remote", "drop --library-path"),
])
def test_library_flags_without_the_library_engine_are_refused(flags: list[str], named: str, fix: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """They were silently ignored: a user who forgot --engine library rendered with h3 unknowingly."""
    status = main(["generate", "-p", "fox", *flags])
    err = capsys.readouterr().err
    assert status == 2 and named in err and fix in err


def test_a_real_render_through_old_and_new_spellings(tmp_path: Path, model_dir: Path, sim_log: Path,  # noqa: F811
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """h3-sim: `--engine cli --session` runs h3's interactive mode as `--engine session` does, and
    `--engine cli` one h3 per clip as `--engine one-shot` does."""
    base = ["generate", "-p", "fox", *CLIP, "--engine-path", str(sim_engine_path()), "-d", str(model_dir), "--quiet"]
    runs = {}
    for name, flags in (("old-session", ["--engine", "cli", "--session"]), ("session", ["--engine", "session"]),
                        ("old-one-shot", ["--engine", "cli"]), ("one-shot", ["--engine", "one-shot"])):
        before = len(sim_invocations(sim_log))
        assert main([*base, *flags, "-o", str(tmp_path / f"{name}.mp4")]) == 0
        assert (tmp_path / f"{name}.mp4").is_file()
        runs[name] = (sim_invocations(sim_log)[before:], capsys.readouterr().err)
    for name in ("old-session", "session"):
        invocations, _ = runs[name]
        assert invocations and all("-p" not in run["argv"] for run in invocations)     # interactive mode
    for name in ("old-one-shot", "one-shot"):
        invocations, _ = runs[name]
        assert invocations and all("-p" in run["argv"] for run in invocations)
    assert "notice: --engine cli --session is now --engine session" in runs["old-session"][1]
    assert "notice: --engine cli is now --engine one-shot" in runs["old-one-shot"][1]
    assert "notice" not in runs["session"][1] + runs["one-shot"][1]


def _renders_on(engine) -> type:
    """The class that renders what it can: a session's, behind its one-shot fallback."""
    return type(engine.primary) if isinstance(engine, FallbackEngine) else type(engine)


def test_remote_alone_is_the_remote_engine() -> None:
    chosen = engine_from_args(parse(*command_line("generate", "--remote", URL)))
    try:
        assert isinstance(chosen, RemoteEngine)
    finally:
        chosen.close()


def test_library_engine_from_the_one_vocabulary(model_dir: Path) -> None:  # noqa: F811
    from double_helpers import double_library_path
    args = parse(*command_line("generate", "--engine", "library", "--library-path", str(double_library_path()),
                               "-d", str(model_dir)))
    assert engine_kind(args) is EngineKind.LIBRARY
    chosen = engine_from_args(args)
    try:
        assert isinstance(chosen, LibraryEngine)        # warm by nature: no fallback
    finally:
        chosen.close()


# ----------------------------------------------------------------------------- "did you mean"

def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "h3bridge", *argv], capture_output=True, text=True, timeout=120)


def test_a_mistyped_flag_is_named_by_its_subcommand_with_the_closest_one() -> None:
    done = run_cli("generate", "-p", "x", "--widht", "512")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: h3bridge generate ")
    assert done.stderr.rstrip().endswith("h3bridge generate: error: unrecognized argument: --widht "
                                         "(did you mean --width or --height?)")


def test_an_unknown_flag_is_named_before_a_missing_required_one() -> None:
    done = run_cli("generate", "--prompt-file", "x")
    assert done.returncode == 2 and done.stderr.startswith("usage: h3bridge generate ")
    assert "unrecognized argument: --prompt-file (did you mean --prompt" in done.stderr
    assert "the following arguments are required" not in done.stderr


@pytest.mark.parametrize("argv, said", [
    (["genrate", "-p", "x"], "h3bridge: error: argument COMMAND: invalid choice: 'genrate' (did you mean generate?)"),
    (["lora", "flod"], "h3bridge lora: error: argument COMMAND: invalid choice: 'flod' (did you mean fold?)"),
    (["generate", "-p", "x", "--preset", "turb"], "invalid choice: 'turb' (did you mean turbo?)"),
    (["generate", "-p", "x", "--engine", "oneshoot"], "invalid choice: 'oneshoot' (did you mean one-shot?)"),
    (["info", "--jsn"], "h3bridge info: error: unrecognized argument: --jsn (did you mean --json?)"),
    (["lora", "fold", "--lroa=x.safetensors"], "h3bridge lora fold: error: unrecognized argument: --lroa=x.safetensors "
                                               "(did you mean --lora?)"),
    (["serve", "--prot", "0"], "h3bridge serve: error: unrecognized argument: --prot (did you mean --port"),
    (["story", "s.toml", "--only-shot", "2"], "h3bridge story: error: unrecognized argument: --only-shot"),
])
def test_did_you_mean_at_every_level(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_hidden_flags_and_commands_are_never_suggested(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["generate", "-p", "x", "--sesion"])       # --session is an old spelling, hidden from --help
    err = capsys.readouterr().err
    assert "unrecognized argument: --sesion" in err and "did you mean --session" not in err
    with pytest.raises(SystemExit):
        main(["build-libary"])
    err = capsys.readouterr().err
    assert "did you mean build-library" not in err and "build-engine" in err


def test_values_that_look_like_options_stay_values(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("generate", "--prompt=--a fox", "--seed", "-5")
    assert args.prompt == "--a fox" and args.seed == -5
    assert parse("generate", "-p", "-a fox").prompt == "-a fox"


# ----------------------------------------------------------------------------- -d/--model-dir

@pytest.mark.parametrize("command", [["info"], ["verify", "--quiet"]])
def test_info_and_verify_take_d_as_every_model_command(command: list[str], model_dir: Path,  # noqa: F811
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "-d", str(model_dir), "--json"]) == 0
    with_flag = capsys.readouterr().out
    assert main([*command, str(model_dir), "--json"]) == 0
    assert capsys.readouterr().out == with_flag and str(model_dir) in with_flag


@pytest.mark.parametrize("command", [["info"], ["verify"], ["lora", "fold", "--lora", "x.safetensors", "-o", "out"]])
def test_the_model_folder_given_twice_is_refused(command: list[str], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    status = main([*command, "-d", str(tmp_path / "a"), str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert status == 2 and "the model folder is given twice: --model-dir" in err and "fix: give it once, as -d PATH" in err


@pytest.mark.parametrize("command", ["info", "verify", "lora fold", "generate", "story", "serve", "plan", "doctor",
                                     "lora list", "lora prune"])
def test_every_model_command_takes_d(command: str) -> None:
    parser = build_parser()
    current = parser
    for word in command.split():
        current = next(a for a in current._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
    [action] = [a for a in current._actions if "--model-dir" in a.option_strings]
    assert action.option_strings == ["-d", "--model-dir"] and action.dest == "model_dir"


def test_lora_fold_reads_d_like_the_positional(tmp_path: Path) -> None:
    flag = parse("lora", "fold", "-d", str(tmp_path), "--lora", "x.safetensors", "-o", "out")
    positional = parse("lora", "fold", str(tmp_path), "--lora", "x.safetensors", "-o", "out")
    assert model_dir_from_args(flag) == model_dir_from_args(positional) == tmp_path


def test_lora_list_takes_d_and_says_when_nothing_is_given(model_dir: Path,  # noqa: F811
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lora", "list", "-d", str(model_dir)]) == 0
    with_flag = capsys.readouterr().out
    assert main(["lora", "list", str(model_dir)]) == 0
    assert capsys.readouterr().out == with_flag and "0 fold(s)" in with_flag
    assert main(["lora", "list"]) == 2
    assert "fix: add -d PATH (the base model folder)" in capsys.readouterr().err


# ----------------------------------------------------------------------------- --help, build-library

def visible_commands() -> list[str]:
    subparsers = build_parser()._subparsers._group_actions[0]
    return list(subparsers.choices)


def test_every_subcommand_is_in_exactly_one_group() -> None:
    grouped = [name for names in COMMAND_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(set(grouped))
    assert sorted(grouped) == sorted(name for name in visible_commands() if name not in HIDDEN_COMMANDS)
    assert list(COMMAND_GROUPS) == ["render", "models", "engines", "serve", "tools"]


def test_help_lists_the_groups_in_order_and_no_hidden_command() -> None:
    done = run_cli("--help")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    headings = [lines.index(f"{group}:") for group in COMMAND_GROUPS]
    assert headings == sorted(headings)
    for group, names in COMMAND_GROUPS.items():
        start = lines.index(f"{group}:")
        assert [line.split()[0] for line in lines[start + 1:start + 1 + len(names)]] == list(names)
    assert "build-library" not in done.stdout and "{generate" not in done.stdout


def test_build_library_still_runs_and_names_build_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["build-library", str(tmp_path)])
    err = capsys.readouterr().err
    assert err.startswith("h3bridge: notice: build-library is now build-engine: ")
    assert f"build-engine {tmp_path}" in err.splitlines()[0]
    if sys.platform != "darwin":      # the library part says why it cannot build here, as before
        assert status == 2 and "libh3 runs only on Apple Silicon Macs" in err


def every_command_path() -> list[list[str]]:
    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if path:
            found.append(path)
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, [*path, name])
    walk(build_parser(), [])
    return found


@pytest.mark.parametrize("path", every_command_path(), ids=" ".join)
def test_python_m_h3bridge_help_runs_for_every_subcommand(path: list[str]) -> None:
    done = run_cli(*path, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: h3bridge {' '.join(path)}")


def test_plan_names_the_engine_as_generate_does(capsys: pytest.CaptureFixture[str]) -> None:
    """plan --session (the old spelling) plans what --engine session plans, with a notice; the
    library's worker is warm too."""
    plans = {}
    for name, flags in (("old", ["--session"]), ("session", ["--engine", "session"]),
                        ("library", ["--engine", "library"]), ("one-shot", [])):
        status = main(["plan", "--memory-gb", "64", "--json", *flags])
        captured = capsys.readouterr()
        assert status in (0, 1)
        plans[name] = (captured.out, captured.err)
    assert plans["old"][0] == plans["session"][0] == plans["library"][0] != plans["one-shot"][0]
    assert '"session": true' in plans["session"][0] and '"session": false' in plans["one-shot"][0]
    assert plans["old"][1] == "h3bridge: notice: --session is now --engine session (the old spelling still works for now)\n"
    assert plans["session"][1] == ""
