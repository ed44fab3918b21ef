"""The film a story assembles depends on its shots alone: the same shots give the same decoded
frames and audio samples in every process, whatever the process's heap held before.

libx264's macroblock tree read heap memory it never wrote on small canvases, so the film's pixels
depended on the allocator's leftovers (a parallel story's film differed from the serial one in
about one run in five). glibc's MALLOC_PERTURB_ fills every allocation with a chosen byte: run the
assembly under different fillings and a read of unwritten memory shows as a different film every
time, with no dependence on timing or on which run happens to hit it."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from h3bridge.geometry import SAMPLE_RATE
from h3bridge.story.mp4 import write_clip

from story_helpers import decode_film

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="MALLOC_PERTURB_ (the heap filling this test varies) is glibc's")

WIDTH, HEIGHT = 64, 32          # the suite's storyboard canvas, where the encoder's stray read showed
HEAP_FILLINGS = ("0", "1", "170")

ASSEMBLE = """
import json, sys
from pathlib import Path
from h3bridge.story.assemble import FilmPiece, assemble_film
spec = json.loads(sys.argv[1])
pieces = [FilmPiece(**{**piece, "video": Path(piece["video"])}) for piece in spec["pieces"]]
assemble_film(pieces, Path(spec["output"]), spec["width"], spec["height"])
"""


def moving_gradient(frames: int, phase: int) -> list[np.ndarray]:
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    return [np.stack([(x * 4 + t * 3 + phase) % 256, (y * 8 + t * 5) % 256, ((x + y) * 2 + t * 7) % 256],
                     axis=-1).astype(np.uint8) for t in range(frames)]


def tone(frames: int, pitch: float) -> np.ndarray:
    seconds = np.arange(round(frames * SAMPLE_RATE / 24)) / SAMPLE_RATE
    wave = (0.3 * np.sin(2 * np.pi * pitch * seconds)).astype(np.float32)
    return np.stack([wave, wave[::-1].copy()])


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Two shots, the second joined at an anchor (its first frame dropped) with a crossfade."""
    folder = tmp_path_factory.mktemp("film-shots")
    pieces = []
    for index, (frames, phase, pitch) in enumerate(((56, 0, 440.0), (22, 90, 660.0)), start=1):
        video = write_clip(folder / f"shot-{index}.mp4", iter(moving_gradient(frames, phase)), WIDTH, HEIGHT,
                           tone(frames, pitch))
        pieces.append({"index": index, "video": str(video), "frame_count": frames, "dropped": index - 1,
                       "crossfade_before": 0 if index == 1 else 4 * SAMPLE_RATE // 24, "title": f"Shot {index}"})
    return pieces


def test_the_film_is_the_same_whatever_the_heap_held(tmp_path: Path, shots: list[dict]) -> None:
    films = []
    for filling in HEAP_FILLINGS:
        output = tmp_path / f"film-{filling}.mp4"
        spec = {"pieces": shots, "output": str(output), "width": WIDTH, "height": HEIGHT}
        done = subprocess.run([sys.executable, "-c", ASSEMBLE, json.dumps(spec)], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "MALLOC_PERTURB_": filling})
        assert done.returncode == 0, done.stderr
        films.append(decode_film(output))
    frames, audio, _ = films[0]
    assert frames.shape == (56 + 21, HEIGHT, WIDTH, 3)
    for filling, (other_frames, other_audio, _) in zip(HEAP_FILLINGS[1:], films[1:]):
        differing = int(np.count_nonzero(np.any(other_frames != frames, axis=(1, 2, 3))))
        assert differing == 0, f"with the heap filled with {filling}, {differing} of {len(frames)} frames differ"
        assert np.array_equal(other_audio, audio)
