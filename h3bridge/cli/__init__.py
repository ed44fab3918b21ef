"""The command line: every `h3bridge` subcommand's flags and the code that turns them into calls
of the library. This is the top layer: nothing else in h3bridge imports it, and no module outside
it uses argparse (tests/test_layers.py).

`main` (main.py) builds the parser from one module per command family: `engine` (the engine
choice and the options generate, story and serve share), `remote`, `library`, `story`, `serve`,
`model`, `history`, `lora`, `hexgrid`, `fleet`, `build` and `flags` (number flags through
safeio.numbers).
"""
from __future__ import annotations

# Bound here at import, not by a lazy wrapper: importing the submodule `h3bridge.cli.main` sets the
# package's attribute `main` to that module, so a wrapper defined here would be replaced by the
# module as soon as anything imported `h3bridge.cli.main` first (`from h3bridge.cli import main`
# then gave a module, not the command).
from .main import main


__all__ = ["main"]
