"""Conformance (issue 29 item 3): every entry point, found by walking the code, fed the hostile set,
answers with the project's own refusal within a bound, writes nothing and replaces nothing.

The walks (tests/conformance_helpers.py) find the entry points themselves: every subcommand and
argument of the real `h3bridge` parser, every field of the server's body in its three dialects,
every storyboard key, every ComfyUI node input. A command, flag, field, key or input added later is
walked without anyone adding it here; one the walk cannot classify fails
`test_every_argument_is_classified` (and its kin) until it is.

What a refusal is, per interface:
* command line: exit 2, a message on stderr, no traceback, no engine started;
* server: HTTP 400 whose `param` names the field (never a 500);
* storyboard: RequestError whose `field` is the key;
* ComfyUI node: the library's own H3BridgeError (what the node shows in ComfyUI's error panel).

`-s` prints the counts (entry points walked, hostile cases, untyped errors, hangs, writes);
bench/conformance_counts.py runs the same walk as a program.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

from conformance_helpers import (
    HANG_SECONDS,
    JSON_HOSTILE,
    LONG,
    CONTROL,
    ArgKind,
    CliWorld,
    Counts,
    HostileFiles,
    IS_ROOT,
    BASE_VALUES,
    changes,
    cli_cases,
    comfy_node_inputs,
    run_main_forked,
    server_body,
    server_fields,
    snapshot,
    walk_parser,
)
from h3bridge.cli.main import build_parser

COUNTS = Counts()


# ----------------------------------------------------------------------------- the command line

PARSER = build_parser()
COMMANDS, ARGUMENTS = walk_parser(PARSER)


def test_every_argument_is_classified() -> None:
    unclassified = [argument.name for argument in ARGUMENTS if argument.kind is None]
    assert not unclassified, (f"classify {unclassified} in tests/conformance_helpers.py ARGUMENT_KINDS "
                              "(input or output path, number, text, name) so the walk feeds it its hostile set")


def test_every_command_has_a_base_invocation() -> None:
    missing = [command for command in COMMANDS if command not in BASE_VALUES]
    assert not missing, f"give {missing} a base invocation in tests/conformance_helpers.py BASE_VALUES"


def test_the_walk_finds_every_subcommand_and_nested_one() -> None:
    # The walk is the parser's own: a nested subcommand (model download, lora fold) is a leaf.
    assert {"generate", "story", "serve", "model download", "lora fold", "lora prune"} <= set(COMMANDS)
    assert all(" " not in command or command.split()[0] in ("model", "lora") for command in COMMANDS)
    kinds = {argument.kind for argument in ARGUMENTS}
    assert {ArgKind.INPUT_FILE, ArgKind.INPUT_DIR, ArgKind.OUTPUT_FILE, ArgKind.NUMBER, ArgKind.TEXT} <= kinds
    COUNTS.entry_points["subcommands"] = len(COMMANDS)
    COUNTS.entry_points["arguments"] = len(ARGUMENTS)


TRIPWIRE = "#!/bin/sh\n# conformance: an engine that must never start for a refused argument\n" \
           "echo \"$0 $*\" >> \"$(dirname \"$0\")/../engine-started\"\nexit 1\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> CliWorld:
    root = tmp_path_factory.mktemp("conformance-cli")
    engine_folder = root / "engine"
    engine_folder.mkdir()
    engine = engine_folder / "h3"
    engine.write_text(TRIPWIRE)
    engine.chmod(0o755)
    env = dict(os.environ)
    # The suite's isolation (conftest) for the child: its own lock, machine folder and history.
    env.update({name: str(root / f"isolated-{name.lower()}") for name in
                ("H3BRIDGE_LOCK_PATH", "H3BRIDGE_MACHINE_DIR", "H3BRIDGE_HISTORY_PATH")})
    made = CliWorld.make(root / "case", engine, env)
    # Everything a command may import is imported once here, so a forked case costs a fork.
    import h3bridge.cli.fleet, h3bridge.cli.hexgrid, h3bridge.cli.lora, h3bridge.cli.model  # noqa: F401,E401
    import h3bridge.server.app, h3bridge.story.runner, h3bridge.cli.library  # noqa: F401,E401  (preloaded)
    return made


def _library_context(argument) -> list[str]:
    """The library engine's own options are read only with --engine library."""
    return ["--engine=library"] if argument.action.dest in ("library_path", "h3_dir", "preview_dir") else []


def _cli_case_ids() -> list[tuple[str, int]]:
    """(case id, index) of every command-line case, computed from a throwaway world's layout (the
    ids depend only on the parser and on whether this runs as root)."""
    ids = []
    from conformance_helpers import NOT_FED
    for argument in ARGUMENTS:
        if argument.kind in (ArgKind.FLAG, None) or (argument.command, argument.action.dest) in NOT_FED:
            continue
        for index, name in enumerate(_hostile_names(argument.kind)):
            ids.append((f"{argument.name}: {name}", len(ids)))
    return ids


def _hostile_names(kind: ArgKind) -> list[str]:
    from conformance_helpers import hostile_numbers, hostile_strings
    if kind in (ArgKind.INPUT_FILE, ArgKind.INPUT_DIR):
        names = ["fifo", "link to /dev/zero", "dangling link"] + (["device node"] if IS_ROOT else [])
        if kind is ArgKind.INPUT_DIR:
            return names + ["huge sparse file"] + ([] if IS_ROOT else ["unreadable folder"])
        return names + ["folder", "huge sparse file"] + ([] if IS_ROOT else ["unreadable file"])
    if kind in (ArgKind.OUTPUT_FILE, ArgKind.OUTPUT_DIR):
        return ["fifo", "link to /dev/zero", "dangling link"] + (["device node"] if IS_ROOT else []) + \
            (["huge sparse file"] if kind is ArgKind.OUTPUT_DIR else ["folder"])
    if kind in (ArgKind.NUMBER, ArgKind.SIGNED):
        return [h.name for h in hostile_numbers(signed=kind is ArgKind.SIGNED)]
    if kind is ArgKind.CHOICE:
        return ["not a choice", "control characters"]
    return [h.name for h in hostile_strings()]


def _cli_params():
    params = []
    for case_id, index in _cli_case_ids():
        params.append(pytest.param(index, id=case_id))
    return params


# What a command says for a refused argument: exit 2 (docs/cli.md), except `doctor`, whose job is
# to report what is missing (exit 1 with the finding and its fix, on stdout).
REFUSAL_STATUS = {"doctor": 1}
# Cases where taking the value is right: free text (a prompt) may hold control characters and be
# long (the request's own byte cap refuses what h3 cannot take); `plan` reads no media, so a huge
# sparse file as a first frame is just a regular file to it.
def _may_accept(case) -> bool:
    return case.argument.kind is ArgKind.TEXT or (
        case.argument.command == "plan" and case.hostile.name == "huge sparse file") or (
        # demo's -o may name a folder to put a new h3bridge-demo*.mp4 in (its documented use)
        case.argument.command == "demo" and case.hostile.name == "folder")


def _refused_by_argparse(argv: list[str]):
    """The Outcome when the parser alone refuses `argv` (a value its type= rejects): parsing runs
    no handler and touches nothing, so it is safe in-process. None when it parses."""
    import contextlib
    import io
    import time

    from conformance_helpers import Outcome
    started = time.monotonic()
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as leaving:
        return Outcome(leaving.code if isinstance(leaving.code, int) else 1, "", stderr.getvalue(),
                       time.monotonic() - started)
    return None


def _main_without_serving(argv):
    """cli.main with uvicorn's Server.run replaced: a `serve` that takes its arguments says so and
    returns at once, instead of serving until the hang guard kills it."""
    import uvicorn

    from h3bridge.cli.main import main

    def accepted(self, sockets=None):
        print("conformance: serve took its arguments and would listen now", file=sys.stderr)
    uvicorn.Server.run = accepted
    return main(argv)


@pytest.mark.parametrize("index", _cli_params())
def test_cli_argument_refuses_hostile_value(world: CliWorld, index: int) -> None:
    case = _world_cases(world)[index]
    argv = list(case.argv)
    argv[len(case.argument.command.split()):len(case.argument.command.split())] = _library_context(case.argument)
    before = snapshot(world.root)
    outcome = _refused_by_argparse(argv)      # most hostile numbers stop here: no fork needed
    if outcome is None:
        outcome = run_main_forked(argv, cwd=world.cwd, env=world.base_env, capture=world.root.parent / "capture",
                                  main=_main_without_serving, timeout=HANG_SECONDS)
    after = snapshot(world.root)
    written = changes(before, after)
    _clean_up(world, before, after)
    COUNTS.cases += 1
    wanted = REFUSAL_STATUS.get(case.argument.command, 2)
    problems = []
    if outcome.hung:
        COUNTS.hangs.append(case.id)
        problems.append(f"still running after {HANG_SECONDS:.0f} s")
    elif outcome.untyped:
        COUNTS.untyped.append(case.id)
        problems.append("a traceback")
    elif _may_accept(case):
        pass
    elif outcome.status != wanted or not (outcome.stderr.strip() or outcome.stdout.strip()):
        COUNTS.wrong.append(case.id)
        problems.append(f"exit {outcome.status}, not {wanted} with a message")
    if written and not _may_accept(case):
        COUNTS.writes.append(case.id)
        problems.append("; ".join(written[:4]))
    assert not problems, f"{case.id}: {'; '.join(problems)}\nargv: {_short(argv)}\nstderr: {outcome.stderr[-800:]}"


_CASES_BY_WORLD: dict[int, list] = {}


def _world_cases(world: CliWorld) -> list:
    if id(world) not in _CASES_BY_WORLD:
        _CASES_BY_WORLD[id(world)] = cli_cases(PARSER, world, ARGUMENTS)
        assert [c.id for c in _CASES_BY_WORLD[id(world)]] == [i for i, _ in _cli_case_ids()]
    return _CASES_BY_WORLD[id(world)]


def _clean_up(world: CliWorld, before: dict, after: dict) -> None:
    """Undo what a failing case wrote, so the next case starts from the same folder."""
    import shutil
    for path in sorted(set(after) - set(before), reverse=True):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)


def _short(argv: list[str]) -> str:
    return " ".join(a if len(a) < 80 else a[:40] + f"...({len(a)} chars)" for a in argv)


# ----------------------------------------------------------------------------- the server

SERVER_FIELDS = server_fields()
# The values a field may take and be accepted (HTTP 200 queues the job): text fields take text,
# signed fields negatives.
TEXT_FIELDS = {"prompt", "model", "user"}
SIGNED_FIELDS = {"seed"}
# A field h3 cannot honour is refused whatever its value: two values show it (a value of the
# wrong shape, a huge one); every other field gets the whole set.
REFUSED_ANY_VALUE = ("object", "100000 characters")


def _server_params():
    from h3bridge.server import dialects
    params = []
    for dialect, name in SERVER_FIELDS:
        for value_name in (REFUSED_ANY_VALUE if name in dialects._CANNOT else JSON_HOSTILE):
            params.append(pytest.param(dialect, name, value_name, id=f"{dialect} {name}: {value_name}"))
    return params


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory):
    from fastapi.testclient import TestClient

    from h3bridge.server.app import ServeSettings, create_app
    from h3bridge.server.jobs import JobStore
    from h3bridge.server.uploads import MiB, UploadLimits
    from h3bridge.server.worker import Worker
    data_dir = tmp_path_factory.mktemp("conformance-serve")
    store = JobStore(data_dir)
    app = create_app(ServeSettings(data_dir=data_dir, limits=UploadLimits(max_json_bytes=2 * MiB, max_file_bytes=MiB),
                                   max_queued=None),
                     store, Worker(store, engine=None))  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, data_dir
    store.close()


def test_the_server_walk_finds_both_dialects() -> None:
    dialects = {dialect for dialect, _ in SERVER_FIELDS}
    assert dialects == {"h3bridge", "vllm-omni", "sglang"}
    names = {name for _, name in SERVER_FIELDS}
    assert {"flow_shift", "extra_params.duration", "target.duration_seconds", "audio_flow_shift", "num_frames"} <= names
    COUNTS.entry_points["server fields"] = len(SERVER_FIELDS)


# Fields that are only valid together: the partner is given a good value, so the refusal is the field's own.
PARTNERS = {"render_width": ("render_height", 64), "render_height": ("render_width", 96)}


def _accepts(name: str, value_name: str) -> bool:
    """A value the field may take: text in a text field, a negative seed."""
    from h3bridge.wire import videos as wire
    base = name.split(".")[-1]
    if base == "user":        # vLLM-Omni's tracking id for its logs: read by nothing, any value
        return True
    if base in TEXT_FIELDS and value_name in ("control characters", "100000 characters", "400-digit text",
                                              "5000-digit text", "NaN text", "infinity text"):
        return True           # text (a prompt, a model's name) may hold any of these
    boolean = any(f.kind is bool and name in (f.name, f.alias) for f in wire.FIELDS) or base == "generate_sound"
    if value_name == "wrong type" and boolean:
        return True           # "wrong type" is `true`: right for a switch
    return base in SIGNED_FIELDS and value_name == "negative"


# Fields refused together with their partner: a 400 naming either names the rule's fields.
FIELD_GROUPS = ({"width", "height", "size"}, {"render_width", "render_height"})


@pytest.mark.parametrize(("dialect", "name", "value_name"), _server_params())
def test_server_field_refuses_hostile_value(app_client, dialect: str, name: str, value_name: str) -> None:
    client, data_dir = app_client
    body = server_body(dialect, name, JSON_HOSTILE[value_name], PARTNERS.get(name))
    inputs_before = _job_inputs(data_dir)
    response = client.post("/v1/videos", content=body.encode(), headers={"content-type": "application/json"})
    COUNTS.cases += 1
    case_id = f"{dialect} {name}: {value_name}"
    if response.status_code >= 500:
        COUNTS.untyped.append(case_id)
    assert response.status_code in (200, 400), (case_id, response.status_code, response.text[:300])
    if response.status_code == 200:
        COUNTS.wrong.append(case_id) if not _accepts(name, value_name) else None
        assert _accepts(name, value_name), f"{case_id}: accepted ({response.text[:200]})"
        return
    error = response.json()["error"]
    param = error.get("param")
    shown = {name, name.split(".")[-1], name.split("[")[0], name.split(".")[0]}
    from h3bridge.wire import videos as wire
    field = next((f for f in wire.FIELDS if name in (f.name, f.alias)), None)
    if field is not None:
        shown |= {field.name, field.target, field.alias or field.name}
    for group in FIELD_GROUPS:
        if shown & group:
            shown |= group
    # A nested value is named down to where it is wrong (conditions[0].a, target.a).
    named = param in shown or (isinstance(param, str) and param.startswith((name + ".", name + "[")))
    if not named:
        COUNTS.wrong.append(case_id)
    assert named, f"{case_id}: the 400 names {param!r}, not the field: {error}"
    assert _job_inputs(data_dir) == inputs_before, f"{case_id}: a refused body left files behind"


def _job_inputs(data_dir: Path) -> set[str]:
    jobs = data_dir / "jobs"
    found = set()
    if jobs.is_dir():
        for job in jobs.iterdir():
            found.add(job.name)
    return found


# ----------------------------------------------------------------------------- the storyboard

def storyboard_keys() -> list[tuple[str, str]]:
    """(where, key): every top-level key and every [[shot]] key a storyboard takes."""
    from h3bridge.story.storyboard import REQUEST_KEYS, SHOT_KEYS, STORY_KEYS
    top = [("story", key) for key in dict.fromkeys([*STORY_KEYS, "preset", *REQUEST_KEYS])]
    return top + [("shot", key) for key in SHOT_KEYS]


STORY_HOSTILE: dict[str, object] = {
    "400 digits": int("9" * 400), "-400 digits": -int("9" * 400), "NaN": math.nan, "infinity": math.inf,
    "negative": -1, "nested array": [[[1]]], "wrong type": {"a": {"b": 1}}, "control characters": CONTROL,
    "100000 characters": LONG,
}
STORY_PATH_HOSTILE = ("fifo", "link to /dev/zero", "dangling link", "device node", "folder", "huge sparse file",
                      "unreadable file")
STORY_TEXT_KEYS = {"prompt", "title"}
STORY_SIGNED_KEYS = {"seed"}
# Keys whose value is a path (relative to the storyboard) to media it reads.
STORY_PATH_KEYS = {"first_frame", "last_frame", "references"}


def _story_params():
    params = []
    for where, key in storyboard_keys():
        for value_name in STORY_HOSTILE:
            params.append(pytest.param(where, key, value_name, id=f"{where} {key}: {value_name}"))
        if key in STORY_PATH_KEYS:
            for value_name in STORY_PATH_HOSTILE:
                params.append(pytest.param(where, key, "path: " + value_name, id=f"{where} {key}: path {value_name}"))
    return params


@pytest.fixture(scope="module")
def story_files(tmp_path_factory: pytest.TempPathFactory) -> HostileFiles:
    return HostileFiles(tmp_path_factory.mktemp("conformance-story") / "hostile")


def test_the_storyboard_walk_finds_every_key() -> None:
    keys = storyboard_keys()
    assert ("shot", "continue") in keys and ("story", "crossfade_frames") in keys and ("shot", "first_frame") in keys
    COUNTS.entry_points["storyboard keys"] = len(keys)


@pytest.mark.parametrize(("where", "key", "value_name"), _story_params())
def test_storyboard_key_refuses_hostile_value(story_files: HostileFiles, where: str, key: str, value_name: str) -> None:
    from h3bridge.errors import H3BridgeError, RequestError
    from h3bridge.story.plan import plan_story
    from h3bridge.story.storyboard import Storyboard
    if value_name.startswith("path: "):
        hostile = {h.name: h for h in story_files.for_input(folder_expected=False)}.get(value_name[6:])
        if hostile is None:
            pytest.skip(f"{value_name[6:]}: not made here (a device node needs root; root reads mode 000)")
        value: object = ([{"kind": "image", "path": str(hostile.value)}] if key == "references" else str(hostile.value))
    else:
        value = STORY_HOSTILE[value_name]
    shot: dict[str, object] = {"prompt": "x", "frames": 22, "width": 96, "height": 64}
    data: dict[str, object] = {"shot": [shot]}
    if where == "story":      # the story's default, not shadowed by the shot's own
        shot.pop(key, None)
        if key == "seconds":
            shot.pop("frames")
    if key in PARTNERS:
        (shot if where == "shot" else data)[PARTNERS[key][0]] = PARTNERS[key][1]
    if where == "shot":
        shot[key] = value
    else:
        data[key] = value
    case_id = f"{where} {key}: {value_name}"
    before = snapshot(story_files.folder)
    COUNTS.cases += 1
    accepted = (key in STORY_TEXT_KEYS and value_name in ("control characters", "100000 characters")) or \
               (key in STORY_SIGNED_KEYS and value_name == "negative")
    try:
        plan_story(Storyboard.from_dict(data, base_dir=story_files.folder))
    except RequestError as error:
        expected = {key, "shot", "storyboard"} if key in ("prompt",) else {key}
        for group in FIELD_GROUPS:
            if key in group:
                expected |= group
        if error.field not in expected:
            COUNTS.wrong.append(case_id)
        assert error.field in expected, f"{case_id}: refused naming {error.field!r}, not {key!r}: {error}"
    except H3BridgeError as error:
        COUNTS.wrong.append(case_id)
        raise AssertionError(f"{case_id}: {type(error).__name__}, not a RequestError naming {key}: {error}") from None
    except Exception:
        COUNTS.untyped.append(case_id)
        raise
    else:
        if not accepted:
            COUNTS.wrong.append(case_id)
        assert accepted, f"{case_id}: accepted"
    assert changes(before, snapshot(story_files.folder)) == [], f"{case_id}: wrote or replaced something"


# ----------------------------------------------------------------------------- ComfyUI node inputs

NODE_INPUTS = comfy_node_inputs()
# How each node input reaches the library, by input name: the function the node calls with it.
# Inputs ComfyUI itself holds to their type and range (Int/Float widgets with min/max, Combo
# options, Boolean) or that are sockets (Image, Video, Custom) carry no user text to the library:
# they are walked and counted, and their range is ComfyUI's. A String input with no entry here
# fails test_every_node_input_is_classified.
COMFY_PATH_INPUTS = {"model_dir", "engine_path", "library_path"}
COMFY_TEXT_INPUTS = {"job_name", "prompt", "scene", "action", "camera", "look", "audio", "free_text", "shots", "remote_url"}
# String inputs that carry numbers, by the library function the node reads them with.
COMFY_NUMBER_TEXT_INPUTS = {"pick": "h3bridge.story.host:read_picks"}
COMFY_CHECKED_BY_COMFYUI = {"Int", "Float", "Boolean", "Combo", "DynamicCombo", "Image", "Video", "Audio", "Custom",
                            "H3Engine", "H3References", "HexGrid", "H3Cells", "Mask"}


def test_every_node_input_is_classified() -> None:
    assert len({n.node for n in NODE_INPUTS}) >= 8, "the walk lost the node classes"
    unclassified = [f"{n.node}.{n.name} ({n.type})" for n in NODE_INPUTS
                    if n.type not in COMFY_CHECKED_BY_COMFYUI and n.name not in COMFY_PATH_INPUTS | COMFY_TEXT_INPUTS | COMFY_NUMBER_TEXT_INPUTS.keys()]
    assert not unclassified, f"classify {unclassified} in tests/test_conformance.py (COMFY_* sets)"
    COUNTS.entry_points["ComfyUI node inputs"] = len(NODE_INPUTS)


def _comfy_number_text_params():
    from conformance_helpers import hostile_numbers
    names = sorted({n.name for n in NODE_INPUTS if n.name in COMFY_NUMBER_TEXT_INPUTS})
    return [pytest.param(name, hostile.value, id=f"{name}: {hostile.name} as {where}")
            for name in names for hostile in hostile_numbers(signed=False)
            for where in ("shot", "take")]


@pytest.mark.parametrize(("name", "number"), _comfy_number_text_params())
def test_comfy_number_text_input_refuses_hostile_number(name: str, number: str, request) -> None:
    """A String input that carries numbers (H3 Storyboard's pick, "2=3, 4=1"): a hostile number in
    any place is the library's RequestError naming the input, never an untyped exception."""
    import importlib
    from h3bridge.errors import RequestError
    module, function = COMFY_NUMBER_TEXT_INPUTS[name].split(":")
    read = getattr(importlib.import_module(module), function)
    text = f"{number}=1" if request.node.callspec.id.endswith("as shot") else f"2={number}"
    with pytest.raises(RequestError) as refused:
        read(text, field=name)
    assert refused.value.field == name and refused.value.hint, refused.value


def _comfy_params():
    params = []
    names = sorted({n.name for n in NODE_INPUTS if n.name in COMFY_PATH_INPUTS})
    for name in names:
        for value_name in STORY_PATH_HOSTILE:
            params.append(pytest.param(name, value_name, id=f"{name}: {value_name}"))
    return params


@pytest.mark.parametrize(("name", "value_name"), _comfy_params())
def test_comfy_path_input_refuses_hostile_value(story_files: HostileFiles, name: str, value_name: str,
                                                tmp_path: Path) -> None:
    """The path inputs of H3 Engine and H3 LoRA, through the adapter functions the nodes call
    (check_engine_settings, resolve_model_dir): the library's H3BridgeError, nothing written."""
    from h3bridge.comfy import adapter
    from h3bridge.errors import H3BridgeError
    from h3bridge.sim.fixture import write_fixture_model
    hostile = {h.name: h for h in story_files.for_input(folder_expected=name == "model_dir")}.get(value_name)
    if hostile is None:
        pytest.skip(f"{value_name}: not a hostile {name} (or needs root)")
    model = write_fixture_model(tmp_path / "MiniMax-H3")
    engine = tmp_path / "h3"
    engine.write_text(TRIPWIRE)
    engine.chmod(0o755)
    values = {"engine_path": str(engine), "model_dir": str(model), "library_path": ""}
    values[name] = str(hostile.value)
    mode = adapter.LIBRARY if name == "library_path" else adapter.ONE_SHOT
    before = snapshot(story_files.folder)
    COUNTS.cases += 1
    case_id = f"ComfyUI {name}: {value_name}"
    try:
        adapter.check_engine_settings(values["engine_path"], values["model_dir"], mode, [tmp_path],
                                      stall_timeout=None, remote_url="", library_path=values["library_path"],
                                      previews=False)
        if name == "model_dir":
            adapter.resolve_model_dir(values["model_dir"], [tmp_path])
    except H3BridgeError:
        pass
    except Exception:
        COUNTS.untyped.append(case_id)
        raise
    else:
        COUNTS.wrong.append(case_id)
        raise AssertionError(f"{case_id}: accepted")
    assert changes(before, snapshot(story_files.folder)) == []


# ----------------------------------------------------------------------------- the counts

def test_zz_print_the_counts() -> None:
    """Last in the file: the counts of this run (with -s; also in bench/conformance_counts.py)."""
    print("\n" + COUNTS.line())
    if COUNTS.untyped or COUNTS.hangs or COUNTS.writes or COUNTS.wrong:
        print("  (failing cases: "
              + ", ".join((COUNTS.untyped + COUNTS.hangs + COUNTS.writes + COUNTS.wrong)[:20]) + ")")
