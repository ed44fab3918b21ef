"""The libh3 worker: a child process (its own process group, started by library.py) that loads
libh3 through `h3bridge.libh3`, keeps one warm `h3_ctx`, and runs jobs the host sends.

    python -m h3bridge.engines.library_worker --library LIB --model-dir DIR      (cwd: the h3.c checkout)

Why a child: a Metal fault or a segfault in C ends this process, not the host (ComfyUI). Its
working directory is the h3.c checkout, because upstream compiles `h3_shaders.metal` from there.

ctypes hygiene (the C side may call back at any point of `h3_generate`):
* every byte string C sees (prompt, paths, the `h3_reference` array) and both callbacks are
  held in locals of `run_job` until `h3_generate` has returned;
* a callback never lets a Python exception unwind into C: it records it, returns 1 (upstream
  cancels on a non-zero return), and the exception is dealt with after `h3_generate` returns;
* `h3_result_free` follows every result, `h3_free` the context when the host closes stdin.

Final frames go straight into the host's memory-mapped frames file (one memmove per frame, or
per row when `stride` is wider than the row); previews go to the host as raw bytes.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import queue
import sys
import threading
from typing import IO, Any

from .library_wire import encode_text, receive, send


class HostGone(Exception):
    """The host closed our control pipe (it exited or stopped listening)."""


class Worker:
    def __init__(self, control: IO[bytes], library: str, model_dir: str) -> None:
        self.control = control
        self.library_path = library
        self.model_dir = model_dir
        self.lib: Any = None
        self.ctx: Any = None
        self.jobs: "queue.Queue[dict[str, Any] | None]" = queue.Queue()
        self.cancel = threading.Event()
        self.current_job: int | None = None
        # The host may cancel a job before run_job took it from the queue: remembered by number.
        self.cancelled_jobs: set[int] = set()
        self._cancel_lock = threading.Lock()
        self._send_lock = threading.Lock()

    # ------------------------------------------------------------------ messages

    def send(self, message: dict[str, Any], payload: bytes | None = None) -> None:
        try:
            with self._send_lock:
                send(self.control, message, payload)
        except (BrokenPipeError, ValueError, OSError) as error:
            raise HostGone(str(error)) from None

    def read_host(self, stdin: IO[bytes]) -> None:
        """stdin reader thread: jobs go to the queue, a cancel for the running job sets the flag
        the callbacks return; EOF (the host is gone or done) cancels and ends the loop."""
        while True:
            try:
                item = receive(stdin)
            except (OSError, ValueError):
                item = None
            if item is None:
                self.cancel.set()
                self.jobs.put(None)
                return
            message, _ = item
            if message.get("op") == "generate":
                self.jobs.put(message)
            elif message.get("op") == "cancel":
                with self._cancel_lock:
                    if message.get("job") == self.current_job:
                        self.cancel.set()
                    else:
                        self.cancelled_jobs.add(message.get("job"))

    # ------------------------------------------------------------------ load

    def load(self) -> bool:
        from .. import libh3
        from ..errors import LibraryLoadError
        try:
            self.lib = libh3.load_library(self.library_path)
        except LibraryLoadError as error:     # dlopen's refusal, in one sentence with the fix
            self.send({"ev": "load_failed", "stage": "library", "message": error.message, "hint": error.hint})
            return False
        self.ctx = self.lib.h3_load_dir(encode_text(self.model_dir))
        if not self.ctx:
            message = self.lib.h3_last_error(None)
            self.send({"ev": "load_failed", "stage": "model",
                       "message": message.decode("utf-8", "replace") if message else "h3_load_dir failed"})
            return False
        self.lib.h3_cache_set_enabled(self.ctx, 1)
        self.send({"ev": "ready", "pid": os.getpid(), "device": self.device(), "model": self.model()})
        return True

    def device(self) -> dict[str, Any]:
        pointer = self.lib.h3_device(self.ctx)
        if not pointer:
            return {}
        info = pointer.contents
        return {"name": bytes(info.name).split(b"\0")[0].decode("utf-8", "replace"),
                "architecture": bytes(info.architecture).split(b"\0")[0].decode("utf-8", "replace"),
                "physical_memory": int(info.physical_memory),
                "recommended_working_set": int(info.recommended_working_set),
                "max_buffer_length": int(info.max_buffer_length), "apple_gpu_family": int(info.apple_gpu_family),
                "metal4": int(info.metal4), "unified_memory": int(info.unified_memory)}

    def model(self) -> dict[str, Any]:
        pointer = self.lib.h3_model(self.ctx)
        if not pointer:
            return {}
        info = pointer.contents
        return {name: {"bytes": int(part.bytes), "tensor_bytes": int(part.tensor_bytes), "files": int(part.files),
                       "tensors": int(part.tensors)}
                for name in ("text_encoder", "fl2va_transformer", "ref2va_transformer", "video_vae", "audio_vae")
                for part in (getattr(info, name),)}

    def cache_info(self) -> dict[str, int]:
        from .. import libh3
        info = libh3.h3_cache_info()
        self.lib.h3_cache_get_info(self.ctx, ctypes.byref(info))
        return {"embedding_entries": int(info.embedding_entries), "embedding_bytes": int(info.embedding_bytes),
                "prepared_dit": int(info.prepared_dit), "video_decoder": int(info.video_decoder)}

    # ------------------------------------------------------------------ jobs

    def run(self) -> int:
        while True:
            job = self.jobs.get()
            if job is None:
                break
            try:
                self.run_job(job)
            except HostGone:
                break
        self.lib.h3_free(self.ctx)
        self.ctx = None
        return 0

    def run_job(self, job: dict[str, Any]) -> None:
        from .. import libh3
        job_id = job["job"]
        with self._cancel_lock:
            self.cancel.clear()
            self.current_job = job_id
            if job_id in self.cancelled_jobs:
                self.cancelled_jobs.discard(job_id)
                self.cancel.set()      # upstream checks before its first phase: the job ends at once
        failures: list[BaseException] = []     # exceptions raised inside a callback, for after h3_generate
        keep: list[object] = []                 # everything C may read until h3_generate returns

        def c_string(text: str | None) -> bytes | None:
            if text is None:
                return None
            data = encode_text(text)
            keep.append(data)
            return data

        params = libh3.default_params()
        for name, value in job["fields"].items():
            if name == "reference_image_size":
                value = getattr(libh3, value)      # an h3.h enum, by name
            elif isinstance(value, str):
                value = c_string(value)
            setattr(params, name, value)
        entries = job["references"]
        if entries:
            array = (libh3.h3_reference * len(entries))()
            for slot, entry in zip(array, entries):
                slot.kind = getattr(libh3, entry["kind"])
                slot.path = c_string(entry["path"])
                slot.audio_path = c_string(entry["audio_path"])
                slot.include_embedded_audio = entry["include_embedded_audio"]
            keep.append(array)
            params.references = array
            params.reference_count = len(entries)
        frames = FrameSink(job["frames_path"], tuple(job["frame_shape"])) if job["frames_path"] else None
        preview = bool(job["preview"])

        def on_progress(phase: bytes | None, completed: int, total: int, opaque: object) -> int:
            try:
                self.send({"ev": "progress", "job": job_id, "phase": (phase or b"").decode("utf-8", "replace"),
                           "done": int(completed), "total": int(total)})
                return 1 if self.cancel.is_set() else 0
            except BaseException as error:     # never unwind through C
                failures.append(error)
                self.cancel.set()
                return 1

        def on_frame(pointer: Any, opaque: object) -> int:
            try:
                frame = pointer.contents
                if frame.denoise_step >= 0:
                    if preview:
                        image = frame_bytes(frame)
                        self.send({"ev": "preview", "job": job_id, "step": int(frame.denoise_step),
                                   "total_steps": int(frame.denoise_steps), "frame_index": int(frame.frame_index),
                                   "width": int(frame.width), "height": int(frame.height)}, image)
                elif frames is not None:
                    frames.write(frame)
                return 1 if self.cancel.is_set() else 0
            except BaseException as error:     # never unwind through C
                failures.append(error)
                self.cancel.set()
                return 1

        progress_callback = libh3.h3_progress_callback(on_progress)
        keep.append(progress_callback)
        params.on_progress = progress_callback
        if frames is not None or preview:
            frame_callback = libh3.h3_frame_callback(on_frame)
            keep.append(frame_callback)
            params.on_frame = frame_callback
        prompt = c_string(job["prompt"])
        try:
            result = self.lib.h3_generate(self.ctx, prompt, ctypes.byref(params))
        finally:
            written = frames.close() if frames is not None else 0
        keep.clear()     # C is done with them only now
        host_gone = any(isinstance(error, HostGone) for error in failures)
        if host_gone:
            if result:
                self.lib.h3_result_free(result)
            raise HostGone("the host went away during the job")
        if result and failures:
            # A callback failed (it returned 1) but the run completed anyway: the job is not whole.
            self.lib.h3_result_free(result)
            result = None
        if result:
            info = result.contents
            summary = {"width": int(info.width), "height": int(info.height), "frames": int(info.frames),
                       "fps": int(info.fps), "sample_rate": int(info.sample_rate), "seed": int(info.seed)}
            self.lib.h3_result_free(result)
            self.send({"ev": "done", "job": job_id, "result": summary, "frames_written": written,
                       "cache": self.cache_info()})
            return
        message = self.lib.h3_last_error(self.ctx)
        self.send({"ev": "failed", "job": job_id,
                   "message": message.decode("utf-8", "replace") if message else None,
                   "cancelled": self.cancel.is_set(), "frames_written": written,
                   "callback_error": "".join(f"{type(error).__name__}: {error}" for error in failures[:1]) or None})


def frame_bytes(frame: Any) -> bytes:
    """An `h3_frame`'s pixels as packed RGB24 rows (dropping any padding past width*3)."""
    row = int(frame.width) * 3
    stride = int(frame.stride)
    if stride == row:
        return ctypes.string_at(frame.rgb, row * int(frame.height))
    return b"".join(ctypes.string_at(ctypes.cast(frame.rgb, ctypes.c_void_p).value + y * stride, row)
                    for y in range(int(frame.height)))


class FrameSink:
    """The host's frames file, mapped here: `write` copies one final `h3_frame` into its slot."""

    def __init__(self, path: str, shape: tuple[int, int, int]) -> None:
        self.count, self.height, self.width = shape
        self.frame_bytes = self.height * self.width * 3
        with open(path, "r+b") as handle:
            self.map = mmap.mmap(handle.fileno(), self.count * self.frame_bytes)
        self._anchor = ctypes.c_char.from_buffer(self.map)
        self.base = ctypes.addressof(self._anchor)
        self.written: set[int] = set()

    def write(self, frame: Any) -> None:
        index = int(frame.frame_index)
        if (int(frame.width), int(frame.height)) != (self.width, self.height) or not 0 <= index < self.count:
            raise ValueError(f"libh3 delivered frame {index} at {frame.width}x{frame.height}; expected "
                             f"{self.count} frames at {self.width}x{self.height}")
        row = self.width * 3
        target = self.base + index * self.frame_bytes
        source = ctypes.cast(frame.rgb, ctypes.c_void_p).value
        if int(frame.stride) == row:
            ctypes.memmove(target, source, self.frame_bytes)
        else:
            for y in range(self.height):
                ctypes.memmove(target + y * row, source + y * int(frame.stride), row)
        self.written.add(index)

    def close(self) -> int:
        """Unmap (the host maps the file itself); how many distinct frames were written."""
        del self._anchor          # the buffer export must go before the map can close
        self.map.close()
        return len(self.written)


def main(argv: list[str] | None = None) -> int:
    # Started only by LibraryEngine (library.py worker_command), never by a user: its two
    # arguments are positional, and a wrong call is a bug in the host, said plainly.
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 2:
        sys.stderr.write("h3bridge library worker: started wrongly; LibraryEngine starts it as "
                         f"`python -m {__spec__.name if __spec__ else 'h3bridge.engines.library_worker'} LIBRARY MODEL_DIR`\n")
        return 2
    library, model_dir = arguments
    # Our messages go on a private copy of stdout; fd 1 becomes stderr, so whatever libh3 or
    # FFmpeg print on stdout lands in the engine log instead of corrupting the protocol.
    control = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker(control, library, model_dir)
    try:
        if not worker.load():
            return 3
    except HostGone:
        return 0
    threading.Thread(target=worker.read_host, args=(sys.stdin.buffer,), name="h3-worker-host", daemon=True).start()
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
