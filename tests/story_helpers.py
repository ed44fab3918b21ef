"""Shared helpers for the storyboard tests: tiny stories, the CLI as a child process, and
decoding a film with PyAV."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np

from h3bridge.media.decode import decode_audio

# The cheapest canvas; shots as short as each continuation allows (a tail needs 56-frame shots).
CANVAS = "width = 64\nheight = 32\nsteps = 2\nseed = 11\n"
FOUR_SHOTS = CANVAS + '''
[[shot]]
prompt = "a lighthouse at dusk"
frames = 56

[[shot]]
prompt = "the camera climbs the stairs"
frames = 22
continue = "anchor"

[[shot]]
prompt = "the open sea"
frames = 56
continue = "cut"

[[shot]]
prompt = "waves break on the rocks"
frames = 56
continue = "tail"
'''


def write_story(folder: Path, text: str = FOUR_SHOTS, name: str = "story.toml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def story_argv(story: Path, film: Path, engine: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "h3bridge.cli", "story", str(story), "-o", str(film),
            f"--engine-path={engine}", f"--model-dir={model}", *extra]


def run_cli(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def decode_film(path: Path) -> tuple[np.ndarray, np.ndarray, list]:
    """(frames uint8 [F, H, W, 3], audio float32 [2, n], chapters) of an MP4."""
    frames = []
    with av.open(str(path)) as container:
        chapters = container.chapters()
        for frame in container.decode(container.streams.video[0]):
            frames.append(frame.to_ndarray(format="rgb24"))
    return np.stack(frames), decode_audio(path), chapters


def assert_same_film(path: Path, expected: tuple[np.ndarray, np.ndarray]) -> None:
    """The film at `path` decodes to exactly `expected` (frames uint8 [F, H, W, 3], audio float32 [2, n])."""
    frames, audio, _ = decode_film(path)
    assert frames.shape == expected[0].shape and np.array_equal(frames, expected[0])
    assert audio.shape == expected[1].shape and np.array_equal(audio, expected[1])
