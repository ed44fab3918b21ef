"""The command line: every `h3bridge` subcommand's flags and the code that turns them into calls
of the library. This is the top layer: nothing else in h3bridge imports it, and no module outside
it uses argparse (tests/test_layers.py).

`main` (main.py) builds the parser from one module per command family: `engine` (the engine
choice and the options generate, story and serve share), `remote`, `library`, `story`, `serve`,
`model`, `history`, `lora`, `hexgrid`, `fleet`, `build` and `flags` (number flags through
safeio.numbers).
"""
from __future__ import annotations


def main(argv=None) -> int:
    from .main import main as run
    return run(argv)


__all__ = ["main"]
