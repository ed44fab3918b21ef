"""macOS libc texts the real h3 prints and Linux's libc words differently.

`strerror`: h3 formats OS errors with strerror(3), and on macOS those texts come from Apple
Libc gen/errlst.c (checked against apple-oss-distributions/Libc-1725.0.11); glibc's differ
for the errors below ("Disc quota exceeded" vs "Disk quota exceeded", ...). The simulator
gets Linux errno values from Linux system calls, so the table is keyed by errno name.
Unknown numbers read "Unknown error: N" and 0 reads "Undefined error: 0"
(string/FreeBSD/strerror.c).
"""
from __future__ import annotations

import errno
import os

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
