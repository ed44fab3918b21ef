"""The memory plan of one request: its phases, peak, budget, verdict and suggestion."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...fixes import Fix, Words, python_words
from ...request import GenerationRequest
from ..inventory import FL2VA, REF2VA, ModelInventory, format_bytes
from .machine import MachineFacts
from .sizes import ModelSizes
from .geometry import Geometry, geometry
from .phases import PhaseMemory, _build_phases
from .suggest import Suggestion, _suggest


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass
class MemoryPlan:
    request: GenerationRequest
    machine: MachineFacts
    preview: bool
    sizes: ModelSizes
    phases: tuple[PhaseMemory, ...]
    suggestion: Suggestion | None = None
    dit_path: str = "BF16"                 # "BF16", "int8", "int8 MLP", ..., "SSD streaming"
    notes: list[str] = field(default_factory=list)
    session: bool = False                  # planned for a warm session (h3's interactive mode)
    # What the model check found that does not stop this job but its user should see (e.g. an
    # incomplete Ref2VA/ a job without references does not read); filled by `preflight`.
    model_warnings: "list[str | Fix]" = field(default_factory=list)   # a Fix names settings (h3bridge.fixes)
    # The request's shape as upstream computes it (reference inputs probed): read once per plan.
    geometry: Geometry | None = field(default=None, repr=False, compare=False)

    @property
    def peak_phase(self) -> PhaseMemory:
        return max(self.phases, key=lambda phase: phase.total)

    @property
    def peak(self) -> int:
        return self.peak_phase.total

    @property
    def budget(self) -> int:
        return self.machine.budget

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    @property
    def needs_ssd_streaming(self) -> bool:
        """Does not fit as asked, and the suggested fix turns SSD streaming on."""
        return (not self.fits and not self.request.ssd_streaming and self.suggestion is not None
                and self.suggestion.request.ssd_streaming)

    def phase(self, name: str) -> PhaseMemory:
        return next(p for p in self.phases if p.name == name)

    def verdict(self, words: Words | None = python_words) -> str:
        """"fits: ..." or "does not fit: ...; fits with <changes> (peak ...)", ending with the
        suggestion's settings in `words` (an interface's renderer; Python's keyword arguments by
        default), or without them when `words` is None (a refusal whose hint says them)."""
        head = (f"peak {format_bytes(self.peak)} ({self.peak_phase.name}) of {format_bytes(self.budget)} usable "
                f"({self.machine.describe()} minus {format_bytes(self.machine.reserve)} for macOS and apps)")
        if self.fits:
            return f"fits: {head}"
        if self.suggestion is None:
            return f"does not fit: {head}; no smaller setting fits this machine"
        text = f"does not fit: {head}; fits with {' + '.join(self.suggestion.changes)} " \
               f"(peak {format_bytes(self.suggestion.peak)})"
        return text if words is None else f"{text}: {words(self.suggestion.settings)}"

    def render(self, *, verdict: bool = True, words: Words | None = python_words) -> str:
        """The plan as a table (CLI `h3bridge plan`, ComfyUI Memory Plan node), ending with its
        verdict (its settings in `words`) unless `verdict` is False (a refusal, whose message is
        the verdict)."""
        g = self.geometry or geometry(self.request)
        lines = [f"request: {self.request.width}x{self.request.height}"
                 + (f" (render {g.render_width}x{g.render_height})" if self.request.render_width else "")
                 + f", {g.frames} frames, {self.request.layers} layers, DiT {self.dit_path}"
                 + (", preview" if self.preview else "") + (", warm session" if self.session else "")
                 + f"; sequence {g.sequence} rows"
                 + (f" ({g.text_rows} text incl. {g.vision_tokens} picture tokens, {g.condition_rows} condition)"
                    if g.vision_tokens else ""),
                 f"sizes from: {self.sizes.source}",
                 f"{'phase':<22} {'peak':>10}  made of"]
        for phase in self.phases:
            parts = ", ".join(f"{what} {format_bytes(size)}" for what, size in phase.parts if size)
            marker = " <- peak" if phase is self.peak_phase else ""
            lines.append(f"{phase.name:<22} {format_bytes(phase.total):>10}  {parts}{marker}")
        lines.extend(f"note: {note}" for note in self.notes)
        if verdict:
            lines.append(self.verdict(words))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "fits": self.fits, "peak_bytes": self.peak, "peak_phase": self.peak_phase.name,
            "budget_bytes": self.budget, "reserve_bytes": self.machine.reserve,
            "machine": {"total_memory": self.machine.total_memory, "chip": self.machine.chip},
            "dit_path": self.dit_path, "preview": self.preview, "session": self.session,
            "sizes_source": self.sizes.source,
            "phases": [{"name": p.name, "bytes": p.total, "parts": dict(p.parts)} for p in self.phases],
            "suggestion": None if self.suggestion is None else {
                "changes": list(self.suggestion.changes),
                "settings": [{"field": change.field, "value": change.value} for change in self.suggestion.settings],
                "peak_bytes": self.suggestion.peak},
            "notes": list(self.notes),
        }


def plan_memory(request: GenerationRequest, inventory: ModelInventory | None = None, *,
                machine: MachineFacts | None = None, preview: bool = False, session: bool = False) -> MemoryPlan:
    """The plan for `request` on `machine` (detected when None), sized from `inventory` when given.
    `session`: planned for a warm engine (h3's interactive mode), which keeps the DiT and the
    video decoder loaded between clips. Never raises for not fitting: see `fits` and `suggestion`.
    Raises RequestError for a request h3 would refuse anyway (an 8192x8192 canvas is over the
    pixel limit, whatever the memory): its rules come before the plan, so that no suggestion is
    made from a canvas that cannot run."""
    request.validate(check_files=False)
    machine = machine or MachineFacts.detect()
    if inventory is not None:
        partition = REF2VA if request.is_ref2va and inventory.has_ref2va else FL2VA
        sizes = ModelSizes.from_inventory(inventory, partition)
    else:
        sizes = ModelSizes.published()
    g = geometry(request)
    dit_path, phases = _build_phases(request, preview, sizes, machine, session, g)
    plan = MemoryPlan(request=request, machine=machine, preview=preview, sizes=sizes, phases=phases,
                      dit_path=dit_path, session=session, geometry=g)
    if not plan.fits:
        plan.suggestion = _suggest(request, preview, sizes, machine, session)
    for visual in g.assumed_inputs:
        plan.notes.append(f"{visual.what} could not be read: planned at {visual.width}x{visual.height}"
                          + (f", {visual.frames} frames" if visual.frames > 1 else "") + " (upstream's largest)")
    if machine.int8_dit and not request.ssd_streaming:
        # h3_gpu.m h3_gpu_create: TensorOps is decided when h3 compiles its shaders; without it h3
        # falls back to BF16 kernels and weights
        bf16 = max(p.total for p in _build_phases(request, preview, sizes, replace(machine, tensor_ops_disabled=True),
                                                  session, g)[1])
        plan.notes.append(f"planned for h3's int8 DiT (M5 Metal TensorOps); if h3 cannot use TensorOps "
                          f"(H3_NAX=0, or its shaders fail to compile with them) it runs BF16, peak {format_bytes(bf16)}")
    if session:
        plan.notes.append("warm session: h3 keeps the DiT loaded after denoising and the video decoder after "
                          "decoding, so the next clip encodes its prompt with the decoder still loaded")
    if machine.system != "Darwin":
        plan.notes.append("not a Mac: the figures are what h3 would need on a Mac with this much memory")
    return plan
