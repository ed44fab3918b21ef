"""`h3bridge lora fold -d MODEL_DIR --lora FILE[:STRENGTH] [--lora ...] -o OUT_DIR` (the model folder
may also come first, without -d, as before), `lora list` and `lora prune`."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from ..model.inventory import FL2VA, PARTITIONS, format_bytes
from ..errors import RequestError
from ..lora.cache import CACHE_FOLDER, DEFAULT_LIMIT, LIMIT_VARIABLE, cache_folder, cache_limit, list_folds, parse_size, prune
from ..lora.fold import NEAREST, ROUNDINGS, STOCHASTIC, LoraSpec, fold_model
from ..lora.layout import QKV_LAYOUTS
from ..model.fold_record import DISTILLED_STEPS
from ..fixes import said
from ..model.fold_survival import INT8_NOTE, format_report, warnings
from .engine import cli_words


class _Terminated(BaseException):
    """SIGTERM/SIGHUP during a fold: unwinds like Ctrl-C, so the temporary folder is removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def add_lora_command(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("lora", help="fold LoRAs into a copy of the model (h3 has no LoRA runtime)",
                                   description="LoRAs for h3, which has no LoRA runtime: fold them into a copy "
                                               "of the checkpoint.")
    commands = parser.add_subparsers(dest="lora_command", required=True, metavar="COMMAND")
    fold = commands.add_parser(
        "fold", help="write the model (-d) with LoRAs folded into its transformer, as a new model folder",
        description="Write a complete model folder at OUT_DIR: the transformer shards with the LoRAs folded in "
                    "(W' = W + strength * scale * up @ down in float64, the LoRA's flat qkv rows placed on the "
                    "per-head rows h3 reads, rounded to bf16 stochastically by default), every other "
                    "file cloned, hard-linked or copied, and a fold record that `h3bridge info` shows and "
                    "`h3bridge verify` checks. Ends with how much of the LoRA survived the rounding. Nothing "
                    "appears at OUT_DIR until the fold is complete.")
    from .engine import add_model_dir_argument      # -d/--model-dir, or the folder first as before
    add_model_dir_argument(fold, what="the base MiniMax-H3 model folder")
    fold.add_argument("--lora", dest="loras", action="append", required=True, metavar="FILE[:STRENGTH]",
                      help="a LoRA .safetensors and its strength (default 1.0); repeat for several, applied in order")
    fold.add_argument("-o", "--output", type=Path, required=True, metavar="OUT_DIR",
                      help="the folded model's folder (must not exist)")
    fold.add_argument("--partition", choices=[*PARTITIONS, "all"], default=FL2VA,
                      help=f"which checkpoint's transformer to fold into (default {FL2VA}, the one prompt and "
                           "first/last-frame jobs use; Ref2VA serves reference jobs)")
    distilled = fold.add_mutually_exclusive_group()
    distilled.add_argument("--distilled", dest="distilled", action="store_true", default=None,
                           help="record the LoRAs as step-distillation LoRAs (default: guessed from the names, "
                                "e.g. 'turbo'); requests on the folded model are then warned about --reuse and steps")
    distilled.add_argument("--not-distilled", dest="distilled", action="store_false")
    fold.add_argument("--qkv-layout", choices=QKV_LAYOUTS, default=None,
                      help="the row order of the LoRAs' attn.qkv_proj up/B: flat [Q|K|V] as ComfyUI, SGLang and "
                           "every published MiniMax-H3 LoRA have it (permuted to h3's per-head rows), or per-head "
                           "(made against the official checkpoint's bytes: added in place). Default: what the "
                           "LoRA's metadata says, else flat")
    fold.add_argument("--rounding", choices=ROUNDINGS, default=STOCHASTIC,
                      help=f"bf16 rounding of the folded weights: {STOCHASTIC} (default; unbiased, deterministic "
                           f"per fold) or {NEAREST} (loses most of a small update; the bytes of earlier versions)")
    fold.add_argument("--quiet", action="store_true", help="no progress bar")
    fold.add_argument("--json", action="store_true", help="print the fold record as JSON on stdout")
    fold.set_defaults(handler=run_fold)
    listing = commands.add_parser(
        "list", help="the folded models kept for ComfyUI's H3 LoRA node, with their size and last use",
        description="List the folds kept in a LoRA cache (.h3bridge-lora beside the base model), least recently "
                    "used first.")
    listing.add_argument("folders", type=Path, nargs="*", metavar="FOLDER",
                         help="a base model folder, the folder holding it (ComfyUI/models/h3), or the cache itself")
    listing.add_argument("-d", "--model-dir", type=Path, metavar="PATH",
                         help="the base model folder, as other commands take it (default, when no FOLDER is "
                              "given: $H3_MODEL_DIR)")
    listing.set_defaults(handler=run_list)
    prune = commands.add_parser(
        "prune", help="remove the least recently used folds from a LoRA cache",
        description="Remove least recently used folds until the cache takes at most --max-size (default: "
                    f"{LIMIT_VARIABLE} or {DEFAULT_LIMIT // 2**30}G). Folds are re-made on demand.")
    prune.add_argument("folders", type=Path, nargs="*", metavar="FOLDER",
                         help="a base model folder, the folder holding it (ComfyUI/models/h3), or the cache itself")
    prune.add_argument("-d", "--model-dir", type=Path, metavar="PATH",
                         help="the base model folder, as other commands take it (default, when no FOLDER is "
                              "given: $H3_MODEL_DIR)")
    prune.add_argument("--max-size", metavar="SIZE", help="e.g. 100G, or 0 to remove every fold")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    prune.set_defaults(handler=run_prune)


def existing_folder(folder: str | Path, command: str) -> Path:
    """`folder` as `lora list`/`lora prune` take it, only if it is an existing folder: a mistyped
    path is not an empty cache."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        what = "does not exist" if not os.path.lexists(path) else "is not a folder"
        raise RequestError(f"lora {command}: {path} {what}", field="FOLDER",
                           hint=f"give a fold cache folder ({CACHE_FOLDER}), the folder holding it (ComfyUI's models/h3) "
                                "or a base model folder")
    return path


def folders_from_args(args: argparse.Namespace, command: str) -> list[Path]:
    """FOLDER... and -d/--model-dir, else $H3_MODEL_DIR; each an existing folder (existing_folder)."""
    from ..engines.locate import MODEL_DIR_ENV
    given = [*args.folders, *([args.model_dir] if args.model_dir is not None else [])]
    if not given and os.environ.get(MODEL_DIR_ENV):
        given = [Path(os.environ[MODEL_DIR_ENV])]
    if not given:
        raise RequestError(f"lora {command}: no folder given", field="FOLDER",
                           hint=f"add -d PATH (the base model folder) or the fold cache folder, or set {MODEL_DIR_ENV}")
    return [existing_folder(folder, command) for folder in given]


def run_list(args: argparse.Namespace) -> int:
    from datetime import datetime
    for folder in folders_from_args(args, "list"):
        root = cache_folder(folder)
        folds = list_folds(root)
        print(f"{root}: {len(folds)} fold(s), {format_bytes(sum(f.size for f in folds))} on disk")
        for fold in folds:
            used = datetime.fromtimestamp(fold.last_used).isoformat(timespec="minutes")
            print(f"  {fold.path.name}  {format_bytes(fold.size):>10}  last used {used}  {', '.join(fold.loras)}")
    return 0


def run_prune(args: argparse.Namespace) -> int:
    limit = parse_size(args.max_size, what="--max-size") if args.max_size is not None else cache_limit()
    for folder in folders_from_args(args, "prune"):
        root = cache_folder(folder)
        removed = prune(root, limit if limit is not None else None, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        freed = format_bytes(sum(f.size for f in removed))
        print(f"{root}: {verb} {len(removed)} fold(s), {freed}")
        for fold in removed:
            print(f"  {fold.path.name}  {', '.join(fold.loras)}")
    return 0


def run_fold(args: argparse.Namespace) -> int:
    from .engine import model_dir_from_args
    model_dir = model_dir_from_args(args)
    partitions = list(PARTITIONS) if args.partition == "all" else [args.partition]
    specs = [LoraSpec.parse(text) for text in args.loras]

    def terminate(signum: int, frame: object) -> None:
        raise _Terminated(signum)

    previous = {signum: signal.signal(signum, terminate) for signum in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        result = fold_model(model_dir, specs, args.output, partitions=partitions, distilled=args.distilled,
                            progress=False if args.quiet else None, qkv_layout=args.qkv_layout,
                            rounding=args.rounding)
    except _Terminated as stop:
        print(f"h3bridge: fold stopped ({signal.Signals(stop.signum).name}); nothing was written", file=sys.stderr)
        return 128 + stop.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    record = result.provenance
    if args.json:
        print(json.dumps(record.to_dict(), indent=1))
    placed = ", ".join(f"{count} {how}" for how, count in sorted(result.placed.items())) or "none"
    print(f"wrote {result.output}: {result.tensors} tensors ({format_bytes(result.targeted_bytes)}) folded in "
          f"{len(record.folded_files)} shard(s), other files: {placed}; {result.seconds:.1f} s", file=sys.stderr)
    print(record.summary(cli_words).split("\n  what survived")[0], file=sys.stderr)
    print(format_report(result.survival, record.rounding), file=sys.stderr)
    for warning in warnings(result.survival, record.rounding):
        print(f"h3bridge: warning: {said(warning, cli_words)}", file=sys.stderr)
    print(f"h3bridge: note: {INT8_NOTE}", file=sys.stderr)
    if record.distilled:
        from ..runnable import h3bridge_command      # as it runs here (console script or python -m)
        sample = h3bridge_command("generate", "-d", result.output, "--preset", "turbo", "-p", "PROMPT")
        print(f"h3bridge: sample it with `{sample}` (--steps "
              f"{DISTILLED_STEPS[0]} or {DISTILLED_STEPS[1]}, no --reuse/--core-reuse)", file=sys.stderr)
    return 0
