"""Image sizes from header bytes, and the documented cost rules."""

from __future__ import annotations

import base64
import itertools
import math
import struct

import pytest

from gateway.tokens.encodings import profile_for
from gateway.tokens.images import (
    AREA_CLAUDE,
    PatchRule,
    TileRule,
    base64_image_size,
    data_url_image_size,
    image_size,
)
from tests.fakes.images import png


def gif(width: int, height: int) -> bytes:
    return b"GIF87a" + struct.pack("<HH", width, height) + b"\x00\x00\x00" + b";"


def jpeg(width: int, height: int, metadata: int = 0) -> bytes:
    """SOI, an APP1 segment of `metadata` bytes (EXIF-like), DQT, SOF0, SOS, EOI."""
    segments = b""
    remaining = metadata
    while remaining > 0:  # segments are at most 65533 bytes of payload
        size = min(remaining, 65533)
        segments += b"\xff\xe1" + struct.pack(">H", size + 2) + b"\0" * size
        remaining -= size
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + b"\0" * 65
    sof = (
        b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    )
    sos = b"\xff\xda" + struct.pack(">H", 12) + b"\0" * 10
    return b"\xff\xd8" + segments + dqt + b"\xff\xff" + sof + sos + b"\0\0\xff\xd9"


def webp_vp8(width: int, height: int) -> bytes:
    frame = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height) + b"\0" * 10
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(frame))
        + b"WEBP"
        + b"VP8 "
        + struct.pack("<I", len(frame))
        + frame
    )


def webp_vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    frame = b"\x2f" + bits.to_bytes(4, "little") + b"\0" * 8
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(frame))
        + b"WEBP"
        + b"VP8L"
        + struct.pack("<I", len(frame))
        + frame
    )


def webp_vp8x(width: int, height: int) -> bytes:
    frame = b"\x10\0\0\0" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(frame))
        + b"WEBP"
        + b"VP8X"
        + struct.pack("<I", len(frame))
        + frame
    )


@pytest.mark.parametrize("make", [png, gif, jpeg, webp_vp8, webp_vp8l, webp_vp8x])
@pytest.mark.parametrize(("width", "height"), [(1, 1), (1024, 768), (4000, 3000), (300, 9000)])
def test_sizes_from_headers(make: object, width: int, height: int) -> None:
    data = make(width, height)  # type: ignore[operator]
    assert image_size(data) == (width, height)
    assert base64_image_size(base64.b64encode(data).decode()) == (width, height)


def test_jpeg_size_after_large_metadata() -> None:
    data = jpeg(2000, 1000, metadata=200_000)  # frame header beyond the decoded head
    assert base64_image_size(base64.b64encode(data).decode()) == (2000, 1000)


def test_data_urls() -> None:
    url = "data:image/png;base64," + base64.b64encode(png(640, 480)).decode()
    assert data_url_image_size(url) == (640, 480)
    assert data_url_image_size("https://example.com/a.png") is None
    assert data_url_image_size("data:image/svg+xml,<svg/>") is None
    assert data_url_image_size("data:image/png;base64,!!!not base64!!!") is None


@pytest.mark.parametrize(
    "junk", [b"", b"hello world", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xd9", b"RIFF\0\0\0\0WEBPVP8 "]
)
def test_unreadable_headers(junk: bytes) -> None:
    assert image_size(junk) is None


GPT_4O = TileRule(base=85, tile=170)


@pytest.mark.parametrize(
    ("size", "detail", "tokens"),
    [
        ((1024, 1024), "high", 765),  # guide: 768×768, 4 tiles
        ((2048, 4096), "high", 1105),  # guide: 1024×2048 → 768×1536, 6 tiles
        ((4096, 8192), "low", 85),  # guide: low is fixed
        ((512, 512), "auto", 255),
        ((513, 500), "high", 425),
        ((128, 64), "high", 255),  # never scaled up
        ((2049, 513), "high", 1445),  # 2048×512.75 rounds to 513: 4×2 tiles
        ((2050, 513), "high", 765),  # 2048×512.5 rounds to 512: 4×1 tiles
        (None, "high", 1445),
        (None, "low", 85),
    ],
)
def test_tile_rule(size: tuple[int, int] | None, detail: str, tokens: int) -> None:
    assert GPT_4O.tokens(size, detail) == tokens


def test_tile_maximum_is_the_formulas_maximum() -> None:
    sides = [
        1,
        255,
        511,
        512,
        513,
        767,
        768,
        769,
        1023,
        1024,
        1025,
        1535,
        1536,
        1537,
        2047,
        2048,
        2049,
        3000,
        4096,
        9000,
    ]
    worst = max(GPT_4O.tokens(size, "high") for size in itertools.product(sides, sides))
    assert worst == GPT_4O.maximum() == 85 + 8 * 170
    assert GPT_4O.tokens((2048, 768), "high") == GPT_4O.maximum()


def test_patch_rule_examples() -> None:
    mini = PatchRule(1.62)
    assert mini.tokens((1024, 1024), "high") == math.ceil(1024 * 1.62)  # 32×32 patches
    assert mini.tokens((1800, 2400), "high") == math.ceil(1452 * 1.62)  # guide: shrunk to 33×44
    assert mini.tokens((1800, 2400), "low") == mini.tokens((1800, 2400), "high")
    assert mini.tokens(None, "auto") == mini.maximum() == math.ceil(1536 * 1.62)
    for size in [(100_000, 10), (10, 100_000), (5000, 5000), (1, 1)]:
        assert 1 <= mini.tokens(size, "high") <= mini.maximum()


def test_area_rule_for_claude() -> None:
    assert AREA_CLAUDE.tokens((1000, 1000), "auto") == math.ceil(1_000_000 / 750)
    assert AREA_CLAUDE.tokens((200, 200), "auto") == math.ceil(40_000 / 750)
    assert AREA_CLAUDE.tokens((3000, 2000), "auto") == 1600  # scaled down to the cap
    assert AREA_CLAUDE.tokens(None, "auto") == 1600


@pytest.mark.parametrize(
    ("model", "high_1024"),
    [
        ("gpt-4o", 765),
        ("openrouter/openai/gpt-4.1", 765),
        ("gpt-4o-mini", 2833 + 4 * 5667),
        ("o1", 75 + 4 * 150),
        ("gpt-4.1-mini", math.ceil(1024 * 1.62)),
        ("gpt-4.1-nano", math.ceil(1024 * 2.46)),
        ("o4-mini", math.ceil(1024 * 1.72)),
        ("claude-sonnet-4-5", math.ceil(1024 * 1024 / 750)),
    ],
)
def test_rule_per_model(model: str, high_1024: int) -> None:
    assert profile_for(model).image.tokens((1024, 1024), "high") == high_1024
