"""`python -m h3bridge.sim ...` is `h3-sim ...`: for a checkout whose console scripts were never
installed (ComfyUI's `pip install -r requirements.txt`; bin/h3-sim runs this)."""
import sys

from .cli import main

sys.exit(main())
