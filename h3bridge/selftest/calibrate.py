"""From the selftest's renders to this machine's calibration: seconds per denoise step at each
canvas, and the rest, per engine, stored beside the job history (history/calibration.py) where
the ETA and the preset advice read them from then on."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..history.calibration import Calibration, load_calibration, preset_table_lines, save_calibration
from ..history.store import HistoryUnavailable
from ..vocabulary import EngineKind
from .report import Check, Status

if TYPE_CHECKING:
    from .runs import Context


def calibrate(context: "Context", run: str) -> tuple[Check, bool, list[str]]:
    """(the check line, whether an entry was stored, the preset table in this machine's seconds)."""
    renders = [r for r in context.rendered if r.kind is not EngineKind.REMOTE]
    if not any(r.what == "mid" for r in renders):
        # a 32x32 step is all overhead: scaled up to a real canvas it would predict hours for minutes
        why = "no render of this machine finished" if not renders else \
            "only the smallest canvas was rendered (--quick), too small to time a denoise step"
        return (Check("calibration", Status.SKIPPED, f"{why}: nothing calibrated, the ETA and preset advice "
                      "stay as they were"), False, preset_table_lines(load_calibration()))
    engine_path = str(context.found.engine) if context.found.engine is not None else None
    entries = [r.calibration_entry(run, str(context.found.library) if r.kind is EngineKind.LIBRARY else engine_path)
               for r in renders]
    try:
        save_calibration(entries)
    except HistoryUnavailable as error:
        return (Check("calibration", Status.FAIL, f"not stored: {error.message} (fix: {error.hint})"),
                False, preset_table_lines(Calibration(tuple(entries))))
    calibration = load_calibration(engine=EngineKind.ONE_SHOT.value, engine_path=engine_path) or \
        Calibration(tuple(entries))
    figures = {"entries": [entry.as_json() for entry in entries]}
    return (Check("calibration", Status.PASS, f"stored for the ETA and the preset advice: {calibration.describe()}",
                  figures=figures), True, preset_table_lines(calibration))


__all__ = ["calibrate"]
