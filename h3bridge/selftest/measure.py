"""What a selftest render measures while it runs: the engine's memory (a sampling thread over the
engine's process tree) and its progress (phases, denoise steps, previews), each with its time.

Memory is the resident size summed over every process this one started (the engine, its FFmpeg,
the library engine's worker): what the machine had to hold for the render. On macOS the system's
own figure, the physical footprint (what Activity Monitor calls Memory; it counts Metal buffers
that the resident size can miss), is read too through libproc's `proc_pid_rusage`. That path is
written for macOS and has not run here (the project is tested on Linux); where it is missing
the footprint is None and the report says so.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

from ..progress import DENOISE_LOOP_PHASES, PreviewFrame, ProgressEvent

SAMPLE_SECONDS = 0.05      # the engine's phases last seconds on a Mac; peaks between samples are missed


def engine_processes() -> list[psutil.Process]:
    """The processes this one started and that still run (zombies, already gone, excluded)."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    alive = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.Error:
            pass
    return alive


class _RusageInfoV2(ctypes.Structure):
    """libproc.h `struct rusage_info_v2`, up to ri_phys_footprint (the fields after it are not read)."""

    _fields_ = [("ri_uuid", ctypes.c_uint8 * 16), ("ri_user_time", ctypes.c_uint64),
                ("ri_system_time", ctypes.c_uint64), ("ri_pkg_idle_wkups", ctypes.c_uint64),
                ("ri_interrupt_wkups", ctypes.c_uint64), ("ri_pageins", ctypes.c_uint64),
                ("ri_wired_size", ctypes.c_uint64), ("ri_resident_size", ctypes.c_uint64),
                ("ri_phys_footprint", ctypes.c_uint64), ("ri_proc_start_abstime", ctypes.c_uint64),
                ("ri_proc_exit_abstime", ctypes.c_uint64), ("ri_child_user_time", ctypes.c_uint64),
                ("ri_child_system_time", ctypes.c_uint64), ("ri_child_pkg_idle_wkups", ctypes.c_uint64),
                ("ri_child_interrupt_wkups", ctypes.c_uint64), ("ri_child_pageins", ctypes.c_uint64),
                ("ri_child_elapsed_abstime", ctypes.c_uint64), ("ri_diskio_bytesread", ctypes.c_uint64),
                ("ri_diskio_byteswritten", ctypes.c_uint64)]


RUSAGE_INFO_V2 = 2


class PhysFootprint:
    """macOS's physical footprint of a process (libproc `proc_pid_rusage`); `available` False
    elsewhere. Untested on a Mac by this project's suite: the selftest report says so."""

    def __init__(self) -> None:
        self._call = None
        if sys.platform == "darwin":
            try:
                library = ctypes.CDLL(ctypes.util.find_library("proc") or "/usr/lib/libproc.dylib")
                self._call = library.proc_pid_rusage
                self._call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_RusageInfoV2)]
                self._call.restype = ctypes.c_int
            except (OSError, AttributeError):
                self._call = None

    @property
    def available(self) -> bool:
        return self._call is not None

    def of(self, pid: int) -> int | None:
        if self._call is None:
            return None
        info = _RusageInfoV2()
        if self._call(pid, RUSAGE_INFO_V2, ctypes.byref(info)) != 0:
            return None
        return int(info.ri_phys_footprint)


class MemorySampler:
    """A thread that samples the engine process tree until stopped; `peak_rss` (bytes) and, on
    macOS, `peak_footprint`. Use as a context manager around one render."""

    def __init__(self, interval: float = SAMPLE_SECONDS) -> None:
        self.interval = interval
        self.peak_rss = 0
        self.peak_footprint: int | None = None
        self.samples = 0
        self._footprint = PhysFootprint()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="h3bridge-selftest-memory", daemon=True)

    @property
    def footprint_available(self) -> bool:
        return self._footprint.available

    def _sample(self) -> None:
        rss = 0
        footprint: int | None = 0 if self._footprint.available else None
        for process in engine_processes():
            try:
                rss += process.memory_info().rss
            except psutil.Error:
                continue
            if footprint is not None:
                value = self._footprint.of(process.pid)
                footprint += value or 0
        self.samples += 1
        self.peak_rss = max(self.peak_rss, rss)
        if footprint is not None:
            self.peak_footprint = max(self.peak_footprint or 0, footprint)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int:
        """The figure compared with the plan: the footprint where the system gives one, else the resident size."""
        return self.peak_footprint if self.peak_footprint else self.peak_rss


@dataclass
class ProgressLog:
    """Every progress event and preview of one render, with when it came (monotonic seconds)."""

    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, ProgressEvent]] = field(default_factory=list)
    previews: dict[int, int] = field(default_factory=dict)     # denoise step -> previews received

    def on_progress(self, event: ProgressEvent) -> None:
        self.events.append((time.monotonic(), event))

    def on_preview(self, frame: PreviewFrame) -> None:
        self.previews[frame.step] = self.previews.get(frame.step, 0) + 1

    def phases_seen(self) -> list[str]:
        return list(dict.fromkeys(event.phase for _, event in self.events))

    def loop_steps(self) -> int:
        """The denoise steps the engine reported done."""
        return max((event.done for _, event in self.events if event.phase in DENOISE_LOOP_PHASES), default=0)


__all__ = ["MemorySampler", "PhysFootprint", "ProgressLog", "engine_processes", "SAMPLE_SECONDS"]
