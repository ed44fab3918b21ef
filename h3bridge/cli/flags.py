"""Number flags for argparse, over safeio.numbers: argparse prints "argument --retries: <why>; fix:
<what>" and exits 2, with the bounded digits, finiteness and ranges every other caller gets."""
from __future__ import annotations

import argparse
from typing import Callable

from ..errors import RequestError
from ..safeio.numbers import DEFAULT_MAX_DIGITS, range_words, read_float, read_int


def int_flag(minimum: int | None = None, maximum: int | None = None, *,
             max_digits: int = DEFAULT_MAX_DIGITS) -> Callable[[str], int]:
    """An argparse `type=` for a whole-number flag: argparse prints "argument --retries: <why>;
    fix: <what>" and exits 2."""
    def whole_number_flag(text: str) -> int:
        try:
            return read_int(text, field=None, minimum=minimum, maximum=maximum, max_digits=max_digits,
                            hint=_flag_fix("a whole number", minimum, maximum))
        except RequestError as error:
            raise argparse.ArgumentTypeError(f"{error.message}; fix: {error.hint}") from None
    whole_number_flag.__name__ = "whole number"
    whole_number_flag.reads_number = True      # type: ignore[attr-defined]  (the conformance walk's marker)
    return whole_number_flag


def float_flag(minimum: float | None = None, maximum: float | None = None, *, greater_than: float | None = None,
               max_digits: int = DEFAULT_MAX_DIGITS) -> Callable[[str], float]:
    """An argparse `type=` for a number flag (finite; NaN and inf refused), as int_flag."""
    def number_flag(text: str) -> float:
        try:
            return read_float(text, field=None, minimum=minimum, maximum=maximum, greater_than=greater_than,
                              max_digits=max_digits, hint=_flag_fix("a finite number", minimum, maximum, greater_than))
        except RequestError as error:
            raise argparse.ArgumentTypeError(f"{error.message}; fix: {error.hint}") from None
    number_flag.__name__ = "number"
    number_flag.reads_number = True      # type: ignore[attr-defined]
    return number_flag


def int_list_flag(minimum: int | None = None, maximum: int | None = None, *, max_items: int,
                  max_digits: int = DEFAULT_MAX_DIGITS) -> Callable[[str], tuple[int, ...]]:
    """An argparse `type=` for one whole number or a comma-separated list of them (`--seed 3,9,12`):
    each read as int_flag reads one, at most `max_items` of them."""
    def whole_numbers_flag(text: str) -> tuple[int, ...]:
        parts = text.split(",")
        fix = _flag_fix("a whole number", minimum, maximum) + f", or up to {max_items} of them separated by commas"
        if len(parts) > max_items:
            raise argparse.ArgumentTypeError(f"{len(parts)} numbers; at most {max_items} are taken; fix: give at "
                                             f"most {max_items}, separated by commas (e.g. 3,9,12)")
        try:
            return tuple(read_int(part, field=None, minimum=minimum, maximum=maximum, max_digits=max_digits, hint=fix)
                         for part in parts)
        except RequestError as error:
            raise argparse.ArgumentTypeError(f"{error.message}; fix: {error.hint}") from None
    whole_numbers_flag.__name__ = "whole number or list"
    whole_numbers_flag.reads_number = True      # type: ignore[attr-defined]  (the conformance walk's marker)
    return whole_numbers_flag


def _flag_fix(what: str, minimum: float | None, maximum: float | None, greater_than: float | None = None) -> str:
    ranged = range_words(minimum, maximum, greater_than)
    return f"give {what}" + (f" {ranged}" if ranged else "") + ", written in digits"


__all__ = ["float_flag", "int_flag", "int_list_flag"]
