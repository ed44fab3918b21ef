"""`h3bridge history` (recent jobs) and `h3bridge stats` (phase timings per device and shape)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..runnable import h3bridge_command
from ..history.stats import ShapeStats, Spread, run_seconds, shape_stats
from ..history.store import HistoryStore, JobRow, history_path

DEFAULT_LIMIT = 20
PROMPT_WIDTH = 40


def add_history_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "history", help="list recent jobs (every engine: CLI, ComfyUI, server)",
        description=f"List the most recent jobs from the job history ({_where()}): when, engine, "
                    "shape, outcome, run time, and the prompt or the failure.")
    parser.add_argument("-n", "--limit", type=_positive_int, default=DEFAULT_LIMIT,
                        help=f"how many jobs (default {DEFAULT_LIMIT})")
    parser.add_argument("--json", action="store_true",
                        help="print the jobs as JSON (request, device, phases, outcome, message)")
    parser.set_defaults(handler=run_history)


def add_stats_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stats", help="phase timings per device and shape (median and range over completed jobs)",
        description=f"Seconds per upstream phase over the completed jobs of the job history ({_where()}), "
                    "per device and shape: the median and the range (fastest-slowest). 'total' is "
                    "the run time without waiting for the engine.")
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    parser.set_defaults(handler=run_stats)


def run_history(args: argparse.Namespace) -> int:
    rows = HistoryStore().recent_jobs(args.limit)
    return _print([row.as_json() for row in rows] if args.json else None,
                  history_lines(rows) if rows else None, f"no jobs in {history_path()} yet")


def run_stats(args: argparse.Namespace) -> int:
    stats = shape_stats(HistoryStore().completed_jobs())
    status = _print([item.as_json() for item in stats] if args.json else None,
                    stats_lines(stats) if stats else None, f"no completed jobs in {history_path()} yet")
    if not args.json:       # the JSON stays the list of shapes it always was
        print("\n".join(calibration_lines()))
    return status


def calibration_lines() -> list[str]:
    """This machine's selftest calibration (the newest) and the preset table it predicts."""
    from ..history.calibration import load_calibration, preset_table_lines
    calibration = load_calibration()
    said = f"calibration: {calibration.describe()}" if calibration is not None else \
        f"calibration: none yet (`{h3bridge_command('selftest')}` measures this machine)"
    return ["", said, *preset_table_lines(calibration)]


def _print(as_json: list[dict[str, object]] | None, lines: list[str] | None, nothing: str) -> int:
    """JSON on stdout when asked for; else the lines, or (stderr) that there is nothing yet."""
    if as_json is not None:
        print(json.dumps(as_json, indent=2))
    elif lines:
        print("\n".join(lines))
    else:
        print(nothing, file=sys.stderr)
    return 0


def history_lines(rows: list[JobRow]) -> list[str]:
    """One line per job, newest first."""
    lines = [f"{'id':>5}  {'started':<16}  {'engine':<9}  {'status':<11}  {'run':>8}  {'shape':<28}  prompt / message"]
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(row.started_at))
        seconds = run_seconds(row)
        run = "" if seconds is None else f"{seconds:.1f} s"
        text = row.message if row.message else _excerpt(str(row.request.get("prompt", "")))
        lines.append(f"{row.id:>5}  {started:<16}  {row.engine:<9}  {row.status():<11}  {run:>8}  "
                     f"{row.shape:<28}  {text}")
    return lines


def stats_lines(stats: list[ShapeStats]) -> list[str]:
    """Per device, per shape: each phase's median and range."""
    lines: list[str] = []
    device = None
    for item in stats:
        if item.device != device:
            device = item.device
            lines += ([""] if lines else []) + [device.describe()]
        lines.append(f"  {item.shape} ({item.runs} completed {'run' if item.runs == 1 else 'runs'})")
        lines.append(f"    {'phase':<24} {'median':>10}  {'range':<21} {'runs':>4}")
        spreads = list(item.phases.items()) + ([("total", item.total)] if item.total is not None else [])
        for phase, spread in spreads:
            lines.append(f"    {phase:<24} {_seconds(spread.median):>10}  {_range(spread):<21} {spread.runs:>4}")
    return lines


def _seconds(value: float) -> str:
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def _range(spread: Spread) -> str:
    return f"{_seconds(spread.low)} - {_seconds(spread.high)}"


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= PROMPT_WIDTH else text[:PROMPT_WIDTH - 3] + "..."


def _where() -> str:
    path = history_path()
    return "turned off" if path is None else str(path)


MAX_LIMIT = 10**9


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number of jobs")
    if value > MAX_LIMIT:       # SQLite's integers are 64-bit: a 400-digit limit was a traceback
        raise argparse.ArgumentTypeError(f"{text if len(text) <= 20 else f'a {len(text)}-digit number'} is more jobs "
                                         f"than a history holds; give at most {MAX_LIMIT}")
    return value


__all__ = ["add_history_command", "add_stats_command", "history_lines", "stats_lines"]
