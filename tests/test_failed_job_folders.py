"""A job that fails after its output folder was made leaves no folder it made, in every engine
(issue 34: the session engine kept the folders its failed job had created; the others removed them)."""
from __future__ import annotations

from pathlib import Path

import pytest

from h3bridge import MediaError, OneShotEngine, SessionEngine
import h3bridge.engines.job as job_module

from core_helpers import fast_request, model_dir, sim_engine_path  # noqa: F401 (model_dir: a fixture)


@pytest.mark.parametrize("engine_class", [OneShotEngine, SessionEngine])
def test_a_job_failing_at_publish_leaves_none_of_the_folders_it_made(engine_class, model_dir: Path,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_publish(*args, **kwargs):
        raise MediaError("the disk went away while publishing")       # after the folders and the staging file

    # every engine publishes through the job skeleton (engines/job.py run_job)
    monkeypatch.setattr(job_module, "finish_result", failing_publish)
    kept = tmp_path / "renders"
    kept.mkdir()
    output = kept / "new" / "deeper" / "clip.mp4"
    with engine_class(sim_engine_path(), model_dir) as engine:
        with pytest.raises(MediaError, match="disk went away"):
            engine.generate(fast_request(), output, want_frames=False)
    assert list(kept.iterdir()) == []          # "new/deeper" made by the job: gone; the user's folder stays
