"""LoRAs for an engine without a LoRA runtime: folded into a copy of the checkpoint.

`fold_model` (fold.py) writes the folded model; `plan_fold` checks a fold without writing;
keys.py reads LoRA files and maps their names; the record a folded model carries is
model/fold_record.py (below model/inventory.py, which shows it); place.py clones/links the files a fold leaves alone; bf16.py rounds;
compiled.py runs the default case's element-wise work in compiled kernels (_kernels.py) where numba is installed.
"""
from __future__ import annotations

from .fold import FoldPlan, FoldResult, LoraSpec, fold_model, plan_fold
from ..model.fold_record import PROVENANCE_FILE, Provenance, read_provenance

__all__ = ["FoldPlan", "FoldResult", "LoraSpec", "fold_model", "plan_fold", "PROVENANCE_FILE", "Provenance",
           "read_provenance"]
