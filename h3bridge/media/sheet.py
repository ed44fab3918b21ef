"""A contact sheet: a few frames of each take side by side, one row per take, each row labelled
with its take number and seed, as an RGB picture (numpy only; media/png.py writes it). A take the
film uses (a storyboard's pick) is labelled "picked" in the accent colour and framed in it.

No library h3bridge depends on draws text (no Pillow; PyAV and numpy do not), so the labels are
drawn from the small bitmap font below: 5x7 glyphs for the characters a label uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MediaError

# 5 columns x 7 rows per glyph, '#' is ink. Only what labels say: "shot 2  take 12  seed 4242  picked".
_GLYPH_ROWS: dict[str, tuple[str, ...]] = {
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("####.", "....#", "....#", ".###.", "....#", "....#", "####."),
    "4": ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    "5": ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    "6": (".###.", "#....", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "....#", ".###."),
    "t": (".#...", ".#...", "####.", ".#...", ".#...", ".#..#", "..##."),
    "a": (".....", ".....", ".###.", "....#", ".####", "#...#", ".####"),
    "k": ("#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#."),
    "e": (".....", ".....", ".###.", "#...#", "#####", "#....", ".###."),
    "s": (".....", ".....", ".####", "#....", ".###.", "....#", "####."),
    "d": ("....#", "....#", ".##.#", "#..##", "#...#", "#...#", ".####"),
    "h": ("#....", "#....", "#.##.", "##..#", "#...#", "#...#", "#...#"),
    "o": (".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."),
    "p": (".....", "####.", "#...#", "#...#", "####.", "#....", "#...."),
    "i": ("..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."),
    "c": (".....", ".....", ".####", "#....", "#....", "#....", ".####"),
    " ": (".....",) * 7,
}
GLYPHS: dict[str, np.ndarray] = {
    char: np.array([[cell == "#" for cell in row] for row in rows], bool) for char, rows in _GLYPH_ROWS.items()}
GLYPH_WIDTH, GLYPH_HEIGHT = 5, 7

FRAMES_PER_TAKE = 4             # first, two between, last: how a take moves, at a glance
THUMB_WIDTH = 192               # pixels per frame on the sheet (frames are scaled down to it, never up)
LABEL_SCALE = 2                 # each font pixel drawn 2x2: legible beside 192-pixel frames
GAP = 4
BACKGROUND = np.array([24, 24, 28], np.uint8)
INK = np.array([235, 235, 235], np.uint8)
ACCENT = np.array([255, 176, 32], np.uint8)     # the picked take: its label and a frame around its row
PICKED_WORD = "picked"


@dataclass(frozen=True)
class SheetRow:
    """One take on the sheet: its number (1-based), seed and a few frames (uint8 [H, W, 3] each)."""

    take: int
    seed: int
    frames: tuple[np.ndarray, ...]
    shot: int | None = None          # a storyboard's takes: the shot they are of
    picked: bool = False             # the take the film uses (a storyboard shot's pick)


def label_text(take: int, seed: int, shot: int | None = None, picked: bool = False) -> str:
    return (f"shot {shot}  " if shot is not None else "") + f"take {take}  seed {seed}" + \
        (f"  {PICKED_WORD}" if picked else "")


def draw_text(text: str, scale: int = LABEL_SCALE) -> np.ndarray:
    """bool [7*scale, (6*len-1)*scale]: `text` in the bitmap font (one blank column between glyphs)."""
    missing = sorted({char for char in text if char not in GLYPHS})
    if missing:
        raise MediaError(f"the contact sheet's font has no glyph for {''.join(missing)!r}")
    width = max(0, len(text) * (GLYPH_WIDTH + 1) - 1)
    mask = np.zeros((GLYPH_HEIGHT, width), bool)
    for position, char in enumerate(text):
        left = position * (GLYPH_WIDTH + 1)
        mask[:, left:left + GLYPH_WIDTH] = GLYPHS[char]
    return np.kron(mask, np.ones((scale, scale), bool)).astype(bool)


def frame_indices(frame_count: int, count: int = FRAMES_PER_TAKE) -> list[int]:
    """`count` frames spread evenly from the first to the last (fewer when the clip is shorter)."""
    if frame_count <= 0:
        return []
    if frame_count <= count:
        return list(range(frame_count))
    return sorted({round(i * (frame_count - 1) / (count - 1)) for i in range(count)})


def thumbnail(frame: np.ndarray, width: int = THUMB_WIDTH) -> np.ndarray:
    """`frame` scaled down to `width` pixels wide by averaging whole-pixel boxes (a smaller frame is kept)."""
    height_in, width_in = frame.shape[:2]
    factor = max(1, -(-width_in // width))      # the smallest whole box that fits the width
    if factor == 1:
        return np.ascontiguousarray(frame, np.uint8)
    rows, cols = height_in // factor, width_in // factor
    boxes = frame[:rows * factor, :cols * factor].reshape(rows, factor, cols, factor, 3).astype(np.float32)
    return np.rint(boxes.mean(axis=(1, 3))).astype(np.uint8)


def contact_sheet(rows: list[SheetRow]) -> np.ndarray:
    """uint8 [H, W, 3]: per take a label line ("take 2  seed 43") over its frames, left to right."""
    if not rows:
        raise MediaError("a contact sheet needs at least one take")
    thumbs = [[thumbnail(frame) for frame in row.frames] for row in rows]
    cell_h = max(thumb.shape[0] for row in thumbs for thumb in row) if any(thumbs) else 0
    cell_w = max(thumb.shape[1] for row in thumbs for thumb in row) if any(thumbs) else 0
    labels = [draw_text(label_text(row.take, row.seed, row.shot, row.picked)) for row in rows]
    columns = max(len(row) for row in thumbs)
    label_h = GLYPH_HEIGHT * LABEL_SCALE
    width = GAP + max(columns * (cell_w + GAP), max(label.shape[1] for label in labels) + GAP)
    row_h = label_h + GAP + cell_h + GAP
    sheet = np.empty((GAP + len(rows) * row_h, width, 3), np.uint8)
    sheet[:] = BACKGROUND
    for number, (row, row_thumbs, label) in enumerate(zip(rows, thumbs, labels)):
        top = GAP + number * row_h
        if row.picked:          # a frame in the gap around the whole row (the gaps are GAP wide)
            bottom, right = top + row_h - GAP, GAP + max(len(row_thumbs) * (cell_w + GAP) - GAP, label.shape[1])
            sheet[top - GAP:bottom + GAP, 0:right + GAP] = ACCENT
            sheet[top - GAP // 2:bottom + GAP // 2, GAP // 2:right + GAP // 2] = BACKGROUND
        region = sheet[top:top + label_h, GAP:GAP + label.shape[1]]
        region[label] = ACCENT if row.picked else INK
        for column, thumb in enumerate(row_thumbs):
            y, x = top + label_h + GAP, GAP + column * (cell_w + GAP)
            sheet[y:y + thumb.shape[0], x:x + thumb.shape[1]] = thumb
    return sheet


__all__ = ["ACCENT", "FRAMES_PER_TAKE", "PICKED_WORD", "SheetRow", "contact_sheet", "draw_text", "frame_indices", "label_text", "thumbnail"]
