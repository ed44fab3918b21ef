"""Issue 34.3: a fix is data (h3bridge.fixes: request fields and values), and each interface says it
with ONE renderer of its own; below the command line nothing spells a flag or rewrites a message
with a regular expression.

Each renderer's output is fed back to its interface: the CLI's flags through h3bridge's own argparse
parser (and the request they give must fit), HTTP's fields through the body parser, the storyboard's
keys through the storyboard reader, Python's keywords through GenerationRequest / preflight. ComfyUI's
input names are checked against the nodes' schemas in test_comfy_suggestion_words.py (ComfyUI's python).
"""
from __future__ import annotations

import ast
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from h3bridge.errors import MemoryPlanError, RequestError
from h3bridge.fixes import Change, Fix, changes, python_words
from h3bridge.model.memory import MachineFacts, MemoryPlan, plan_memory
from h3bridge.request import GenerationRequest, ReferenceKind

ROOT = Path(__file__).resolve().parents[1] / "h3bridge"


# ----------------------------------------------------------------------------- real suggestions

# (plan argv of the request, machine memory in GB, live preview) - chosen so that between them the
# suggestions name every knob the search reaches with upstream's published sizes: preview, SSD
# streaming (and the int8 FC2 it excludes), render canvas, frames (with seconds left out). Fewer
# layers come after SSD streaming, which leaves the DiT too small for them to matter: LAYERS below.
CASES = [
    (["--width", "864", "--height", "480", "--frames", "56"], 24, False),
    (["--width", "1344", "--height", "768", "--seconds", "15", "--int8-row-fc2"], 18, False),
    (["--width", "1344", "--height", "768", "--seconds", "15"], 17, False),
    (["--width", "1344", "--height", "768", "--frames", "56", "--ssd-streaming", "--show"], 19, True),
]
LAYERS = (Change("layers", 40),)


def _plan_args(argv: list[str]):
    from h3bridge.cli.main import build_parser
    return build_parser().parse_args(["plan", "-p", "a fox", *argv])


def _plans() -> list[tuple[list[str], int, MemoryPlan]]:
    from h3bridge.cli.main import request_from_args
    plans = []
    for argv, gigabytes, preview in CASES:
        args = _plan_args(argv)
        plan = plan_memory(request_from_args(args), machine=MachineFacts.mac(gigabytes), preview=preview)
        assert not plan.fits and plan.suggestion is not None, (argv, gigabytes, plan.verdict())
        plans.append((argv, gigabytes, plan))
    return plans


@pytest.fixture(scope="module")
def plans() -> list[tuple[list[str], int, MemoryPlan]]:
    return _plans()


def test_the_cases_name_every_knob(plans) -> None:
    named = {change.field for _, _, plan in plans for change in plan.suggestion.settings}
    assert named == {"preview", "ssd_streaming", "int8_row_fc2", "render_width", "render_height",
                     "frames", "seconds"}, named


# ----------------------------------------------------------------------------- the command line

def _without(argv: list[str], flag: str) -> list[str]:
    """argv with `flag` (and its value, when it takes one) left out."""
    if flag not in argv:
        return argv
    at = argv.index(flag)
    takes_value = at + 1 < len(argv) and not argv[at + 1].startswith("--")
    return argv[:at] + argv[at + 1 + takes_value:]


def test_the_cli_says_a_suggestion_as_flags_that_parse_to_a_request_that_fits(plans) -> None:
    from h3bridge.cli.main import request_from_args
    from h3bridge.cli.engine import cli_words
    for argv, gigabytes, plan in plans:
        said = cli_words(plan.suggestion.settings)
        assert "=" not in said and "_" not in said, said
        # "(omit --x)" leaves a flag off; the rest are flags to add, exactly as shown
        omitted = re.findall(r"\(omit (--[a-z0-9-]+)\)", said)
        added = shlex.split(re.sub(r"\(omit --[a-z0-9-]+\)", "", said))
        fixed = argv
        for flag in omitted:
            fixed = _without(fixed, flag)
        args = _plan_args([*fixed, *added])
        for change in plan.suggestion.settings:
            dest = "show" if change.field == "preview" else change.field
            assert getattr(args, dest) in ((change.value,) if change.value else (None, False)), (said, dest)
        again = plan_memory(request_from_args(args), machine=MachineFacts.mac(gigabytes), preview=args.show)
        assert again.fits, (argv, said, again.verdict())


def test_the_cli_says_fewer_layers_as_the_flag() -> None:
    from h3bridge.cli.engine import cli_words
    said = cli_words(LAYERS)
    assert said == "--layers 40" and _plan_args(shlex.split(said)).layers == 40


def test_the_cli_says_force_as_the_generate_flag() -> None:
    from h3bridge.cli.main import build_parser
    from h3bridge.cli.engine import cli_words
    said = cli_words(changes(force=True))
    assert said == "--force"
    assert build_parser().parse_args(["generate", "-p", "fox", *shlex.split(said)]).force is True


def test_a_field_without_a_flag_is_said_as_such_on_the_command_line() -> None:
    from h3bridge.cli.engine import cli_words
    said = cli_words((Change("not_a_field", 1),))
    assert not said.startswith("--") and "not_a_field" in said


def test_the_cli_prints_a_memory_refusal_with_flags_and_never_python_words(capsys, tmp_path: Path) -> None:
    from h3bridge.cli.main import cli_error_text
    from h3bridge.model.memory import require_fit
    plan = plan_memory(GenerationRequest("fox", width=864, height=480, frames=56), machine=MachineFacts.mac(24))
    with pytest.raises(MemoryPlanError) as caught:
        require_fit(plan)
    assert caught.value.hint == "use ssd_streaming=True (or pass force=True to try anyway)"    # Python's words
    text = cli_error_text(caught.value)
    assert text.endswith("fix: use --ssd-streaming (or pass --force to try anyway)") and "=True" not in text


# Requests the library refuses, each naming the settings it was given and the ones to use instead.
BAD_REQUESTS = [dict(frames=23), dict(frames=3), dict(frames=400), dict(seconds=-1), dict(seconds=0.01),
                dict(seconds=100), dict(seconds=20), dict(frames=22, seconds=1.0), dict(width=95),
                dict(width=1920, height=1080), dict(width=1920, height=1088), dict(render_width=32),
                dict(render_width=0, render_height=0), dict(ssd_streaming=True, int8_row_fc2=True),
                dict(core_reuse=3, reuse=2), dict(steps=0), dict(layers=1), dict(seed=-1), dict(reuse=99)]


def _refusal(fields: dict) -> RequestError:
    with pytest.raises(RequestError) as caught:
        GenerationRequest("fox", **{"width": 96, "height": 64, **fields}).validate()
    return caught.value


@pytest.mark.parametrize("fields", BAD_REQUESTS, ids=lambda fields: ",".join(fields))
def test_a_refusal_names_its_settings_in_each_interfaces_words(fields: dict) -> None:
    """What in_cli_words used to rewrite is data (a Given for what the request said, a Change for
    what to use): the CLI says flags, a storyboard its keys, Python its keywords; no interface shows
    another's spelling."""
    from h3bridge.cli.main import build_parser, cli_error_text
    from h3bridge.cli.story import storyboard_words
    error = _refusal(fields)
    python = str(error)
    assert re.search(r"\b[a-z][a-z0-9_]*=", python) or any(name in python for name in fields), python
    assert "--" not in python, python
    said = cli_error_text(error)
    assert not re.search(r"\b[a-z][a-z0-9_]*=", said) and "--" in said, said
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", said))
    known = {option for action in build_parser()._subparsers._group_actions[0].choices["generate"]._actions
             for option in action.option_strings}
    assert flags <= known, (said, flags - known)
    story = error.message_in(storyboard_words) + (error.hint_in(storyboard_words) or "")
    assert not re.search(r"\b[a-z][a-z0-9_]*=", story) and "--" not in story, story


def test_a_shot_number_put_before_a_refusal_keeps_its_data() -> None:
    from h3bridge.cli.main import cli_error_text
    error = _refusal(dict(frames=23))
    again = RequestError(error.message_with("shot 2: "), field=error.field, hint=error.hint_data)
    assert str(again) == "shot 2: " + str(error)
    assert cli_error_text(again).startswith("shot 2: --frames 23 is not a legal H3 length")
    error.reword("shot 3: ")
    assert cli_error_text(error).startswith("shot 3: --frames 23 is not") and error.args == (error.message,)


def test_the_cli_says_a_reference_kind_with_its_flag() -> None:
    from h3bridge.cli.main import build_parser
    from h3bridge.cli.engine import cli_words
    for kind in ReferenceKind:
        said = cli_words((Change("references", kind),))
        flag = said.split()[-1]
        assert flag.startswith("--ref-")
        values = ["a.mp4", "b.wav"] if kind is ReferenceKind.VIDEO_AUDIO else ["a.mp4"]
        args = build_parser().parse_args(["generate", "-p", "fox", flag, *values])
        assert [reference.kind for reference in args.references] == [kind]


# ----------------------------------------------------------------------------- HTTP

def test_http_says_a_suggestion_as_body_fields_the_api_reads(plans) -> None:
    from h3bridge.wire.videos import http_words, pairs_from_json, request_from_wire
    groups = [[change for change in plan.suggestion.settings if change.field != "preview"] for _, _, plan in plans]
    for settings, plan in zip([*groups, list(LAYERS)], [*(plan for _, _, plan in plans), plans[0][2]]):
        said = http_words(settings)
        kept = re.sub(r'\(leave "[a-z_]+" out\)(, )?', "", said).strip(", ")
        body = {"prompt": "fox", "width": plan.request.width, "height": plan.request.height,
                **json.loads("{" + kept + "}")}
        request, _ = request_from_wire(pairs_from_json(body))
        for change in settings:
            if change.value is not None:
                assert getattr(request, change.field) == change.value, (said, change)


def test_http_says_what_no_body_field_sets_as_the_servers_setting() -> None:
    from h3bridge.wire.videos import http_words
    said = http_words(changes(preview=False, force=True))
    assert "--" not in said and said.count("the server's setting") == 2, said


def test_an_http_refusal_says_its_fix_with_body_fields() -> None:
    from h3bridge.request import _SILENT
    from h3bridge.wire.videos import FILE_FIELDS, refusal_body
    error = RequestError("reference 1 (video): too short", field="references",
                         hint=Fix("use a longer video, or use {}", _SILENT))
    hint = refusal_body(error).error.hint or ""
    assert hint == 'use a longer video, or use a "ref_silent_video" file part'
    assert "ref_silent_video" in FILE_FIELDS


# ----------------------------------------------------------------------------- storyboards

def test_a_storyboard_says_a_suggestion_as_keys_it_reads(plans, tmp_path: Path) -> None:
    from h3bridge.cli.story import STORYBOARD_FIELDS, storyboard_words
    from h3bridge.story.storyboard import Storyboard
    groups = [[change for change in plan.suggestion.settings if change.field not in ("preview", "seconds")]
              for _, _, plan in plans]      # a story shows no live preview; a shot's frames replace its seconds
    for number, (settings, plan) in enumerate(zip([*groups, list(LAYERS)], [*(p for _, _, p in plans), plans[0][2]])):
        said = storyboard_words(settings)
        keys = tomllib.loads(said.replace(", ", "\n"))       # each setting is one TOML line
        assert set(keys) <= STORYBOARD_FIELDS, said
        path = tmp_path / f"story-{number}.toml"
        path.write_text(f"width = {plan.request.width}\nheight = {plan.request.height}\n"
                        + "".join(f"{line}\n" for line in said.split(", ") if not line.startswith("frames"))
                        + '[[shot]]\nprompt = "a fox"\n'
                        + next((f"{line}\n" for line in said.split(", ") if line.startswith("frames")), "frames = 22\n"))
        request = Storyboard.from_toml(path).base_request(1)
        for change in settings:
            assert getattr(request, change.field) == change.value, (said, change)


# ----------------------------------------------------------------------------- Python

def test_python_says_a_suggestion_as_keyword_arguments_that_build_the_request(plans) -> None:
    for _, gigabytes, plan in plans:
        said = python_words([change for change in plan.suggestion.settings if change.field != "preview"])
        keywords = eval(f"dict({said})")        # the text is Python: exactly what a caller types
        request = plan.request.with_changes(**keywords)
        assert request == plan.suggestion.request, said
        assert plan_memory(request, machine=MachineFacts.mac(gigabytes), preview=plan.suggestion.preview).fits
    assert GenerationRequest("fox", **eval(f"dict({python_words(LAYERS)})")).layers == 40


# ----------------------------------------------------------------------------- nothing below the CLI spells a flag

# The layers below the command line: they carry fixes as data and never spell an interface's words.
SCOPE = ["engines", "model", "request.py", "story", "comfy", "fixes.py", "errors.py"]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")

# Flags that are not a suggestion to h3bridge's user: other programs' command lines that h3bridge
# builds or quotes (h3's own argv, the library worker's, make, hf, h3-sim-model, xcode-select).
# file -> (the flags it may spell, why).
OTHER_PROGRAMS: dict[str, tuple[set[str], str]] = {
    "engines/h3_command.py": (set(), "h3's argv, built flag by flag from the request: every flag there is h3's"),
    "engines/session.py": ({"--use-slower-", "--ref-image-size"}, "h3's interactive-mode option lines"),
    "engines/oneshot.py": ({"--frames-dir"}, "h3's --frames-dir"),
    "engines/library.py": ({"--library", "--model-dir"}, "the library worker's argv, ours to ourselves"),
    "engines/library_worker.py": ({"--library", "--model-dir"}, "the library worker parses its own argv"),
    "engines/library_build.py": ({"--output", "--engine", "--install"}, "make's and the compiler's command lines, "
                                 "Apple's `xcode-select --install`"),
    "engines/locate.py": ({"--realistic"}, "h3-sim-model's --realistic, a command for another program"),
    "model/safetensors.py": ({"--local-dir"}, "hf download's --local-dir, quoted in a fix for another program"),
    "model/inventory.py": ({"--local-dir", "--info"}, "hf download's --local-dir; h3's own --info"),
    "model/memory/phases.py": ({"--show"}, "h3's own --show (the preview VAE it loads), naming the phase part"),
    "story/storyboard.py": ({"--use-slower-"}, "h3's --use-slower-* flags, which slower_paths names"),
}


# Flag suggestions not yet said as data (issue 34.3's remainder, each to become a Fix): a count per
# file that may only go down. A new flag literal anywhere else fails. (Empty: every one is a Fix.)
NOT_YET_DATA: dict[str, int] = {}


def _scoped_files() -> list[Path]:
    files: list[Path] = []
    for part in SCOPE:
        path = ROOT / part
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def _docstring_ids(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


# A whole command built by h3bridge.runnable (h3bridge_command / command) runs as shown where it is
# shown: its arguments are a command line, not a flag dropped into prose.
COMMAND_BUILDERS = {"h3bridge_command", "command"}


def _command_arguments(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in COMMAND_BUILDERS:
                found.update(id(part) for argument in node.args for part in ast.walk(argument))
    return found


def flag_literals(path: Path) -> list[tuple[int, str]]:
    """(line, flag) of every string literal (docstrings and runnable commands aside) that spells a --flag."""
    tree = ast.parse(path.read_text())
    skipped = _docstring_ids(tree) | _command_arguments(tree)
    return [(node.lineno, flag) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped
            for flag in FLAG.findall(node.value)[:1]]


def regex_rewrites(path: Path) -> list[int]:
    """Lines that call a regular expression's sub/subn (re.sub(...), PATTERN.sub(...))."""
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("sub", "subn")
            and (not isinstance(node.func.value, ast.Name) or node.func.value.id == "re"
                 or node.func.value.id.isupper())]


# Where no message is rewritten either: the layers below the CLI and the CLI itself, which says an
# error's fix with its renderer (cli_words) and never rewrites the library's prose. The simulator,
# the engine build and the LoRA fold are other programs' text and numbers.
REGEX_SCOPE_SKIPS = ("sim", "engine_build", "lora")

# sub() calls that are not message rewrites: file -> why.
REGEX_NOT_PROSE: dict[str, str] = {
    "prompt.py": "normalises the user's prompt (runs of spaces and blank lines), not a message",
}


def _regex_scoped_files() -> list[Path]:
    return [path for path in sorted(ROOT.rglob("*.py")) if path.relative_to(ROOT).parts[0] not in REGEX_SCOPE_SKIPS]


def test_nothing_below_the_cli_spells_a_flag_or_rewrites_a_message() -> None:
    spelled: dict[str, list[tuple[int, str]]] = {}
    rewrites: dict[str, list[int]] = {}
    for path in _scoped_files():
        name = str(path.relative_to(ROOT))
        allowed, _ = OTHER_PROGRAMS.get(name, (set(), ""))
        found = [(line, flag) for line, flag in flag_literals(path)
                 if flag not in allowed and name != "engines/h3_command.py"]
        if found:
            spelled[name] = found
        text = path.read_text()
        assert "in_cli_words" not in text and "in_storyboard_words" not in text, name     # the CLI's own
    for path in _regex_scoped_files():       # the CLI too: it renders data, it does not rewrite prose
        name = str(path.relative_to(ROOT))
        if name not in REGEX_NOT_PROSE and (lines := regex_rewrites(path)):
            rewrites[name] = lines
        assert not re.search(r"def in_(cli|storyboard)_words\b", path.read_text()), name
    assert "cli/main.py" in {str(path.relative_to(ROOT)) for path in _regex_scoped_files()}
    assert not rewrites, f"say the fix as data (h3bridge.fixes), not by rewriting prose: {rewrites}"
    over = {name: found for name, found in spelled.items() if len(found) > NOT_YET_DATA.get(name, 0)}
    assert not over, f"flags spelled below the CLI (give the hint as a Fix, said by cli_words): {over}"
    # the remainder only shrinks: a file that says fewer flags now lowers its count here
    stale = {name: (count, len(spelled.get(name, []))) for name, count in NOT_YET_DATA.items()
             if len(spelled.get(name, [])) < count}
    assert not stale, f"lower NOT_YET_DATA to what is left: {stale}"


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The scan itself: a flag in a message and a re.sub of prose are found, a docstring is not."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""Docs may say --ssd-streaming."""\nimport re\n'
                      'HINT = "pass --force"\nTEXT = re.sub(r"a", "b", HINT)\n_X = re.compile("a")\nY = _X.sub("", HINT)\n')
    assert flag_literals(sample) == [(3, "--force")]
    assert regex_rewrites(sample) == [4, 6]
    sample.write_text('HINT = f"run `{h3bridge_command(\'verify\', \'--checksums\')}`, or pass --force"\n')
    assert flag_literals(sample) == [(1, "--force")]
