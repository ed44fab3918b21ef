"""Tar archives built by the test (hostile members included) and a Python without tar extraction
filters (PEP 706), for the safe unpacker (h3bridge/safeio/archives.py) and its users."""
from __future__ import annotations

import inspect
import io
import tarfile
from pathlib import Path

import pytest


def member(name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes = b"", mode: int = 0o644,
           link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = link
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 5           # what /dev/zero is: never made outside tmp_path
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


@pytest.fixture
def no_extraction_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """tarfile as on a Python before extraction filters (3.10.11, 3.11.3): no `data_filter`, and
    `extractall`/`extract` refuse a `filter` argument with TypeError; what they extract is
    extracted fully trusted, as those Pythons did."""
    for name in ("data_filter", "tar_filter", "fully_trusted_filter"):
        monkeypatch.delattr(tarfile, name, raising=False)
    trusted = {"filter": "fully_trusted"} if "filter" in inspect.signature(tarfile.TarFile.extractall).parameters \
        else {}
    extractall, extract = tarfile.TarFile.extractall, tarfile.TarFile.extract

    def old_extractall(self, path=".", members=None, *, numeric_owner=False, **kwargs):
        if kwargs:
            raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return extractall(self, path, members, numeric_owner=numeric_owner, **trusted)

    def old_extract(self, member, path="", set_attrs=True, *, numeric_owner=False, **kwargs):
        if kwargs:
            raise TypeError(f"extract() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return extract(self, member, path, set_attrs, numeric_owner=numeric_owner, **trusted)

    monkeypatch.setattr(tarfile.TarFile, "extractall", old_extractall)
    monkeypatch.setattr(tarfile.TarFile, "extract", old_extract)
