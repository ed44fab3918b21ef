"""Every number flag of the CLI is read by safeio.numbers' argparse adapters (issue 29): a number of
thousands of digits, NaN or infinity is refused by the parser itself (exit 2) naming the flag,
with a fix and without echoing the whole value; nothing starts. Only the parser runs here."""
from __future__ import annotations

import pytest

from h3bridge.cli.main import build_parser

HUGE = "9" * 5000

CASES = [
    (["generate", "-p", "a fox", "--width", HUGE], "--width"),
    (["generate", "-p", "a fox", "--seed", "-" + HUGE], "--seed"),
    (["generate", "-p", "a fox", "--steps", HUGE], "--steps"),
    (["generate", "-p", "a fox", "--seconds", "inf"], "--seconds"),
    (["generate", "-p", "a fox", "--seconds", "nan"], "--seconds"),
    (["generate", "-p", "a fox", "--seconds", HUGE + ".5"], "--seconds"),
    (["generate", "-p", "a fox", "--stall-timeout", "inf"], "--stall-timeout"),
    (["generate", "-p", "a fox", "--stall-timeout", "nan"], "--stall-timeout"),
    (["story", "s.toml", "--parallel", HUGE], "--parallel"),
    (["story", "s.toml", "--redo", HUGE], "--redo"),
    (["serve", "--port", "70000"], "--port"),
    (["serve", "--port", HUGE], "--port"),
    (["serve", "--max-upload-mb", "inf"], "--max-upload-mb"),
    (["serve", "--max-upload-mb", "nan"], "--max-upload-mb"),
    (["serve", "--max-upload-mb", "-1"], "--max-upload-mb"),
    (["serve", "--max-uploads", "-1"], "--max-uploads"),
    (["serve", "--max-queued", HUGE], "--max-queued"),
    (["hexgrid", "--width", HUGE, "--height", "64", "-o", "x.png"], "--width"),
    (["verify", "model", "--workers", HUGE], "--workers"),
]


@pytest.mark.parametrize(("argv", "flag"), CASES, ids=[f"{argv[0]} {flag} {argv[argv.index(flag) + 1][:6]}"
                                                       for argv, flag in CASES])
def test_a_hostile_number_flag_is_refused_by_the_parser(argv: list[str], flag: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(argv)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "fix:" in err, err[-600:]
    assert len(err.splitlines()[-1]) < 400, err[-600:]


def test_ordinary_numbers_still_parse() -> None:
    args = build_parser().parse_args(["generate", "-p", "a fox", "--width", "864", "--seconds", "2.5", "--seed", "7",
                                      "--stall-timeout", "0"])
    assert (args.width, args.seconds, args.seed, args.stall_timeout) == (864, 2.5, 7, 0.0)
    args = build_parser().parse_args(["serve", "--port", "0", "--max-upload-mb", "1.5", "--max-uploads", "3"])
    assert (args.port, args.max_upload_mb, args.max_uploads) == (0, 1.5, 3)
