"""A problem found in a model folder, with its fix: what the inventory (inventory.py) and a folded
model's record (fold_record.py) report. Below both, so neither imports the other for it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from ..fixes import Fix


@dataclass(frozen=True)
class Problem:
    severity: str          # "error": h3 will fail or render garbage; "warning": works, but not as expected
    kind: str              # stable identifier, e.g. "appledouble", "comfyui-repack"
    message: str
    fix: "str | Fix"       # a Fix when it names settings (h3bridge.fixes): each interface says it its way
    path: Path | None = None
    error: ModelError | None = None   # the typed exception to raise for it
    references_only: bool = False     # in the optional Ref2VA checkpoint: stops only reference jobs

    def exception(self) -> ModelError:
        return self.error if self.error is not None else ModelError(self.message, hint=self.fix)

    @property
    def label(self) -> str:
        """The severity as a table shows it."""
        return f"{self.severity} (reference jobs only)" if self.references_only else self.severity
