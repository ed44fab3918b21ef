"""How much of a LoRA survived the fold into the bf16 checkpoint: measured while folding.

For each module class and overall, with dW the intended update (float64) and D the change the
folded tensor actually stores (written - original):
  rho       = ||dW|| / ||W||               how big the update is against the weights
  kept      = <D, dW> / ||dW||^2           how much of the update is present (1: all of it)
  noise     = ||D - dW|| / ||dW||          what rounding added, against the update
  unchanged = share of elements with D = 0 (rounded straight back to W)
Round to nearest keeps about 0.2-0.3 of a distillation LoRA (rho ~3e-4, issue 21); stochastic
rounding keeps ~1.0 at some noise. On M5, h3.c quantizes qkv/out/fc1/fc2 to int8 at load
(h3_dit.c quantize_block_qkv and its fc1/fc2/out twins): that adds its own noise to every weight
but keeps on average what the fold stored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..fixes import Fix, given, literal

CLASSES = ("qkv", "out", "fc1", "fc2", "adaln", "token refiner", "final layer", "other")
OVERALL = "overall"
KEPT_WARNING = 0.9
INT8_NOTE = ("on an M5, h3 quantizes qkv/out/fc1/fc2 to int8 when it loads them: that adds noise of its own "
             "but keeps, on average, what the fold stored")


def module_class(target: str) -> str:
    if target.startswith("token_refiner."):
        return "token refiner"
    if target.startswith("final_layer."):
        return "final layer"
    for suffix, name in (("attn.qkv_proj.weight", "qkv"), ("attn.out_proj.weight", "out"),
                         ("mlp.fc1.weight", "fc1"), ("mlp.fc2.weight", "fc2")):
        if target.endswith(suffix):
            return name
    return "adaln" if "adaln" in target else "other"


@dataclass
class Tally:
    """Running sums for one class (float64 dot products of whole blocks)."""

    elements: int = 0
    unchanged: int = 0
    weight_sq: float = 0.0      # ||W||^2
    update_sq: float = 0.0      # ||dW||^2
    stored_dot: float = 0.0     # <D, dW>
    stored_sq: float = 0.0      # ||D||^2

    @classmethod
    def of_block(cls, weight: np.ndarray, update: np.ndarray, stored: np.ndarray,
                 changed: np.ndarray | None = None) -> "Tally":
        """The sums of one block (arrays of one shape; `changed`: a bool array of it to reuse).
        float32 blocks are summed in float32 by BLAS dot products (the fold runs BLAS on one
        thread; a few 1e5 elements per block, read to 3 digits), blocks add up in float64."""
        w, u, d = weight.reshape(-1), update.reshape(-1), stored.reshape(-1)
        changed = np.not_equal(d, 0, out=None if changed is None else changed.reshape(-1))   # -0.0 == 0: unchanged
        with np.errstate(over="ignore", invalid="ignore"):      # an infinite sum: see finite()
            return cls(elements=w.size, unchanged=int(w.size - np.count_nonzero(changed)),
                       weight_sq=float(np.dot(w, w)), update_sq=float(np.dot(u, u)),
                       stored_dot=float(np.dot(d, u)), stored_sq=float(np.dot(d, d)))

    def finite(self) -> bool:
        """False when a sum overflowed (an infinity written, or float32 squares past 3.4e38: the
        fold then checks for the first and sums the block again in float64)."""
        return all(math.isfinite(v) for v in (self.weight_sq, self.update_sq, self.stored_dot, self.stored_sq))

    def merge(self, other: "Tally") -> None:
        for name in ("elements", "unchanged", "weight_sq", "update_sq", "stored_dot", "stored_sq"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True)
class Survival:
    """One row of the survival report (stored in the fold record)."""

    module_class: str
    tensors: int
    elements: int
    rho: float
    kept: float
    noise: float
    unchanged: float

    @classmethod
    def of(cls, name: str, tensors: int, tally: Tally) -> "Survival":
        update = tally.update_sq
        noise_sq = max(tally.stored_sq - 2 * tally.stored_dot + update, 0.0)
        return cls(name, tensors, tally.elements,
                   rho=math.sqrt(update / tally.weight_sq) if tally.weight_sq else 0.0,
                   kept=tally.stored_dot / update if update else 1.0,
                   noise=math.sqrt(noise_sq / update) if update else 0.0,
                   unchanged=tally.unchanged / tally.elements if tally.elements else 1.0)


def report(tallies: dict[str, Tally], counts: dict[str, int]) -> list[Survival]:
    """Per class (in CLASSES order) and overall."""
    rows = [Survival.of(name, counts.get(name, 0), tallies[name]) for name in CLASSES if name in tallies]
    total = Tally()
    for tally in tallies.values():
        total.merge(tally)
    rows.append(Survival.of(OVERALL, sum(counts.values()), total))
    return rows


def format_report(rows: list[Survival], rounding: str) -> str:
    lines = [f"what survived the fold (rounding: {rounding}):",
             f"  {'module':<14} {'tensors':>7} {'rho':>9} {'kept':>6} {'noise':>6} {'unchanged':>9}"]
    for row in rows:
        lines.append(f"  {row.module_class:<14} {row.tensors:>7} {row.rho:>9.2e} {row.kept:>6.3f} {row.noise:>6.2f} "
                     f"{row.unchanged:>8.1%}")
    return "\n".join(lines)


def kept_uncertainty(row: Survival) -> float:
    """The standard deviation of `kept` that rounding noise alone gives: kept = 1 + <E, dW> / ||dW||^2
    with E = D - dW of norm noise * ||dW|| spread over the elements, so about noise / sqrt(elements).
    A small class (the fixture's, a LoRA over a few tensors) measures kept only to this precision."""
    return row.noise / math.sqrt(row.elements) if row.elements else 0.0


def warnings(rows: list[Survival], rounding: str) -> "list[str | Fix]":
    """A warning when less than KEPT_WARNING of the update survived (beyond three times what
    rounding noise alone makes kept wander), with what to do about it (a Fix when it names the
    fold's rounding setting: each interface says it, h3bridge.fixes.said)."""
    low = [row for row in rows if row.module_class != OVERALL and row.elements
           and row.kept + 3 * kept_uncertainty(row) < KEPT_WARNING]
    if not low:
        return []
    names = ", ".join(f"{row.module_class} {row.kept:.2f}" for row in low)
    start = literal(f"only part of the LoRA's update is in the folded weights (kept: {names}); fix: ")
    if rounding == "nearest":
        return [Fix(start + "fold again without {} (stochastic rounding keeps the update unbiased)",
                    (given("rounding", "nearest"),))]
    return [f"only part of the LoRA's update is in the folded weights (kept: {names}); fix: a larger strength "
            "changes the LoRA's effect; nothing else keeps more"]
