"""One serialisation of a request (issue 34): the job history's record, a story shot's manifest
record and a shot's key are made by request.request_fields, which reads the same for the same
request in every process (sets sorted, whatever the hash seed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from h3bridge.history.job import request_record
from h3bridge.request import GenerationRequest, Reference, ReferenceKind, SlowerPath, request_fields

_PRINT_FIELDS = """
import json
from pathlib import Path
from h3bridge.request import GenerationRequest, Reference, ReferenceKind, SlowerPath, request_fields
request = GenerationRequest("a fox", slower_paths=frozenset(SlowerPath),
                            references=(Reference(ReferenceKind.VIDEO_AUDIO, Path("/v.mp4"), Path("/a.wav")),))
print(json.dumps(request_fields(request)))
"""


def test_the_same_request_reads_the_same_under_every_hash_seed(tmp_path: Path) -> None:
    seen = set()
    for seed in range(8):      # frozenset iteration order follows the string hashes of this seed
        done = subprocess.run([sys.executable, "-c", _PRINT_FIELDS], capture_output=True, text=True, check=True,
                              cwd=tmp_path, env={**os.environ, "PYTHONHASHSEED": str(seed)})
        seen.add(done.stdout)
    assert len(seen) == 1, seen
    fields = json.loads(seen.pop())
    assert fields["slower_paths"] == sorted(path.value for path in SlowerPath)
    assert fields["references"] == [{"kind": "video_audio", "path": "/v.mp4", "audio_path": "/a.wav"}]


def test_every_field_is_kept_and_the_history_adds_the_frame_count() -> None:
    request = GenerationRequest("a fox", seconds=2.0, first_frame=Path("/f.png"))
    fields = request_fields(request)
    assert set(fields) == set(GenerationRequest.__dataclass_fields__)
    assert fields["first_frame"] == "/f.png" and fields["seconds"] == 2.0
    assert request_record(request) == {**fields, "frame_count": request.frame_count}
    assert request_fields(request, path_value=lambda path: {"p": path.name})["first_frame"] == {"p": "f.png"}
