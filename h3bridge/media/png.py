"""One picture as PNG bytes and back, in memory, through PyAV's png codec (previews sent over HTTP)."""
from __future__ import annotations

import av
import numpy as np

from ..errors import MediaError


def png_bytes(image: np.ndarray) -> bytes:
    """uint8 [H, W, 3] RGB -> a PNG file's bytes (lossless)."""
    pixels = np.ascontiguousarray(image, dtype=np.uint8)
    height, width = pixels.shape[:2]
    codec = av.CodecContext.create("png", "w")
    codec.width, codec.height, codec.pix_fmt = width, height, "rgb24"
    frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
    return b"".join(bytes(packet) for packet in [*codec.encode(frame), *codec.encode(None)])


def image_from_png(data: bytes) -> np.ndarray:
    """A PNG file's bytes -> uint8 [H, W, 3] RGB; MediaError for what is not a PNG picture."""
    codec = av.CodecContext.create("png", "r")
    try:
        frames = [*codec.decode(av.Packet(data)), *codec.decode(None)]
    except (av.FFmpegError, ValueError) as error:
        raise MediaError(f"not a PNG picture: {error}") from None
    if not frames:
        raise MediaError("not a PNG picture: nothing decoded")
    return frames[0].to_ndarray(format="rgb24")


__all__ = ["image_from_png", "png_bytes"]
