"""`h3bridge selftest`: the command line of h3bridge/selftest (issue 33)."""
from __future__ import annotations

import argparse
import json
import sys

from .engine import EXIT_FAILURE, EXIT_OK, add_engine_options, cancel_on_signals, cancelled_status
from ..errors import GenerationCancelled
from .flags import float_flag
from ..vocabulary import ENGINE_KINDS, read_engine_kind


def add_selftest_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "selftest", help="check every engine here, calibrate the ETA, write a report to send us",
        description="Render, cancel and pause with every engine this machine has (one-shot, session, the library "
                    "engine when libh3 is found, a server with --remote), measure memory and time against the "
                    "plan, store the measured speed for the ETA and the preset advice, and write report.md and "
                    "report.json (nothing private in them) into a new folder. The time budget is said before it "
                    "starts. Only that folder and the calibration entry in the job history are written.")
    add_engine_options(parser)
    parser.add_argument("--library-path", metavar="PATH",
                        help="libh3 for the library engine (default: $H3_LIBRARY, else the one build-engine put "
                             "beside the engine)")
    parser.add_argument("--remote", metavar="URL", help="also check the remote engine on this Videos API server")
    parser.add_argument("--engine", dest="engines", action="append", metavar="{" + ",".join(ENGINE_KINDS) + "}",
                        type=_engine_kind, help="check only this engine (repeat for more; default: every engine here)")
    parser.add_argument("--quick", action="store_true", help="only the smallest render, with one engine")
    parser.add_argument("--checksums", action="store_true", help="also hash every model shard (slow: 60+ GB)")
    parser.add_argument("--output-dir", metavar="DIR",
                        help="where the run's new folder goes (default: h3bridge's cache folder, selftest/)")
    parser.add_argument("--keep-renders", action="store_true", help="keep the clips it rendered beside the report")
    parser.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                        help="do not store the measured speed (the ETA and preset advice stay as they are)")
    parser.add_argument("--stall-timeout", type=float_flag(0, 7 * 24 * 3600.0), default=600.0, metavar="SECONDS",
                        help="stop an engine after this long without progress (default 600; 0 disables)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.set_defaults(handler=run_selftest_command)


def _engine_kind(text: str):  # type: ignore[no-untyped-def]
    try:
        return read_engine_kind(text)[0]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an engine; choose from {', '.join(ENGINE_KINDS)}") from None


def run_selftest_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..cancel import CancelToken
    from ..errors import RequestError
    from ..selftest import SelftestOptions, run_selftest
    from ..safeio.paths import not_a_folder
    what = not_a_folder(Path(args.output_dir).expanduser()) if args.output_dir else None
    if what is not None:
        raise RequestError(f"--output-dir {args.output_dir} is not a folder: it is {what}", field="output_dir",
                           hint="give a folder (the selftest makes a new folder for its report inside it), or leave "
                                "--output-dir out to use h3bridge's cache folder")
    options = SelftestOptions(engine_path=args.engine_path, model_dir=args.model_dir, library_path=args.library_path,
                              remote_url=args.remote, quick=args.quick, checksums=args.checksums,
                              engines=tuple(dict.fromkeys(args.engines or ())), output_dir=args.output_dir,
                              keep_renders=args.keep_renders, calibrate=args.calibrate,
                              stall_timeout=args.stall_timeout or None)
    cancel = CancelToken()
    with cancel_on_signals(cancel) as received:
        try:
            outcome = run_selftest(options, say=lambda line: print(line, file=sys.stderr, flush=True), cancel=cancel)
        except GenerationCancelled as error:
            print("h3bridge: selftest cancelled; its folder was removed and nothing was stored", file=sys.stderr)
            return cancelled_status(error, received)
    if args.json:
        print(json.dumps(outcome.report.as_json(), indent=2))
    print(f"h3bridge selftest: report in {outcome.markdown_path} and {outcome.json_path.name} beside it; "
          "attach both to an issue (https://github.com/h3bridge/h3bridge/issues/new?template=selftest.md)",
          file=sys.stderr)
    return EXIT_OK if outcome.report.ok else EXIT_FAILURE


__all__ = ["add_selftest_command"]
