"""safeio.numbers (issue 29): every number a user or a client gives is read by read_int / read_float:
bounded digits before int() or float() sees them, finite, in the caller's range, a bool is not a
number, and the refusal is a RequestError naming the field in the caller's words."""
from __future__ import annotations

import argparse
from typing import Annotated

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from h3bridge.cli.flags import float_flag, int_flag
from h3bridge.errors import RequestError
from h3bridge.safeio.numbers import (
    FloatField,
    IntField,
    LongNumber,
    json_int,
    read_float,
    read_int,
)


@pytest.mark.parametrize("value", ["9" * 5000, "-" + "9" * 5000, 10**400, -(10**4400), LongNumber("9" * 6000)],
                         ids=["5000-digit text", "negative text", "400-digit int", "4401-digit int", "long literal"])
def test_huge_whole_numbers_are_refused_naming_the_field_and_their_size(value) -> None:
    with pytest.raises(RequestError) as caught:
        read_int(value, field="--retries", minimum=0, maximum=1000)
    assert caught.value.field == "--retries"
    assert "digit number" in caught.value.message and "digits" in caught.value.message
    assert caught.value.hint and "--retries=" in caught.value.hint


@pytest.mark.parametrize("value", [10**400, "9" * 400, "9" * 5000 + ".5", "1e999", "nan", "NaN", "-inf", "Infinity",
                                   float("nan"), float("inf"), "0." + "0" * 500 + "1", LongNumber("1" * 5000)])
def test_floats_are_finite_and_bounded(value) -> None:
    with pytest.raises(RequestError) as caught:
        read_float(value, field="extra_params.flow_shift")
    assert caught.value.field == "extra_params.flow_shift"
    assert caught.value.message.startswith("extra_params.flow_shift=")


@pytest.mark.parametrize("value", [True, False, None, [1], {"a": 1}, "1.5", "", " ", "0x10", "1_000", "١٢"])
def test_what_is_not_a_whole_number_is_refused(value) -> None:
    with pytest.raises(RequestError, match="must be a whole number"):
        read_int(value, field="seed")


def test_numbers_in_range_are_read_from_json_and_text() -> None:
    assert read_int(" 42 ", field="n", minimum=0, maximum=100) == 42
    assert read_int(-3, field="n") == -3
    assert read_int("0" * 5000 + "7", field="n") == 7 and read_int("-" + "0" * 5000 + "7", field="n") == -7
    assert read_float("2.5", field="x", greater_than=0) == 2.5
    assert read_float(7, field="x") == 7.0 and isinstance(read_float(7, field="x"), float)
    assert read_float("1e3", field="x", maximum=1000) == 1000.0
    with pytest.raises(RequestError, match=r"out of range.*at most 100"):
        read_int(101, field="n", minimum=0, maximum=100)
    with pytest.raises(RequestError, match="more than 0"):
        read_float("0", field="--timeout", greater_than=0)
    with pytest.raises(RequestError, match="must be a finite number"):
        read_float(True, field="x")
    assert json_int("12") == 12 and isinstance(json_int("1" * 5000), LongNumber)


def test_the_argparse_adapters_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="h3bridge")
    parser.add_argument("--retries", type=int_flag(0, 1000))
    parser.add_argument("--timeout", type=float_flag(greater_than=0))
    assert parser.parse_args(["--retries", "3", "--timeout", "2.5"]) == argparse.Namespace(retries=3, timeout=2.5)
    for argv in (["--retries", str(10**400)], ["--timeout", "inf"], ["--retries", "x"], ["--timeout", "-1"]):
        with pytest.raises(SystemExit) as caught:
            parser.parse_args(argv)
        assert caught.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {argv[0]}:" in err and "fix:" in err and len(err) < 600, err


class _Model(BaseModel):
    limit: Annotated[int, IntField(1, 100)] = 20
    shift: Annotated[float, FloatField(greater_than=0)] = 1.0


def test_the_pydantic_annotations_refuse_naming_the_field() -> None:
    assert _Model(limit="5", shift="2.5") == _Model(limit=5, shift=2.5)
    for values, field in (({"limit": "9" * 5000}, "limit"), ({"limit": True}, "limit"), ({"shift": "nan"}, "shift"),
                          ({"shift": 10**400}, "shift")):
        with pytest.raises(ValidationError) as caught:
            _Model(**values)
        assert caught.value.errors()[0]["loc"] == (field,)
        assert field in caught.value.errors()[0]["msg"]


ANYTHING = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                     st.text(max_size=20), st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
                     st.integers(min_value=300, max_value=5000).map(lambda n: 10**n),
                     st.lists(st.integers(), max_size=2), st.text(alphabet="0123456789.eE+-naifINF", max_size=30))


@settings(max_examples=300, deadline=None)
@given(value=ANYTHING)
def test_any_value_is_a_number_or_a_request_error(value) -> None:
    for read in (lambda: read_int(value, field="f", minimum=-5, maximum=5),
                 lambda: read_float(value, field="f", minimum=-5.0, maximum=5.0)):
        try:
            read()
        except RequestError as error:
            assert error.field == "f" and len(error.message) < 400


def test_no_pattern_reads_more_than_a_numbers_length_of_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 256 KiB field of digits ending in a letter once sent read_float's pattern backtracking for
    hours (found by bench/fuzz_parsers.py): the text's length is now checked before any pattern."""
    from h3bridge.safeio import numbers

    class Bounded:
        def __init__(self, pattern) -> None:
            self.pattern = pattern

        def fullmatch(self, text: str):
            assert len(text) <= numbers.DEFAULT_MAX_DIGITS + numbers._FLOAT_TEXT_SLACK, len(text)
            return self.pattern.fullmatch(text)

    monkeypatch.setattr(numbers, "_FLOAT_TEXT", Bounded(numbers._FLOAT_TEXT))
    monkeypatch.setattr(numbers, "_NOT_FINITE_TEXT", Bounded(numbers._NOT_FINITE_TEXT))
    for text in ("9" * 256_000 + "x", "1." + "9" * 256_000 + "x", "-" + "0" * 256_000, "9" * 256_000):
        with pytest.raises(RequestError, match="digits|characters long") as caught:
            read_float(text, field="seconds")
        assert len(caught.value.message) < 300
