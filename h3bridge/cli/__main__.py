"""`python -m h3bridge.cli ...`, the same as `h3bridge ...` (older scripts and the docs' tests)."""
import sys

from .main import main

sys.exit(main())
