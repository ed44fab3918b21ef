"""The job history: every job any engine runs, in one SQLite file (WAL) in h3bridge's cache directory.

- `store.py`: the file (`history.sqlite` in `userdirs.cache_dir()`, or `$H3BRIDGE_HISTORY_PATH`;
  empty turns it off), its schema, and `HistoryUnavailable` for a broken or locked file.
- `job.py`: what a row says about a job: the device (name, memory), the shape, the request.
- `recorder.py`: `recorded(name)`, the decorator every engine's `generate` wears. That is the
  one line a new engine adds:

      @recorded("remote")      # the job history (history/recorder.py)
      def generate(self, request, output=None, *, ...): ...

  (an engine whose jobs run on another machine also defines `history_device()`, see recorder.py).
- `eta.py`: seconds left from past runs of the same shape on this machine (`ProgressEvent.eta`).
- `stats.py`: per-device, per-shape phase timings (median and range).
- the commands `h3bridge history` and `h3bridge stats` are cli/history.py.

A broken or locked history never fails a render: the job runs unrecorded, with one warning.
"""
from __future__ import annotations

from .job import Device, local_device, shape_key
from .recorder import recorded
from .store import HistoryStore, HistoryUnavailable, JobRow, history_path

__all__ = ["Device", "local_device", "shape_key", "recorded", "HistoryStore", "HistoryUnavailable", "JobRow",
           "history_path"]
