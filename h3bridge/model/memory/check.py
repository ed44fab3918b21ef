"""Before an engine starts: the model check, then the plan, refusing what does not fit."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ...errors import MemoryPlanError, ModelError
from ...fixes import Fix, changes
from ...request import GenerationRequest
from ..inventory import REF2VA, ModelInventory
from .machine import MachineFacts
from .plan import MemoryPlan, plan_memory


def check_model_for(request: GenerationRequest, inventory: ModelInventory) -> "list[str | Fix]":
    """Raise ModelError / IntegrityError when h3 cannot run `request` from this model: layout
    and shard-header problems, or references without a complete Ref2VA checkpoint. Returns the
    warnings to show for this job (inventory.warnings_for): a job without references is not
    stopped by an incomplete Ref2VA/, since upstream loads it only for ordered references."""
    inventory.raise_for_problems(references=request.is_ref2va)
    if request.is_ref2va and not inventory.has_ref2va and REF2VA in inventory.partitions:
        raise inventory.incomplete_ref2va_error()     # e.g. Ref2VA/ without its index JSON
    if request.is_ref2va and not inventory.has_ref2va:
        # h3.c h3_generate: "ordered references require the Ref2VA checkpoint"
        raise ModelError("ordered references require the Ref2VA checkpoint, and "
                         f"{inventory.root} has no Ref2VA/transformer/model.safetensors.index.json",
                         hint="download the Ref2VA/ folder of MiniMaxAI/MiniMax-H3 next to FL2VA/")
    return inventory.warnings_for(references=request.is_ref2va) + fold_warnings(request, inventory)


def fold_warnings(request: GenerationRequest, inventory: ModelInventory) -> "list[str | Fix]":
    """A folded step-distillation model sampled with --reuse/--core-reuse or many steps (fold_record.py)."""
    from ..fold_record import request_warnings
    return request_warnings(request, inventory.provenance)   # type: ignore[arg-type]


def require_fit(plan: MemoryPlan) -> MemoryPlan:
    """`plan`, or MemoryPlanError (carrying the plan, and its suggestion as the fix's settings)
    when it does not fit."""
    if not plan.fits:
        anyway = changes(force=True)
        fix = (Fix("use {} (or pass {} to try anyway)", (plan.suggestion.settings, anyway)) if plan.suggestion else
               Fix("this machine has too little memory for MiniMax-H3 even at the smallest settings "
                   "(or pass {} to try anyway)", (anyway,)))
        raise MemoryPlanError(plan.verdict(None), plan=plan, hint=fix)
    return plan


def preflight(request: GenerationRequest, model_dir: str | Path, *,
              machine: MachineFacts | Callable[[], MachineFacts | None] | None = None,
              preview: bool = False, force: bool = False, session: bool = False,
              inventory: ModelInventory | None = None) -> MemoryPlan:
    """Before starting an engine: layout + every shard header (fast; no tensor data read), then the
    memory plan. Raises ModelError / IntegrityError for a model h3 cannot use, and MemoryPlanError
    (carrying the plan and its suggestion) when the request will not fit, unless `force`.
    `session`: the request will run on a warm engine (see `plan_memory`). `inventory`: the
    model's inventory when the caller already holds it (a server checking every submission
    against one model), instead of reading the headers again. `machine` may be a function giving
    the facts (the library engine's, which start a worker that opens the model): it is called
    after the model check."""
    from ..inventory import inspect_model

    if inventory is None:
        inventory = inspect_model(model_dir)
    warnings = (inventory.warnings_for(references=request.is_ref2va) + fold_warnings(request, inventory) if force
                else check_model_for(request, inventory))
    if callable(machine):       # facts that cost an engine start (the library's): after the model check
        machine = machine()
    plan = plan_memory(request, inventory, machine=machine, preview=preview, session=session)
    plan.model_warnings = warnings
    return plan if force else require_fit(plan)
