"""What the job history says about one job: the device it ran on, its shape, its request as JSON.

A job's *shape* is what its phase costs depend on (upstream_costs.JobShape's inputs, plus
anchors and references, which add encoder phases and condition rows): canvas, render canvas,
frame count, steps, layers, reuse, core reuse and the other slower/faster paths. The prompt and
the seed are not part of it. Shapes are written in the CLI's words, so `h3bridge stats` reads
like the command line that made them.
"""
from __future__ import annotations

import functools
import platform
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..request import GenerationRequest, request_fields


@dataclass(frozen=True)
class Device:
    """Where a job ran: a name (the chip, e.g. "Apple M4 Pro"; elsewhere the OS and CPU
    architecture) and its physical (unified) memory in bytes (None when unknown)."""

    name: str
    memory_bytes: int | None = None

    def describe(self) -> str:
        if self.memory_bytes is None:
            return self.name
        return f"{self.name}, {self.memory_bytes / 2**30:.0f} GiB"


@functools.lru_cache(maxsize=1)
def local_device() -> Device:
    """This machine, as the memory plan sees it (model/memory.py MachineFacts.detect); cached:
    on a Mac it asks sysctl once per process."""
    from ..model.memory import MachineFacts   # memory imports much; only needed here
    facts = MachineFacts.detect()
    name = facts.chip or f"{platform.system()} {platform.machine()}".strip()
    return Device(name=name or "unknown machine", memory_bytes=facts.total_memory)


def shape_key(request: GenerationRequest) -> str:
    """The request's shape in CLI words: `864x480 56f 20 steps`, then whatever differs from
    upstream's defaults and changes the cost (`render 432x240`, `layers 40`, `reuse 2`, ...)."""
    parts = [f"{request.width}x{request.height}", f"{request.frame_count}f", f"{request.steps} steps"]
    render = (request.render_width or request.width, request.render_height or request.height)
    if render != (request.width, request.height):
        parts.append(f"render {render[0]}x{render[1]}")
    defaults = GenerationRequest(prompt="")
    for name, words in (("layers", "layers"), ("reuse", "reuse"), ("core_reuse", "core-reuse")):
        value = getattr(request, name)
        if value != getattr(defaults, name):
            parts.append(f"{words} {value}")
    for name, words in (("token_reduction", "token-reduction"), ("ssd_streaming", "ssd-streaming"),
                        ("int8_row_fc2", "int8-row-fc2"), ("reference_rope", "reference-rope")):
        if getattr(request, name):
            parts.append(words)
    if request.slower_paths:
        parts.append("slower " + ",".join(sorted(path.value for path in request.slower_paths)))
    if request.first_frame is not None:
        parts.append("first-frame")
    if request.last_frame is not None:
        parts.append("last-frame")
    if request.references:
        counts = Counter(reference.kind.value for reference in request.references)
        parts.append("refs " + "+".join(f"{kind}{'' if n == 1 else f'x{n}'}" for kind, n in sorted(counts.items())))
        if request.reference_image_size != defaults.reference_image_size:
            parts.append(f"ref-image-size {request.reference_image_size.value}")
    return " ".join(parts)


def request_record(request: GenerationRequest) -> dict[str, Any]:
    """The request as JSON-ready values (request.request_fields: every field kept), plus the frame
    count the engine produces."""
    return {**request_fields(request), "frame_count": request.frame_count}


__all__ = ["Device", "local_device", "shape_key", "request_record"]
