"""`h3bridge model download DIR`: the command line of download.py."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..model.download import (ALL, ALL_DOWNLOAD_GIB, FL2VA_DOWNLOAD_GIB, PARTITION_CHOICES, PINNED_REVISION, REF2VA_OWN_GIB,
                       download_command, download_model)
from ..model.inventory import OFFICIAL_REPO, format_bytes
from .engine import cli_words


def add_model_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("model", help="get the MiniMax-H3 model (`h3bridge model download DIR`)",
                                   description="Get the MiniMax-H3 model.")
    actions = parser.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    download = actions.add_parser(
        "download", help="download the official checkpoint from the Hugging Face hub (resumable, verified)",
        description=f"Download {OFFICIAL_REPO} into DIR with huggingface_hub: resumable (run it again after "
                    "Ctrl-C or a dropped connection), each file checked against the hub's SHA-256, the files "
                    "FL2VA and Ref2VA share stored once, free disk checked first, `verify` run at the end. "
                    "HF_ENDPOINT and HF_TOKEN are honoured as by `hf download`.")
    download.add_argument("directory", type=Path, metavar="DIR", help="the model folder to create or complete")
    download.add_argument("--partition", choices=PARTITION_CHOICES, default=ALL,
                          help=f"FL2VA (prompt-only and first/last-frame jobs; about {FL2VA_DOWNLOAD_GIB} GiB), Ref2VA "
                               f"(reference jobs; needs FL2VA; about {REF2VA_OWN_GIB} GiB more: its own transformer, "
                               f"the rest is FL2VA's files stored once), or all (default; about {ALL_DOWNLOAD_GIB} GiB)")
    download.add_argument("--revision", metavar="REV",
                          help=f"branch, tag or commit (default: {PINNED_REVISION!r}, or the commit an earlier run "
                               "into DIR started from)")
    download.add_argument("--repo", default=OFFICIAL_REPO, metavar="ORG/NAME",
                          help=f"hub repository (default {OFFICIAL_REPO}); repacks h3 cannot load are refused")
    download.add_argument("--quiet", action="store_true", help="no progress bars")
    download.set_defaults(handler=run_model_download)


def run_model_download(args: argparse.Namespace) -> int:
    from .engine import EXIT_CANCELLED, EXIT_OK
    try:
        result = download_model(args.directory, partition=args.partition, revision=args.revision,
                                repo_id=args.repo, progress=not args.quiet)
    except KeyboardInterrupt:
        print(f"h3bridge: interrupted; run `{download_command(args.directory, args.partition)}` again to continue "
              "(finished files and the partial one are kept)", file=sys.stderr)
        return EXIT_CANCELLED
    plan = result.plan
    print(f"downloaded {len(result.fetched)} file(s) of {len(plan.files)} into {plan.directory} "
          f"({plan.repo_id} commit {plan.commit}, {format_bytes(sum(f.size for f in plan.files))}); verified: "
          f"{result.report.table(words=cli_words).splitlines()[-1]}")      # type: ignore[attr-defined]
    return EXIT_OK
