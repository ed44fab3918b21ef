"""h3-sim: a simulator of antirez's `h3` command line (h3.c at 8974cc0) for tests and CI.

It produces synthetic test patterns, never model output.
"""
