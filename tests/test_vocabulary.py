"""One name for each optional engine path in every interface (issue 20 item 2): the request's
field (`int8_row_fc2`, `reference_rope`, `slower_paths`) is the storyboard key, the server's body
field and, with dashes, the CLI flag; the old spellings still work, each with a notice naming
the new one. And a storyboard's refusals are said in storyboard keys, not CLI flags."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core_helpers import sim_engine_path
from h3bridge.cli.main import build_parser, main, request_from_args
from h3bridge.errors import RequestError
from h3bridge.request import GenerationRequest, SlowerPath
from h3bridge.wire.videos import FIELDS, request_from_wire, request_to_wire
from h3bridge.story.storyboard import SHOT_KEYS, Storyboard
from model_helpers import fl2va_template  # noqa: F401  (fixture)

NAMES = ("int8_row_fc2", "reference_rope", "slower_paths")


def test_every_interface_uses_the_requests_names() -> None:
    fields = {f.name for f in dataclasses.fields(GenerationRequest)}
    flags = {option: action.dest for action in build_parser()._subparsers._group_actions[0].choices["generate"]._actions
             for option in action.option_strings}
    for name in NAMES:
        assert name in fields and name in SHOT_KEYS
        assert any(spec.name == name and spec.target == name for spec in FIELDS), name
        assert flags["--" + name.replace("_", "-")] == name


def generate_args(*flags: str):
    return build_parser().parse_args(["generate", "-p", "fox", *flags])


def test_cli_flags_and_their_old_spellings(capsys: pytest.CaptureFixture[str]) -> None:
    current = request_from_args(generate_args("--int8-row-fc2", "--reference-rope",
                                              "--slower-paths", "bf16-qkv", "scalar-qkv-rms"))
    assert capsys.readouterr().err == ""
    old = request_from_args(generate_args("--use-int8-row-fc2", "--use-reference-rope",
                                          "--use-slower-bf16-qkv", "--use-slower-scalar-qkv-rms"))
    notices = capsys.readouterr().err.splitlines()
    assert current == old
    assert current.int8_row_fc2 and current.reference_rope
    assert current.slower_paths == frozenset({SlowerPath.BF16_QKV, SlowerPath.SCALAR_QKV_RMS})
    assert notices == [
        "h3bridge: notice: --use-int8-row-fc2 is now --int8-row-fc2 (the old spelling still works for now)",
        "h3bridge: notice: --use-reference-rope is now --reference-rope (the old spelling still works for now)",
        "h3bridge: notice: --use-slower-bf16-qkv is now --slower-paths bf16-qkv (the old spelling still works for now)",
        "h3bridge: notice: --use-slower-scalar-qkv-rms is now --slower-paths scalar-qkv-rms "
        "(the old spelling still works for now)"]


def test_server_fields_and_their_old_spellings() -> None:
    current, _ = request_from_wire([("prompt", "fox"), ("int8_row_fc2", "true"), ("reference_rope", True),
                                    ("slower_paths", "bf16-qkv")])
    with pytest.warns(DeprecationWarning, match="'use_int8_row_fc2' is now 'int8_row_fc2'"):
        old, _ = request_from_wire([("prompt", "fox"), ("use_int8_row_fc2", "true"), ("use_reference_rope", True),
                                    ("use_slower", "bf16-qkv")])
    assert current == old and current.int8_row_fc2 and current.slower_paths == frozenset({SlowerPath.BF16_QKV})
    body = request_to_wire(current).fields
    assert body["int8_row_fc2"] is True and body["reference_rope"] is True and body["slower_paths"] == ["bf16-qkv"]
    assert not any(name.startswith("use_") for name in body)


def test_storyboard_keys_and_their_old_spellings() -> None:
    shot = {"prompt": "fox", "int8_row_fc2": True, "reference_rope": True, "slower_paths": ["bf16-qkv"]}
    current = Storyboard.from_dict({"shot": [shot]}).base_request(1)
    with pytest.warns(DeprecationWarning, match="shot 1: 'use_slower' is now 'slower_paths'"):
        old = Storyboard.from_dict({"shot": [{"prompt": "fox", "use_int8_row_fc2": True, "use_reference_rope": True,
                                              "use_slower": ["bf16-qkv"]}]}).base_request(1)
    assert current == old
    with pytest.raises(RequestError, match="'use_int8_row_fc2' and 'int8_row_fc2' are the same setting"):
        Storyboard.from_dict({"shot": [{"prompt": "fox", "use_int8_row_fc2": True, "int8_row_fc2": False}]})


def story(capsys: pytest.CaptureFixture[str], tmp_path: Path, model: Path, text: str) -> tuple[int, str]:
    board = tmp_path / "story.toml"
    board.write_text(text)
    capsys.readouterr()
    status = main(["story", str(board), "--engine-path", str(sim_engine_path()), "--model-dir", str(model),
                   "--quiet"])
    return status, capsys.readouterr().err


def test_storyboard_refusals_use_storyboard_keys(tmp_path: Path, fl2va_template: Path,  # noqa: F811
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    status, err = story(capsys, tmp_path, fl2va_template, '[[shot]]\nprompt = "fox"\nuse_int8_row_fc22 = true\n')
    assert status == 2
    assert "did you mean 'int8_row_fc2'?" in err and "--" not in err, err
    assert "valid keys: prompt, continue," in err and "core_reuse, token_reduction" in err
    status, err = story(capsys, tmp_path, fl2va_template,
                        'width = 96\nheight = 64\n[[shot]]\nprompt = "fox"\nframes = 23\n')
    assert status == 2
    assert err.splitlines() == ["h3bridge: shot 1: frames = 23 is not a legal H3 length; the next legal lengths "
                                "are 22 and 39",
                                "  fix: use frames = 22 or frames = 39 (legal lengths are 5 + 17n, 22..362)"]


def test_an_old_storyboard_key_gets_a_one_line_notice(tmp_path: Path, fl2va_template: Path,  # noqa: F811
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    status, err = story(capsys, tmp_path, fl2va_template,
                        'width = 96\nheight = 64\nuse_reference_rope = true\n[[shot]]\nprompt = "fox"\nframes = 23\n')
    assert status == 2
    assert err.splitlines()[0] == (f"h3bridge: notice: {tmp_path / 'story.toml'}: the storyboard's top level: "
                                   "'use_reference_rope' is now 'reference_rope' (the old spelling still works for now)")
