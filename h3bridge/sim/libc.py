"""macOS libc texts the real h3 prints and Linux's libc words differently.

`strerror`: h3 formats OS errors with strerror(3), and on macOS those texts come from Apple
Libc gen/errlst.c (checked against apple-oss-distributions/Libc-1725.0.11); glibc's differ
for the errors below ("Disc quota exceeded" vs "Disk quota exceeded", ...). The simulator
gets Linux errno values from Linux system calls, so the table is keyed by errno name.
Unknown numbers read "Unknown error: N" and 0 reads "Undefined error: 0"
(string/FreeBSD/strerror.c).

`strtod` / `strtof`: C's number scanners as h3 uses them (whole-token grammar: decimal,
hexadecimal, inf/infinity, nan(...)), with macOS's ERANGE rules.
"""
from __future__ import annotations

import errno
import io
import math
import os
import re
import sys
from fractions import Fraction

import numpy as np

_APPLE_TEXTS = {
    "ENXIO": "Device not configured",
    "EBUSY": "Resource busy",
    "EXDEV": "Cross-device link",
    "ENODEV": "Operation not supported by device",
    "ERANGE": "Result too large",
    "EADDRNOTAVAIL": "Can't assign requested address",
    "EISCONN": "Socket is already connected",
    "ENOTCONN": "Socket is not connected",
    "ESHUTDOWN": "Can't send after socket shutdown",
    "ETOOMANYREFS": "Too many references: can't splice",
    "ETIMEDOUT": "Operation timed out",
    "EDQUOT": "Disc quota exceeded",
    "ESTALE": "Stale NFS file handle",
    "EREMOTE": "Too many levels of remote in path",
    "EOVERFLOW": "Value too large to be stored in data type",
    "EILSEQ": "Illegal byte sequence",
    "EMULTIHOP": "EMULTIHOP (Reserved)",
    "ENODATA": "No message available on STREAM",
    "ENOLINK": "ENOLINK (Reserved)",
    "ENOSR": "No STREAM resources",
    "ENOSTR": "Not a STREAM",
    "ETIME": "STREAM ioctl timeout",
    "EOPNOTSUPP": "Operation not supported on socket",
    "EOWNERDEAD": "Previous owner died",
}
_BY_CODE = {getattr(errno, name): text for name, text in _APPLE_TEXTS.items() if hasattr(errno, name)}


def strerror(code: int) -> str:
    """strerror(3) as macOS words it, for a (Linux) errno value."""
    if code == 0:
        return "Undefined error: 0"
    if code in _BY_CODE:
        return _BY_CODE[code]
    if code not in errno.errorcode:
        return f"Unknown error: {code}"
    return os.strerror(code)


_DECIMAL_FLOAT = re.compile(r"[ \t\n\v\f\r]*[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)")
_HEX_FLOAT = re.compile(r"[ \t\n\v\f\r]*[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?")
_SPECIAL_FLOAT = re.compile(r"[ \t\n\v\f\r]*[+-]?(?:inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?)", re.IGNORECASE)
_MIN_NORMAL = sys.float_info.min
_C_SPACE = " \t\n\v\f\r"


def _hex_is_exact(token: str, value: float) -> bool:
    """Whether a hex float token is exactly representable (its digits survive the rounding)."""
    body = token.lstrip("+-")[2:]
    mantissa, _, exponent = body.lower().partition("p")
    whole, _, fraction = mantissa.partition(".")
    exact = Fraction(int(whole + fraction or "0", 16)) * Fraction(2) ** (int(exponent or "0") - 4 * len(fraction))
    return Fraction(abs(value)) == exact


def strtod(text: str) -> tuple[float | None, str, bool]:
    """C strtod: decimal, hexadecimal, inf/infinity and nan forms; (value or None, rest, ERANGE).

    ERANGE as macOS libc sets it (Apple Libc tests/strtod.c strtod_verify): on overflow, and
    when a non-zero input comes out subnormal or zero, except an exact subnormal hex float
    (rdar://108539918). Explicit zeros, inf and nan never set it."""
    for pattern in (_HEX_FLOAT, _DECIMAL_FLOAT, _SPECIAL_FLOAT):
        match = pattern.match(text)
        if match:
            token = match[0].strip(_C_SPACE)
            rest = text[match.end():]
            if pattern is _SPECIAL_FLOAT:
                return float(token.split("(")[0]), rest, False
            if pattern is _HEX_FLOAT:
                sign = -1.0 if token.startswith("-") else 1.0
                try:
                    value = sign * float.fromhex(token.lstrip("+-"))
                except OverflowError:
                    return sign * math.inf, rest, True
                nonzero = any(c not in "0." for c in token.lstrip("+-")[2:].lower().partition("p")[0])
                tiny = nonzero and abs(value) < _MIN_NORMAL
                return value, rest, tiny and not _hex_is_exact(token, value)
            value = float(token)       # Python returns inf on overflow instead of raising
            nonzero = any(c in "123456789" for c in token.lower().partition("e")[0])
            return value, rest, math.isinf(value) or (nonzero and abs(value) < _MIN_NORMAL)
    return None, text, False


_FLT_MIN = float(np.finfo(np.float32).tiny)


def strtof(text: str) -> tuple[float | None, str, bool]:
    """C strtof: like `strtod`, then rounded to float32 (through double: a decimal exactly
    halfway between two floats could round differently, which real config values never are).
    ERANGE when a finite input overflows float or a non-zero one comes out subnormal or zero."""
    value, rest, erange = strtod(text)
    if value is None or math.isnan(value):
        return value, rest, False
    with np.errstate(over="ignore"):
        single = float(np.float32(value)) if abs(value) < 3.5e38 else math.copysign(math.inf, value)
    if math.isinf(single) and not math.isinf(value):
        erange = True
    elif value != 0.0 and abs(single) < _FLT_MIN:
        erange = True
    return single, rest, erange


def c_stdio_stdout() -> object | None:
    """Give fd 1 C stdio's buffering: line-buffered on a TTY, fully buffered otherwise.

    Python's own choice depends on PYTHONUNBUFFERED/-u (then every write goes straight out),
    which would hide exactly the behaviour a driver of the real h3 has to cope with. Returns
    the previous sys.stdout to restore, or None when stdout is not fd 1 (in-process capture).
    """
    try:
        if sys.stdout.fileno() != 1:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    previous = sys.stdout
    previous.flush()
    buffered = io.BufferedWriter(io.FileIO(1, "w", closefd=False), buffer_size=io.DEFAULT_BUFFER_SIZE)
    sys.stdout = io.TextIOWrapper(buffered, encoding="utf-8", errors="surrogateescape",
                                  line_buffering=os.isatty(1), write_through=False)
    return previous
