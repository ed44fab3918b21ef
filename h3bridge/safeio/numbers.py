"""Read a number a user, a client or a file gave: as JSON, or as text (a CLI flag, a form field).

One function per shape: `read_int` and `read_float`, each with the caller's range and the name of
the field in the caller's words (`--retries` in the CLI, `extra_params.flow_shift` over HTTP). What
every caller gets without asking:

* bounded digits: a value of more than `max_digits` digits is refused before `int()` or `float()`
  sees it (int() of 4,301+ digits raises ValueError, float() of a 309-digit int OverflowError);
* finite: NaN and infinity are refused, however they are spelled;
* `True` is not 1: a bool is refused where a number is asked for;
* every refusal is a RequestError naming the field, the value (cut short: a 5,000-digit number is
  shown as "(a 5000-digit number)") and the fix.

The command line's argparse `type=` adapters over these are cli/flags.py's `int_flag` /
`float_flag`; `IntField` / `FloatField` are pydantic annotations (a refusal becomes a validation error naming
the field). `json_int` is json.loads's `parse_int` that keeps over-long integer literals as text
(`LongNumber`) so the field they were given for can still be named.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import RequestError, digit_count, shown_value

# The digits a number may have unless the caller says otherwise: far more than any setting takes
# (a seed of 2**64-1 has 20), far fewer than make int() or float() slow or raise.
DEFAULT_MAX_DIGITS = 100
# A float's text may have this many characters (digits, point, exponent) beyond its digits.
_FLOAT_TEXT_SLACK = 16

# int(str) refuses more digits than this (CPython's guard against quadratic conversion time;
# sys.get_int_max_str_digits, 4300 unless lowered).
PYTHON_INT_DIGITS = min(4300, getattr(sys, "get_int_max_str_digits", lambda: 0)() or 4300)

_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NOT_FINITE_TEXT = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


@dataclass(frozen=True)
class LongNumber:
    """A JSON integer literal longer than Python reads (`json_int`), kept as its text so the field
    it was given for is named when it is refused."""

    text: str

    def __repr__(self) -> str:
        return shown_value(whole_number(self.text))


def json_int(text: str) -> int | LongNumber:
    """json.loads's parse_int: an int, or a LongNumber past Python's digit limit (int() would raise
    ValueError before any field is known)."""
    return int(text) if len(text) <= PYTHON_INT_DIGITS else LongNumber(text)


def whole_number(text: str) -> int:
    """Whole-number text (sign, digits) as an int, at any length. Past Python's digit limit no
    setting can take the value, so it stands in by its size alone, 10**(N-1) for N digits: a range
    check then refuses it, showing "(a N-digit number)"."""
    text = text.strip()
    if len(text) <= PYTHON_INT_DIGITS:
        return int(text)
    negative = text.startswith("-")
    significant = len(text.lstrip("+-").lstrip("0"))
    number = 10 ** (significant - 1) if significant else 0
    return -number if negative else number


def _digits_of_text(text: str) -> int:
    """Significant digits of number text (leading zeros and the exponent do not count)."""
    mantissa = re.split(r"[eE]", text, maxsplit=1)[0]
    return len(mantissa.lstrip("+-").replace(".", "").lstrip("0"))


def _shown(value: object) -> str:
    """The value as a message shows it; digit text as "(a N-digit number)" past 30 digits."""
    text = value.text if isinstance(value, LongNumber) else value.strip() if isinstance(value, str) else None
    if text is not None and len(text) > 30 and _INT_TEXT.fullmatch(text):
        digits = _digits_of_text(text)       # counted, never converted: the text may be 256 KiB
        if digits > 30:
            return f"({'a negative' if text.startswith('-') else 'a'} {digits}-digit number)"
    return shown_value(value)


def _subject(field: str | None, value: object) -> str:
    return f"{field}={_shown(value)}" if field else _shown(value)


def range_words(minimum: float | None, maximum: float | None, greater_than: float | None = None) -> str:
    low = (f"more than {greater_than:g}" if greater_than is not None else
           f"at least {minimum:g}" if isinstance(minimum, float) else
           f"at least {minimum}" if minimum is not None else "")
    high = (f"at most {maximum:g}" if isinstance(maximum, float) else
            f"at most {maximum}" if maximum is not None else "")
    return " and ".join(part for part in (low, high) if part)


def _refuse(field: str | None, value: object, problem: str, fix: str) -> RequestError:
    return RequestError(f"{_subject(field, value)} {problem}", field=field, hint=fix)


def _use(field: str | None, example: object) -> str:
    return f"use {field}={example}" if field else f"use {example}"


def read_int(value: object, *, field: str | None, minimum: int | None = None, maximum: int | None = None,
             max_digits: int = DEFAULT_MAX_DIGITS, hint: str | None = None) -> int:
    """A whole number from JSON (an int; a bool or a float is refused) or text ("42", "-7");
    RequestError(field=field) for anything else, past `max_digits` digits, or outside
    [minimum, maximum]. `hint` replaces the fix the refusal suggests."""
    wanted = "a whole number" + (f" ({range_words(minimum, maximum)})" if minimum is not None or maximum is not None
                                 else "")
    example = minimum if minimum is not None else maximum if maximum is not None else 1
    if isinstance(value, bool) or not isinstance(value, (int, str, LongNumber)):
        raise _refuse(field, value, f"must be {wanted}", hint or _use(field, example))
    if isinstance(value, int):
        digits = digit_count(value)
    else:
        text = value.text if isinstance(value, LongNumber) else value.strip()
        if not _INT_TEXT.fullmatch(text):
            raise _refuse(field, value, f"must be {wanted}", hint or _use(field, example))
        digits = _digits_of_text(text)
    if digits > max_digits:
        negative = value < 0 if isinstance(value, int) else text.startswith("-")
        nearest = (minimum if minimum is not None and negative else maximum if maximum is not None else example)
        raise _refuse(field, value, f"has {digits} digits; it must be {wanted}", hint or _use(field, nearest))
    # int() counts leading zeros against Python's 4,300-digit limit: only the significant digits go in.
    number = value if isinstance(value, int) else int(text[:1].strip("0123456789") + (text.lstrip("+-").lstrip("0") or "0"))
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        nearest = minimum if minimum is not None and number < minimum else maximum
        raise _refuse(field, number, f"is out of range: it must be {wanted}", hint or _use(field, nearest))
    return number


def read_float(value: object, *, field: str | None, minimum: float | None = None, maximum: float | None = None,
               greater_than: float | None = None, max_digits: int = DEFAULT_MAX_DIGITS,
               hint: str | None = None) -> float:
    """A finite number from JSON (an int or a float; a bool is refused) or text ("2.5", "1e3");
    RequestError(field=field) for anything else, NaN or infinity, past `max_digits` digits, or
    outside [minimum, maximum] (and not above `greater_than`, when given)."""
    ranged = range_words(minimum, maximum, greater_than)
    wanted = "a finite number" + (f" ({ranged})" if ranged else "")
    example: float = (minimum if minimum is not None else maximum if maximum is not None else
                      greater_than + 1 if greater_than is not None else 1)
    fix = hint or _use(field, f"{example:g}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str, LongNumber)):
        raise _refuse(field, value, f"must be {wanted}", fix)
    if isinstance(value, float):
        number = value
    elif isinstance(value, int):
        if digit_count(value) > max_digits:
            raise _refuse(field, value, f"has {digit_count(value)} digits; it must be {wanted}", fix)
        number = float(value)       # at most max_digits digits: no OverflowError below ~308
    else:
        text = value.text if isinstance(value, LongNumber) else value.strip()
        if len(text) > max_digits + _FLOAT_TEXT_SLACK:     # before any pattern or float() reads it
            digits = _digits_of_text(text) if _INT_TEXT.fullmatch(text) else 0     # linear: one way to match
            what = f"has {digits} digits" if digits > max_digits else f"is {len(text)} characters long"
            raise _refuse(field, value, f"{what}; it must be {wanted}", fix)
        if _NOT_FINITE_TEXT.fullmatch(text) or not _FLOAT_TEXT.fullmatch(text):
            raise _refuse(field, value, f"must be {wanted}", fix)
        digits = _digits_of_text(text)
        if digits > max_digits:
            raise _refuse(field, value, f"has {digits} digits; it must be {wanted}", fix)
        number = float(text)
    if not math.isfinite(number):
        raise _refuse(field, value, f"must be {wanted}", fix)
    if ((minimum is not None and number < minimum) or (maximum is not None and number > maximum)
            or (greater_than is not None and number <= greater_than)):
        raise _refuse(field, value, f"is out of range: it must be {wanted}", fix)
    return number


# ----------------------------------------------------------------------------- pydantic

def IntField(minimum: int | None = None, maximum: int | None = None, *, field: str | None = None,
             max_digits: int = DEFAULT_MAX_DIGITS) -> Any:
    """`Annotated[int, IntField(0, 100)]` in a pydantic model (or a FastAPI parameter): the value
    goes through read_int, its refusal a validation error naming the field (`field`, else the
    model's name for it: FastAPI does not pass a query parameter's name)."""
    from pydantic import BeforeValidator, ValidationInfo

    def check(value: object, info: ValidationInfo) -> int:
        return read_int(value, field=field or info.field_name, minimum=minimum, maximum=maximum,
                        max_digits=max_digits)
    return BeforeValidator(check)


def FloatField(minimum: float | None = None, maximum: float | None = None, *, greater_than: float | None = None,
               field: str | None = None, max_digits: int = DEFAULT_MAX_DIGITS) -> Any:
    """`Annotated[float, FloatField(0.0)]`: as IntField, through read_float."""
    from pydantic import BeforeValidator, ValidationInfo

    def check(value: object, info: ValidationInfo) -> float:
        return read_float(value, field=field or info.field_name, minimum=minimum, maximum=maximum,
                          greater_than=greater_than, max_digits=max_digits)
    return BeforeValidator(check)


__all__ = ["DEFAULT_MAX_DIGITS", "FloatField", "IntField", "LongNumber", "PYTHON_INT_DIGITS", "json_int",
           "range_words", "read_float", "read_int", "whole_number"]
