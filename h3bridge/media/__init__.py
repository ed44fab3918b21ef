"""Media files: `decode` reads what h3 writes and what users give (PPM frames, MP4 video and audio,
probing with PyAV); `references` turns in-memory images, audio and video into reference files."""
