"""`python -m h3bridge ...`: the same command line as the `h3bridge` console script, for an
install that has no console scripts (ComfyUI's `pip install -r requirements.txt`)."""
import sys

from .cli.main import main

sys.exit(main())
