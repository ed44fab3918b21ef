"""This machine's measured speed (written by `h3bridge selftest`), and what is predicted from it.

Without past runs of a shape the ETA has nothing of this machine's to go by, and the upstream cost
model (upstream_costs.py) is seconds on an M1 Ultra: right in proportion, not in size, for another
Mac (upstream issue 51: a linear extrapolation was far off). `selftest` measures the seconds per
denoise step at each canvas it renders and the seconds of everything else, and stores them beside
the job history as calibration entries. From then on

* the ETA of a shape with no past runs is the cost model's phase seconds in this machine's: the
  denoise loop by its seconds per step (a fixed part and a part per video row, a line through the
  measured canvases), the rest by its measured ratio (`calibrated_phase_seconds`, read by
  history/recorder.py),
* the preset advice (`preset_table`, `preset_advice`: a 2, 5, 10, 15 s clip at each preset) is in
  this machine's seconds, shown by `h3bridge doctor` and `h3bridge stats`.

The entries live in the history file's `calibration` table (made when first written, so an older
h3bridge reads the same file unchanged). The newest entries of this device and engine win.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..progress import DENOISE_LOOP_PHASES
from ..request import PRESETS, GenerationRequest
from ..geometry import video_latent_t
from ..upstream_costs import (DIT_BLOCKS, REFERENCE_SECONDS, REFERENCE_STEPS, REFERENCE_VIDEO_ROWS,
                              expected_phases)
from ..vocabulary import EngineKind
from .job import Device, local_device
from .store import HistoryStore, HistoryUnavailable

CALIBRATION_SCHEMA = """
CREATE TABLE IF NOT EXISTS calibration (
    id                       INTEGER PRIMARY KEY,
    measured_at              REAL NOT NULL,     -- Unix time
    run                      TEXT NOT NULL,     -- the selftest run that measured it (its folder's name)
    device                   TEXT NOT NULL,
    memory_bytes             INTEGER,
    engine                   TEXT NOT NULL,
    engine_path              TEXT,
    width                    INTEGER NOT NULL,  -- the render canvas the steps ran at
    height                   INTEGER NOT NULL,
    frame_count              INTEGER NOT NULL,
    steps                    INTEGER NOT NULL,
    layers                   INTEGER NOT NULL,
    seconds_per_step         REAL NOT NULL,     -- measured: the denoise loop / steps
    planned_seconds_per_step REAL NOT NULL,     -- the cost model's, for the same job
    other_seconds            REAL NOT NULL,     -- measured: every other phase
    planned_other_seconds    REAL NOT NULL
)
"""
CLIP_SECONDS = (2, 5, 10, 15)     # the preset table's clip lengths (upstream issue 29 asks for such a chart)
ADVICE_CANVAS = (864, 480)        # upstream's default canvas: the table's, unless asked for another


@dataclass(frozen=True)
class CalibrationEntry:
    """One canvas measured by one selftest render."""

    engine: str
    width: int
    height: int
    frame_count: int
    steps: int
    layers: int
    seconds_per_step: float
    planned_seconds_per_step: float
    other_seconds: float
    planned_other_seconds: float
    run: str = ""
    engine_path: str | None = None
    device: Device | None = None
    measured_at: float = 0.0

    @property
    def step_ratio(self) -> float:
        """Measured over planned seconds per step (2.0: this machine denoises at half the reference's speed)."""
        return self.seconds_per_step / self.planned_seconds_per_step if self.planned_seconds_per_step > 0 else 1.0

    @property
    def other_ratio(self) -> float:
        return self.other_seconds / self.planned_other_seconds if self.planned_other_seconds > 0 else 1.0

    @property
    def rows(self) -> int:
        """What a step's cost scales with: the DiT's video rows (latent frames x canvas / 32^2)."""
        return video_latent_t(self.frame_count) * (self.width // 32) * (self.height // 32)

    def as_json(self) -> dict[str, object]:
        return {"engine": self.engine, "canvas": f"{self.width}x{self.height}", "frame_count": self.frame_count,
                "steps": self.steps, "layers": self.layers, "seconds_per_step": round(self.seconds_per_step, 6),
                "planned_seconds_per_step": round(self.planned_seconds_per_step, 6),
                "step_ratio": round(self.step_ratio, 4), "other_seconds": round(self.other_seconds, 6),
                "planned_other_seconds": round(self.planned_other_seconds, 6),
                "other_ratio": round(self.other_ratio, 4)}


@dataclass(frozen=True)
class Calibration:
    """This machine's entries (one engine's, newest run): what scales the cost model to this machine."""

    entries: tuple[CalibrationEntry, ...]

    @property
    def engine(self) -> str:
        return self.entries[0].engine

    @property
    def measured_at(self) -> float:
        return max(entry.measured_at for entry in self.entries)

    def seconds_per_step(self, rows: int, layers: int) -> float:
        """A full denoise step's seconds here at `rows` video rows: a fixed part and a part per row
        (a line through the smallest and the largest measured canvas; a 32x32 step is nearly all
        the fixed part), scaled by the active layers; below the smallest canvas, the smallest's
        seconds. With one canvas, or canvases that do not order, the largest one's ratio to the
        cost model."""
        points = sorted((entry.rows, entry.seconds_per_step * DIT_BLOCKS / entry.layers) for entry in self.entries)
        (low_rows, low), (high_rows, high) = points[0], points[-1]
        if high_rows > low_rows and high >= low:
            per_row = (high - low) / (high_rows - low_rows)
            return (low + per_row * (max(rows, low_rows) - low_rows)) * layers / DIT_BLOCKS
        largest = max(self.entries, key=lambda entry: entry.rows)
        return largest.step_ratio * planned_seconds_per_step(rows, layers)

    def step_ratio(self, request: GenerationRequest) -> float:
        """This machine's full denoise step over the cost model's, for `request`."""
        rows, layers = request_rows(request), request.layers
        planned = planned_seconds_per_step(rows, layers)
        return self.seconds_per_step(rows, layers) / planned if planned > 0 else 1.0

    def other_ratio(self) -> float:
        """Everything but the denoise loop: measured/planned over all entries (the loads dominate,
        and they do not depend on the canvas)."""
        planned = sum(entry.planned_other_seconds for entry in self.entries)
        measured = sum(entry.other_seconds for entry in self.entries)
        return measured / planned if planned > 0 else 1.0

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d", time.localtime(self.measured_at)) if self.measured_at else "earlier"
        steps = ", ".join(f"{entry.seconds_per_step:.3g} s per step at {entry.width}x{entry.height}"
                          for entry in sorted(self.entries, key=lambda e: e.rows))
        simulator = ", a simulator" if simulated(self.entries[0].engine_path) else ""
        return f"{steps} ({self.engine} engine{simulator}, selftest of {when})"


def calibrated_phase_seconds(request: GenerationRequest, calibration: Calibration, *,
                             writes_mp4: bool = True) -> dict[str, float]:
    """The cost model's phases for `request` (upstream_costs.expected_phases) in this machine's seconds."""
    planned = expected_phases(request, writes_mp4=writes_mp4)
    step, other = calibration.step_ratio(request), calibration.other_ratio()
    return {phase: seconds * (step if phase in DENOISE_LOOP_PHASES else other) for phase, seconds in planned.items()}


def request_rows(request: GenerationRequest) -> int:
    """The DiT's video rows of a request (upstream_costs.JobShape's: latent frames x render canvas / 32^2)."""
    return video_latent_t(request.frame_count) * ((request.render_width or request.width) // 32) \
        * ((request.render_height or request.height) // 32)


def planned_seconds_per_step(rows: int, layers: int) -> float:
    """The cost model's full denoise step at `rows` video rows and `layers` active layers."""
    return REFERENCE_SECONDS["denoise"] / REFERENCE_STEPS * rows / REFERENCE_VIDEO_ROWS * layers / DIT_BLOCKS


def planned_loop_and_other(phases: Mapping[str, float]) -> tuple[float, float]:
    """(the denoise loop's seconds, every other phase's) of a phase table. The loop is counted
    once: expected_phases lists it under both of its names."""
    loop = max((phases.get(name, 0.0) for name in DENOISE_LOOP_PHASES), default=0.0)
    other = sum(seconds for phase, seconds in phases.items() if phase not in DENOISE_LOOP_PHASES)
    return loop, other


def predicted_wall_seconds(request: GenerationRequest, calibration: Calibration | None) -> float:
    """The run time of `request` here: the calibrated phases (the reference Mac's without a calibration)."""
    phases = calibrated_phase_seconds(request, calibration) if calibration is not None else \
        expected_phases(request, writes_mp4=True)
    loop, other = planned_loop_and_other(phases)
    return loop + other


def preset_table(calibration: Calibration | None, *, width: int = ADVICE_CANVAS[0], height: int = ADVICE_CANVAS[1],
                 clip_seconds: Sequence[float] = CLIP_SECONDS) -> dict[str, dict[float, float]]:
    """Predicted run seconds per preset, per clip length (a one-shot job: the loads included)."""
    return {name: {seconds: predicted_wall_seconds(GenerationRequest.from_preset(
        name, "preset table", width=width, height=height, seconds=seconds), calibration)
        for seconds in clip_seconds} for name in PRESETS}


def format_minutes(seconds: float) -> str:
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def preset_table_lines(calibration: Calibration | None, *, width: int = ADVICE_CANVAS[0],
                       height: int = ADVICE_CANVAS[1]) -> list[str]:
    """The table as text: a row per preset, a column per clip length (minutes:seconds)."""
    table = preset_table(calibration, width=width, height=height)
    lengths = list(next(iter(table.values())))
    whose = "this machine (selftest calibration)" if calibration is not None else \
        "the reference Mac (M1 Ultra): run `h3bridge selftest` for this machine's"
    lines = [f"predicted run time at {width}x{height}, {whose}",
             f"  {'preset':<10}" + "".join(f"{f'{length:g} s clip':>13}" for length in lengths)]
    for name, row in table.items():
        lines.append(f"  {name:<10}" + "".join(f"{format_minutes(row[length]):>13}" for length in lengths))
    return lines


def preset_advice(calibration: Calibration | None, clip_seconds: float = 5, *, width: int = ADVICE_CANVAS[0],
                  height: int = ADVICE_CANVAS[1]) -> str:
    """One line: how long a clip of `clip_seconds` takes here at each preset (doctor's line)."""
    table = preset_table(calibration, width=width, height=height, clip_seconds=(clip_seconds,))
    times = ", ".join(f"{name} {format_minutes(row[clip_seconds])}" for name, row in table.items())
    whose = "here" if calibration is not None else "on the reference Mac (not calibrated here)"
    return f"a {clip_seconds:g} s clip at {width}x{height} takes {whose}: {times}"


# ----------------------------------------------------------------------------- the store

def simulated(engine_path: str | None) -> bool:
    """An engine program that simulates h3 (h3-sim, the libh3 double): its speed is not a real engine's."""
    name = (engine_path or "").replace("\\", "/").rsplit("/", 1)[-1]
    return name.startswith("h3-sim") or "double" in name


def save_calibration(entries: Iterable[CalibrationEntry], *, store: HistoryStore | None = None,
                     device: Device | None = None) -> int:
    """Add one selftest run's entries (replacing nothing: the newest run is read); how many."""
    store = store if store is not None else HistoryStore()
    device = device or local_device()
    rows = list(entries)
    now = time.time()
    with store._write() as connection:
        connection.execute(CALIBRATION_SCHEMA)
        connection.executemany(
            "INSERT INTO calibration (measured_at, run, device, memory_bytes, engine, engine_path, width, height,"
            " frame_count, steps, layers, seconds_per_step, planned_seconds_per_step, other_seconds,"
            " planned_other_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(entry.measured_at or now, entry.run, device.name, device.memory_bytes, entry.engine, entry.engine_path,
              entry.width, entry.height, entry.frame_count, entry.steps, entry.layers, entry.seconds_per_step,
              entry.planned_seconds_per_step, entry.other_seconds, entry.planned_other_seconds) for entry in rows])
    return len(rows)


def load_calibration(*, store: HistoryStore | None = None, device: Device | None = None,
                     engine: str | None = None, engine_path: str | None = None) -> Calibration | None:
    """The newest selftest run's entries for this device: of this engine program (`engine_path`)
    when it has some, else of programs of its sort (a simulator's speed is never a real h3's, nor
    the other way round); of `engine` (default one-shot) among those when it has some, else of any engine. None when
    there are none, or the history is off or unreadable (a calibration is a courtesy: nothing
    fails without it)."""
    store = store if store is not None else HistoryStore()
    if not store.enabled or store.path is None or not store.path.exists():
        return None
    device = device or local_device()
    try:
        with store._connect(create=False) as connection:
            if connection is None:
                return None
            connection.row_factory = sqlite3.Row
            try:
                rows = connection.execute(
                    "SELECT * FROM calibration WHERE device = ? AND memory_bytes IS ? ORDER BY measured_at DESC, id DESC",
                    (device.name, device.memory_bytes)).fetchall()
            except sqlite3.OperationalError:       # no table: never calibrated
                return None
    except HistoryUnavailable:
        return None
    engine = engine or EngineKind.ONE_SHOT.value      # what a plain `generate` runs
    pools = []
    if engine_path is not None:
        pools += [[row for row in rows if row["engine_path"] == engine_path and row["engine"] == engine],
                  [row for row in rows if row["engine_path"] == engine_path]]
        rows = [row for row in rows if simulated(row["engine_path"]) == simulated(engine_path)]
    pools += [[row for row in rows if row["engine"] == engine], rows]
    rows = next((pool for pool in pools if pool), [])
    if not rows:
        return None
    newest = (rows[0]["run"], rows[0]["engine"])
    entries = tuple(CalibrationEntry(
        engine=row["engine"], width=row["width"], height=row["height"], frame_count=row["frame_count"],
        steps=row["steps"], layers=row["layers"], seconds_per_step=row["seconds_per_step"],
        planned_seconds_per_step=row["planned_seconds_per_step"], other_seconds=row["other_seconds"],
        planned_other_seconds=row["planned_other_seconds"], run=row["run"], engine_path=row["engine_path"],
        device=Device(row["device"], row["memory_bytes"]), measured_at=row["measured_at"])
        for row in rows if (row["run"], row["engine"]) == newest)
    return Calibration(entries)


__all__ = ["ADVICE_CANVAS", "CLIP_SECONDS", "Calibration", "CalibrationEntry", "calibrated_phase_seconds",
           "format_minutes", "load_calibration", "planned_loop_and_other", "predicted_wall_seconds",
           "preset_advice", "preset_table", "preset_table_lines", "save_calibration"]
