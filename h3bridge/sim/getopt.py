"""GNU `getopt_long` semantics, as the real `h3` gets them from glibc/macOS libc.

main.c parses its command line with `getopt_long(argc, argv, "d:p:o:h", options, NULL)`
(main.c:324). Python's `getopt.gnu_getopt` differs in the details that users and callers
can observe (diagnostic texts, `--opt=value` on a no-argument option, ambiguity lists,
and above all `optind`, which main.c reads directly to take the AUDIO operand of
`--ref-video-audio VIDEO AUDIO`, main.c:434-445). So this module reimplements the glibc
algorithm (posix/getopt.c: `_getopt_internal_r`, `process_long_option`, `exchange`)
as a small state machine over a mutable argv list, with the same permutation of
non-options and the same stderr messages.

Only what main.c uses is supported: no `optional_argument`, no `flag` pointers, no
`getopt_long_only`, no `-W`. `POSIXLY_CORRECT` in the environment selects
REQUIRE_ORDER, as in glibc.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TextIO


@dataclass(frozen=True)
class LongOption:
    name: str
    has_arg: bool
    val: int | str   # the value getopt returns: a short-option letter or an enum code


@dataclass
class GetoptLong:
    """One scan over `argv` (mutated in place by permutation, as glibc does).

    Call `next()` until it returns None. After each option `optarg` holds its argument;
    `optind` may be advanced by the caller (main.c does `argv[optind++]`).
    """

    argv: list[str]
    shortopts: str
    longopts: tuple[LongOption, ...]
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    optind: int = 1
    optarg: str | None = None
    optopt: int | str = 0
    _nextchar: str = ""
    _first_nonopt: int = 1
    _last_nonopt: int = 1
    _require_order: bool = field(default_factory=lambda: "POSIXLY_CORRECT" in os.environ)

    def _error(self, text: str) -> None:
        self.stderr.write(f"{self.argv[0]}: {text}\n")

    def _is_nonoption(self, index: int) -> bool:
        arg = self.argv[index]
        return not arg.startswith("-") or arg == "-"

    def _exchange(self) -> None:
        """Move the skipped non-options [first_nonopt, last_nonopt) after the options
        [last_nonopt, optind) that followed them (glibc `exchange`)."""
        first, last, end = self._first_nonopt, self._last_nonopt, self.optind
        nonopts = self.argv[first:last]
        opts = self.argv[last:end]
        self.argv[first:end] = opts + nonopts
        self._first_nonopt += end - last
        self._last_nonopt = end

    def next(self) -> int | str | None:
        """Return the next option value, "?" on an error (after printing glibc's
        diagnostic), or None when options are exhausted."""
        self.optarg = None
        argc = len(self.argv)
        if not self._nextchar:
            if self._last_nonopt > self.optind:
                self._last_nonopt = self.optind
            if self._first_nonopt > self.optind:
                self._first_nonopt = self.optind
            if not self._require_order:
                if self._first_nonopt != self._last_nonopt and self._last_nonopt != self.optind:
                    self._exchange()
                elif self._last_nonopt != self.optind:
                    self._first_nonopt = self.optind
                while self.optind < argc and self._is_nonoption(self.optind):
                    self.optind += 1
                self._last_nonopt = self.optind
            if self.optind != argc and self.argv[self.optind] == "--":
                self.optind += 1
                if self._first_nonopt != self._last_nonopt and self._last_nonopt != self.optind:
                    self._exchange()
                elif self._first_nonopt == self._last_nonopt:
                    self._first_nonopt = self.optind
                self._last_nonopt = argc
                self.optind = argc
            if self.optind == argc:
                if self._first_nonopt != self._last_nonopt:
                    self.optind = self._first_nonopt
                return None
            if self._is_nonoption(self.optind):
                # Only reachable in REQUIRE_ORDER mode (POSIXLY_CORRECT).
                return None
            arg = self.argv[self.optind]
            if arg[1] == "-":
                self._nextchar = arg[2:]
                return self._long_option()
            self._nextchar = arg[1:]
        return self._short_option()

    def _long_option(self) -> int | str:
        text = self._nextchar
        name, has_value, value = text.partition("=")
        found: LongOption | None = None
        for option in self.longopts:
            if option.name == name:
                found = option
                break
        if found is None:
            candidates = [o for o in self.longopts if o.name.startswith(name)]
            if candidates:
                first = candidates[0]
                distinct = [o for o in candidates[1:]
                            if o.has_arg != first.has_arg or o.val != first.val]
                if distinct:
                    ambiguous = [o for o in candidates
                                 if o is first or o.has_arg != first.has_arg or o.val != first.val]
                    listing = "".join(f" '--{o.name}'" for o in ambiguous)
                    self._error(f"option '--{text}' is ambiguous; possibilities:{listing}")
                    self._nextchar = ""
                    self.optind += 1
                    self.optopt = 0
                    return "?"
                found = first
        if found is None:
            self._error(f"unrecognized option '--{text}'")
            self._nextchar = ""
            self.optind += 1
            self.optopt = 0
            return "?"
        self.optind += 1
        self._nextchar = ""
        if has_value:
            if found.has_arg:
                self.optarg = value
            else:
                self._error(f"option '--{found.name}' doesn't allow an argument")
                self.optopt = found.val
                return "?"
        elif found.has_arg:
            if self.optind < len(self.argv):
                self.optarg = self.argv[self.optind]
                self.optind += 1
            else:
                self._error(f"option '--{found.name}' requires an argument")
                self.optopt = found.val
                return "?"
        return found.val

    def _short_option(self) -> int | str:
        letter = self._nextchar[0]
        self._nextchar = self._nextchar[1:]
        if not self._nextchar:
            self.optind += 1
        position = self.shortopts.find(letter)
        if position < 0 or letter in ":;":
            self._error(f"invalid option -- '{letter}'")
            self.optopt = letter
            return "?"
        takes_argument = self.shortopts[position + 1:position + 2] == ":"
        if takes_argument:
            if self._nextchar:
                self.optarg = self._nextchar
                self.optind += 1
            elif self.optind == len(self.argv):
                self._error(f"option requires an argument -- '{letter}'")
                self.optopt = letter
                self._nextchar = ""
                return "?"
            else:
                self.optarg = self.argv[self.optind]
                self.optind += 1
            self._nextchar = ""
        return letter
