r"""`getopt_long` as the real `h3` gets it from macOS libc (h3 runs only on Apple Silicon).

main.c parses its command line with `getopt_long(argc, argv, "d:p:o:h", options, NULL)`
(main.c:324). Python's `getopt.gnu_getopt` differs in the details that users and callers
can observe (diagnostic texts, `--opt=value` on a no-argument option, ambiguity, and above
all `optind`, which main.c reads directly to take the AUDIO operand of
`--ref-video-audio VIDEO AUDIO`, main.c:434-445). So this module is a small state machine
over a mutable argv list.

Diagnostics are Apple's: Libc's stdlib/FreeBSD/getopt_long.c (OpenBSD 1.26 / NetBSD 1.15,
built with GNU_COMPATIBLE; checked against apple-oss-distributions/Libc-1725.0.11), printed
with warnx (gen/FreeBSD/err.c): "<getprogname()>: <message>\n", where getprogname() is the
last component of argv[0] and control characters in the message are made visible
(`_e_visprintf`: \a \b \v \f \r, other C0 bytes as \ooo). The texts:

    unrecognized option `--NAME[=VALUE]'          (the whole argument as typed)
    option `--NAME' is ambiguous                   (NAME as typed, up to '='; no list)
    option `--NAME' doesn't allow an argument      (NAME as typed, up to '=')
    option `--NAME' requires an argument           (NAME as typed: an abbreviation stays one)
    invalid option -- C                            ("illegal option -- C" under POSIXLY_CORRECT)
    option requires an argument -- C

Short options are scanned byte by byte, as C does (a UTF-8 letter is several "options").
glibc words all of these differently (quotes, "possibilities:" lists, full option names);
those texts are not produced.

The permutation of non-options follows glibc's algorithm (posix/getopt.c `exchange`);
Apple's `permute_args` rotates the same blocks at different moments, but both only ever
move elements before `optind`, so every value main.c can observe (each option's optarg,
argv[optind] when --ref-video-audio takes AUDIO, the final operand order) is the same
(checked differentially against a transcription of Apple's algorithm on 200k random argvs).

Only what main.c uses is supported: no `optional_argument`, no `flag` pointers, no
`getopt_long_only`, no `-W`. `POSIXLY_CORRECT` in the environment selects
REQUIRE_ORDER, as in both libcs.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TextIO


# err.c `escape[]`: BEL BS VT FF CR as letters, the other C0 controls (not TAB, NL) as \ooo.
_VISIBLE = {code: f"\\{code:03o}" for code in (*range(1, 7), *range(14, 32))}
_VISIBLE.update({7: "\\a", 8: "\\b", 11: "\\v", 12: "\\f", 13: "\\r"})


def _byte_text(data: bytes) -> str:
    """bytes of argv back to the surrogate-escaped str Python uses for argv."""
    return data.decode("utf-8", "surrogateescape")


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
        """warnx (Apple Libc gen/FreeBSD/err.c vwarnx + _e_visprintf)."""
        program = self.argv[0].rsplit("/", 1)[-1]   # getprogname(): last component of argv[0]
        self.stderr.write(f"{program}: {text.translate(_VISIBLE)}\n")

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
                    # getopt_long.c parse_long_options: `ambig`, NAME as typed up to '='.
                    self._error(f"option `--{name}' is ambiguous")
                    self._nextchar = ""
                    self.optind += 1
                    self.optopt = 0
                    return "?"
                found = first
        if found is None:
            self._error(f"unrecognized option `--{text}'")   # `illoptstring`: whole argument
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
                self._error(f"option `--{name}' doesn't allow an argument")   # `noarg`, as typed
                self.optopt = found.val
                return "?"
        elif found.has_arg:
            if self.optind < len(self.argv):
                self.optarg = self.argv[self.optind]
                self.optind += 1
            else:
                self._error(f"option `--{text}' requires an argument")   # `recargstring`, as typed
                self.optopt = found.val
                return "?"
        return found.val

    def _short_option(self) -> int | str:
        # C scans the cluster byte by byte (getopt_long.c getopt_internal: `*place++`).
        data = self._nextchar.encode("utf-8", "surrogateescape")
        letter = _byte_text(data[:1])
        self._nextchar = _byte_text(data[1:])
        if not self._nextchar:
            self.optind += 1
        position = self.shortopts.find(letter)
        if position < 0 or letter == ":":
            # `gnuoptchar`, or P1003.2's `illoptchar` when POSIXLY_CORRECT is set.
            word = "illegal" if self._require_order else "invalid"
            self._error(f"{word} option -- {letter}")
            self.optopt = letter
            return "?"
        takes_argument = self.shortopts[position + 1:position + 2] == ":"
        if takes_argument:
            if self._nextchar:
                self.optarg = self._nextchar
                self.optind += 1
            elif self.optind == len(self.argv):
                self._error(f"option requires an argument -- {letter}")   # `recargchar`
                self.optopt = letter
                self._nextchar = ""
                return "?"
            else:
                self.optarg = self.argv[self.optind]
                self.optind += 1
            self._nextchar = ""
        return letter
