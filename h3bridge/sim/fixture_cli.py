"""`h3-sim-model`: write the fixture model (fixture.py) and, on request, a demo LoRA for it
(fixture_lora.py). The command lives above both so neither imports the other's caller."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from .fixture import fixture_size_note, write_fixture_model
from .fixture_lora import write_fixture_lora


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="h3-sim-model",
        description="Write a MiniMax-H3 model directory with the official layout (fake weights) "
                    "for h3-sim and tests.")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--realistic", action="store_true",
                        help="released tensor shapes as sparse files (full nominal size, no disk used)")
    parser.add_argument("--no-ref2va", dest="ref2va", action="store_false",
                        help="leave out the optional Ref2VA partition")
    parser.add_argument("--lora", type=Path, metavar="FILE",
                        help="also write a small demo LoRA for the (tiny) model at FILE, in the flat qkv layout of "
                             "published MiniMax-H3 LoRAs, to try `h3bridge lora fold` on")
    args = parser.parse_args(argv)
    if args.lora is not None and args.realistic:
        parser.error("--lora writes a LoRA for the tiny model; leave out --realistic")
    root = write_fixture_model(args.directory, realistic=args.realistic, ref2va=args.ref2va)
    print(f"wrote {root} ({fixture_size_note(root)})")
    if args.lora is not None:
        from ..runnable import h3bridge_command
        fold = h3bridge_command("lora", "fold", "-d", root, "--lora", args.lora, "-o", f"{root}-folded")
        print(f"wrote {write_fixture_lora(args.lora)} (a demo LoRA: try `{fold}`)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
