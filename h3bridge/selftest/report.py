"""The selftest report: one line per check, written as Markdown (to read and paste into an issue)
and JSON (for us to read many of) in one folder, with nothing private in either.

Private means: no prompt but the selftest's own, no user name (the home folder is written `~`),
nothing of the user's clips or history. Every string goes through `shareable` on its way out.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

from ..safeio.outputs import write_output

REPORT_MARKDOWN = "report.md"
REPORT_JSON = "report.json"
GAP_LIMIT = 0.10           # a measurement more than 10 % away from the plan is flagged
SHOWN_GAPS = 3             # the report line names this many of the largest gaps


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    SLOWER = "slower than planned"
    SKIPPED = "skipped"


@dataclass
class Check:
    """One line of the report: what was checked, how it went, and the figures behind it."""

    name: str
    status: Status
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)       # every gap over GAP_LIMIT, said in words

    def line(self) -> str:
        return f"{self.status.value}: {self.name}: {self.detail}"

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail, "flags": self.flags,
                "figures": self.figures}


def gap(measured: float, planned: float) -> float | None:
    """(measured - planned) / planned; None without a plan to compare with."""
    return None if planned <= 0 else (measured - planned) / planned


def flag_gap(what: str, measured: float, planned: float, unit: str = "s") -> str | None:
    """A flag when `measured` is more than GAP_LIMIT away from `planned`, else None."""
    share = gap(measured, planned)
    if share is None or abs(share) <= GAP_LIMIT:
        return None
    shown = (lambda v: f"{v / 2**30:.2f} GiB") if unit == "bytes" else (lambda v: f"{v:.3g} s")
    direction = "above" if share > 0 else "below"
    return f"{what} {shown(measured)} is {abs(share) * 100:.0f} % {direction} the plan's {shown(planned)}"


def compare(name: str, measured: dict[str, float], planned: dict[str, float], *, unit: str = "s",
            over_is: Status = Status.SLOWER) -> Check:
    """A check of measured figures against the plan's: every gap over GAP_LIMIT flagged; any
    measurement above its plan makes the check `over_is` (slower than planned), else it passes."""
    flagged: dict[str, str] = {}
    over = False
    for key, value in measured.items():
        plan = planned.get(key)
        text = None if plan is None else flag_gap(key, value, plan, unit)
        if text is not None:
            flagged[key] = text
            over = over or value > plan      # type: ignore[operator]
    flags = list(flagged.values())
    figures = {key: {"measured": measured[key], "planned": planned.get(key),
                     "gap": None if planned.get(key) is None else gap(measured[key], planned[key])} for key in measured}
    # the line names the largest gaps; the JSON keeps every figure and `flags` every gap
    largest = [text for _, text in sorted(((abs(figures[key]["gap"]), text) for key, text in flagged.items()),
                                          reverse=True)]
    detail = ("; ".join(largest[:SHOWN_GAPS]) + (f"; {len(largest) - SHOWN_GAPS} more gaps over 10 % in report.json"
                                                if len(largest) > SHOWN_GAPS else "")) if flags else "within 10 % of the plan"
    return Check(name, over_is if over else Status.PASS, detail, figures=figures, flags=flags)


def shareable(value: Any, home: str | None = None) -> Any:
    """`value` with the home folder written `~` in every string (dicts and lists walked)."""
    home = home if home is not None else os.path.expanduser("~")
    if isinstance(value, str):
        return value.replace(home, "~") if home and home not in ("/", "~") else value
    if isinstance(value, dict):
        return {shareable(key, home): shareable(item, home) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [shareable(item, home) for item in value]
    if isinstance(value, Path):
        return shareable(str(value), home)
    return value


@dataclass
class Report:
    facts: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    budget_seconds: float | None = None
    wall_seconds: float | None = None
    preset_table: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def extend(self, checks: Iterable[Check]) -> None:
        self.checks.extend(checks)

    def counts(self) -> dict[str, int]:
        counts = {status.value: 0 for status in Status}
        for check in self.checks:
            counts[check.status.value] += 1
        return counts

    @property
    def ok(self) -> bool:
        return not any(check.status is Status.FAIL for check in self.checks)

    def as_json(self) -> dict[str, Any]:
        return shareable({"ok": self.ok, "counts": self.counts(), "facts": self.facts,
                          "budget_seconds": self.budget_seconds, "wall_seconds": self.wall_seconds,
                          "checks": [check.as_json() for check in self.checks],
                          "preset_table": self.preset_table, "notes": self.notes})

    def markdown(self) -> str:
        counts = ", ".join(f"{n} {status}" for status, n in self.counts().items() if n)
        lines = ["# h3bridge selftest report", "",
                 f"**{'no failures' if self.ok else 'FAILURES'}**: {counts}."]
        if self.budget_seconds is not None and self.wall_seconds is not None:
            lines.append(f"Ran {self.wall_seconds:.0f} s (stated budget {self.budget_seconds:.0f} s).")
        lines += ["", "## Facts", "", "| fact | value |", "| --- | --- |"]
        for key, value in self.facts.items():
            shown = "unknown" if value is None else value if isinstance(value, str) else json.dumps(value)
            lines.append(f"| {key} | {str(shown).replace('|', '/')} |")
        lines += ["", "## Checks", ""]
        lines += [f"- {check.line()}" for check in self.checks]
        if self.preset_table:
            lines += ["", "## Predicted run times", "", "```text", *self.preset_table, "```"]
        if self.notes:
            lines += ["", "## Notes", "", *[f"- {note}" for note in self.notes]]
        return shareable("\n".join(lines) + "\n")

    def write(self, folder: Path) -> tuple[Path, Path]:
        """report.md and report.json in `folder` (each published whole: safeio.outputs)."""
        markdown, as_json = folder / REPORT_MARKDOWN, folder / REPORT_JSON
        write_output(markdown, self.markdown(), overwrite=True, field="selftest report")
        write_output(as_json, json.dumps(self.as_json(), indent=2) + "\n", overwrite=True, field="selftest report")
        return markdown, as_json


__all__ = ["Check", "GAP_LIMIT", "Report", "Status", "compare", "flag_gap", "gap", "shareable",
           "REPORT_MARKDOWN", "REPORT_JSON"]
