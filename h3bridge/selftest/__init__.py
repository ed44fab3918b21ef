"""`h3bridge selftest`: check every surface against this machine's engine, calibrate the ETA and
the preset advice, and write a report a user can send us (issue 33).

    from h3bridge.selftest import SelftestOptions, run_selftest
    outcome = run_selftest(SelftestOptions(model_dir="~/models/MiniMax-H3"), say=print)
    print(outcome.markdown_path)

The parts: facts.py (the machine and where each part was found), runs.py (renders, cancels,
pause per engine), measure.py (memory sampling, progress log), report.py (Markdown and JSON,
nothing private), calibrate.py (what the renders measured, stored beside the job history). No
argparse here: the command line is h3bridge/cli/selftest.py, the ComfyUI node comfy/selftest_node.py.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..cancel import CancelToken
from ..errors import GenerationCancelled, RequestError
from ..vocabulary import EngineKind
from .calibrate import calibrate
from .facts import locate_all, machine_facts, verify_check
from .report import Check, Report, Status
from .runs import Context, engine_checks, make_plan, remove_folder

FOLDER_PREFIX = "selftest-"


@dataclass
class SelftestOptions:
    engine_path: str | os.PathLike[str] | None = None
    model_dir: str | os.PathLike[str] | None = None
    library_path: str | os.PathLike[str] | None = None
    remote_url: str | None = None
    quick: bool = False                 # only the smallest render, with one engine
    checksums: bool = False             # verify every shard's SHA-256 too
    engines: tuple[EngineKind, ...] = ()    # only these (default: every engine this machine has)
    output_dir: str | os.PathLike[str] | None = None    # where the run's folder goes (default: the cache's)
    keep_renders: bool = False          # keep the clips the run rendered (default: only the report stays)
    calibrate: bool = True              # store the measured speed for the ETA and the preset advice
    stall_timeout: float | None = 600.0
    mid_canvas: tuple[int, int] | None = None   # another mid canvas (tests on a slow CPU build)


@dataclass
class SelftestOutcome:
    report: Report
    folder: Path
    markdown_path: Path
    json_path: Path
    calibrated: bool = False
    notes: list[str] = field(default_factory=list)


def default_parent() -> Path:
    from ..userdirs import cache_dir
    return cache_dir() / "selftest"


def new_run_folder(parent: Path) -> Path:
    """A folder of the run's own, made now (never an existing one: nothing of the user's is touched)."""
    from ..safeio.paths import not_a_folder
    stamp = time.strftime("%Y%m%d-%H%M%S")
    hint = "give a folder for the selftest's report (it makes a new folder inside)"
    what = not_a_folder(parent)
    if what is not None:
        raise RequestError(f"{parent} is not a folder: it is {what}", field="output_dir", hint=hint)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RequestError(f"cannot create the folder {parent}: {error.strerror or error}", field="output_dir",
                           hint=f"{hint}, one you can write to") from None
    for number in range(1, 1000):
        folder = parent / (f"{FOLDER_PREFIX}{stamp}" + ("" if number == 1 else f"-{number}"))
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
        except OSError as error:
            raise RequestError(f"cannot create a folder in {parent}: {error.strerror or error}", field="output_dir",
                               hint=f"{hint}, one you can write to") from None
    raise RequestError(f"{parent} holds too many selftest folders from this second", field="output_dir",
                       hint="give another folder")


def engines_to_run(options: SelftestOptions, has_library: bool) -> list[EngineKind]:
    """Every engine this machine has, in the order a user meets them (or the ones asked for)."""
    every = [EngineKind.ONE_SHOT, EngineKind.SESSION] + ([EngineKind.LIBRARY] if has_library else []) \
        + ([EngineKind.REMOTE] if options.remote_url else [])
    if not options.engines:
        return every
    missing = [kind for kind in options.engines if kind not in every]
    if missing:
        why = {EngineKind.LIBRARY: "no libh3 was found (give its path as library_path)",
               EngineKind.REMOTE: "no remote URL was given"}
        raise RequestError("; ".join(f"the {kind.value} engine cannot run: {why.get(kind, 'not available')}"
                                     for kind in missing), field="engines",
                           hint="leave the engine out, or give what it needs")
    return [kind for kind in every if kind in options.engines]


def run_selftest(options: SelftestOptions, *, say: Callable[[str], None] = lambda line: None,
                 cancel: CancelToken | None = None) -> SelftestOutcome:
    """The whole selftest. `say` hears one line per step (the budget first); `cancel` stops it
    (GenerationCancelled, with the run's folder removed and nothing stored)."""
    from ..history.recorder import unrecorded
    cancel = cancel or CancelToken()
    started = time.monotonic()
    if options.remote_url is not None:
        from ..engines.remote import normalise_base_url
        try:
            normalise_base_url(options.remote_url)      # refused before anything runs
        except RequestError as error:
            raise RequestError(error.message, field="remote_url", hint=error.hint) from None
    found, located = locate_all(options.engine_path, options.model_dir, options.library_path)
    local_ready = found.engine is not None and found.model is not None
    kinds = engines_to_run(options, found.library is not None)
    if not local_ready:
        kinds = [kind for kind in kinds if kind is EngineKind.REMOTE]
    mid = dict(width=options.mid_canvas[0], height=options.mid_canvas[1], frames=22, steps=4) \
        if options.mid_canvas else None
    plan = make_plan(kinds, quick=options.quick, mid=mid)
    folder = new_run_folder(Path(options.output_dir).expanduser() if options.output_dir else default_parent())
    report = Report(facts=machine_facts(found), budget_seconds=plan.budget_seconds())
    report.facts["run"] = "quick" if plan.quick else "full"
    report.facts["engines"] = [kind.value for kind in plan.engines]
    say(f"selftest: {len(plan.renders())} renders with {', '.join(k.value for k in plan.engines) or 'no engine'}; "
        f"budget about {report.budget_seconds / 60:.0f} min on a 64 GB M-series Mac by the plan's own estimate "
        f"(its reference, an M1 Ultra); writing to {folder}")
    try:
        report.extend(located)
        for check in located:
            say(check.line())
        if found.model is not None:
            report.add(verify_check(found.model, checksums=options.checksums))
            say(report.checks[-1].line())
            from ..model.inventory import inspect_model
            inventory = inspect_model(found.model)
        else:
            inventory = None
        context = Context(found=found, folder=folder, cancel=cancel, remote_url=options.remote_url,
                          stall_timeout=options.stall_timeout, inventory=inventory)
        if not plan.engines:
            report.add(Check("engines", Status.FAIL, "no engine could run: see the lines above for what is missing"))
        with unrecorded():        # the user's job history is not this run's
            for kind in plan.engines:
                for check in engine_checks(context, kind, plan):
                    report.add(check)
                    say(check.line())
        if cancel.cancelled:
            raise GenerationCancelled("selftest cancelled")
        calibrated = False
        if options.calibrate:
            calibration_check, calibrated, table = calibrate(context, folder.name)
            report.add(calibration_check)
            report.preset_table = table
            say(calibration_check.line())
        if not options.keep_renders:
            remove_folder(context.renders)
        report.wall_seconds = time.monotonic() - started
        if report.budget_seconds and report.wall_seconds > report.budget_seconds:
            report.notes.append(f"the run took {report.wall_seconds:.0f} s, over its stated budget of "
                                f"{report.budget_seconds:.0f} s (a budget for a 64 GB M-series Mac)")
        from .measure import PhysFootprint
        report.notes.append("memory: " + ("macOS's physical footprint (proc_pid_rusage) beside the resident size"
                                          if PhysFootprint().available else
                                          "the resident size of the engine's processes; on macOS the physical "
                                          "footprint is read too (that code path is untested by the suite, which "
                                          "runs on Linux)"))
        markdown, as_json = report.write(folder)
    except BaseException:
        remove_folder(folder)      # Ctrl-C or a failure of the run itself: nothing left behind
        raise
    return SelftestOutcome(report=report, folder=folder, markdown_path=markdown, json_path=as_json,
                           calibrated=calibrated)


__all__ = ["SelftestOptions", "SelftestOutcome", "run_selftest", "engines_to_run", "default_parent"]
