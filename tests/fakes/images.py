"""Tiny images whose headers state a size: what token counting reads of an image."""

from __future__ import annotations

import base64
import struct
import zlib


def png(width: int, height: int) -> bytes:
    """A valid PNG of the given size (one IDAT row: its pixels are never read for counting)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0"))
        + chunk(b"IEND", b"")
    )


def png_data_url(width: int, height: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(width, height)).decode()
