"""Token cost of an image: its size from the header bytes, then the model's rule.

Sizes are read from PNG, GIF, WebP and JPEG headers in pure Python (no
Pillow): only the first bytes of a base64 payload are decoded, except for
JPEGs whose size marker comes after the metadata segments.

Rules (OpenAI's vision guide, "Calculating costs"; Anthropic's vision guide):

- Tiles (gpt-4o family): `detail: low` costs the base. Otherwise (`high`, and
  `auto`, counted as high to stay on the safe side) the image is scaled to fit
  2048×2048, then scaled so its shortest side is at most 768 (never up), then
  covered by 512px tiles: `base + tile × tiles`. Example: 1024×1024 → 768×768
  → 4 tiles → 85 + 4×170 = 765; 2048×4096 → 1024×2048 → 768×1536 → 6 tiles →
  1105.
- Patches (gpt-4.1-mini/nano, gpt-5-mini/nano, o4-mini): 32px patches; above
  1536 patches the image is shrunk to fit, then the count is multiplied by a
  per-model factor. `detail` does not change the count.
- Area (Claude): ⌈width × height / 750⌉ after scaling the long edge to ≤1568,
  and at most ~1600 tokens (larger images are scaled down to that).

Unknown size (a remote URL, an unreadable header): the largest figure the
rule can give. For tiles that is 8 tiles — after the two scalings the short
side is ≤768 (2 tiles) and the long side ≤2048 (4 tiles), e.g. 2048×768 — so
85 + 8×170 = 1445 for gpt-4o. Patches: 1536 × multiplier. Area: 1600.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Final

from gateway.tokens.payloads import decode_base64, split_data_url

Size = tuple[int, int]

_MAX_SIDE: Final = 2048
_SHORT_SIDE: Final = 768
_TILE_SIDE: Final = 512
_MAX_TILES: Final = math.ceil(_SHORT_SIDE / _TILE_SIDE) * math.ceil(_MAX_SIDE / _TILE_SIDE)

_PATCH_SIDE: Final = 32
_PATCH_CAP: Final = 1536


@dataclass(frozen=True, slots=True)
class TileRule:
    base: int
    tile: int

    def tokens(self, size: Size | None, detail: str) -> int:
        if detail == "low":
            return self.base
        if size is None:
            return self.maximum()
        width, height = (float(side) for side in size)
        if max(width, height) > _MAX_SIDE:
            scale = _MAX_SIDE / max(width, height)
            width, height = round(width * scale), round(height * scale)
        if min(width, height) > _SHORT_SIDE:
            scale = _SHORT_SIDE / min(width, height)
            width, height = round(width * scale), round(height * scale)
        tiles = math.ceil(width / _TILE_SIDE) * math.ceil(height / _TILE_SIDE)
        return self.base + self.tile * max(1, tiles)

    def maximum(self) -> int:
        return self.base + self.tile * _MAX_TILES


@dataclass(frozen=True, slots=True)
class PatchRule:
    multiplier: float

    def tokens(self, size: Size | None, detail: str) -> int:
        patches = _PATCH_CAP if size is None else _patches(*size)
        return math.ceil(patches * self.multiplier)

    def maximum(self) -> int:
        return math.ceil(_PATCH_CAP * self.multiplier)


def _patches(width: int, height: int) -> int:
    patches = math.ceil(width / _PATCH_SIDE) * math.ceil(height / _PATCH_SIDE)
    if patches <= _PATCH_CAP:
        return max(1, patches)
    # Shrink to the cap's area, then a little more so whole patches cover the
    # tighter side (the guide's 1800×2400 example gives 33×44 = 1452).
    shrink = math.sqrt(_PATCH_CAP * _PATCH_SIDE**2 / (width * height))
    w1, h1 = width * shrink / _PATCH_SIDE, height * shrink / _PATCH_SIDE
    fits = [math.floor(side) / side for side in (w1, h1) if side >= 1]
    refit = min(fits, default=1.0)
    # Rounded before ceil: w1 * (floor(w1) / w1) may land a hair above floor(w1).
    return min(_PATCH_CAP, math.ceil(round(w1 * refit, 6)) * math.ceil(round(h1 * refit, 6)))


@dataclass(frozen=True, slots=True)
class AreaRule:
    pixels_per_token: int
    max_long_edge: int
    max_tokens: int

    def tokens(self, size: Size | None, detail: str) -> int:
        if size is None:
            return self.max_tokens
        width, height = size
        scale = min(1.0, self.max_long_edge / max(width, height, 1))
        area = (width * scale) * (height * scale)
        return max(1, min(self.max_tokens, math.ceil(area / self.pixels_per_token)))

    def maximum(self) -> int:
        return self.max_tokens


ImageRule = TileRule | PatchRule | AreaRule

AREA_CLAUDE: Final = AreaRule(pixels_per_token=750, max_long_edge=1568, max_tokens=1600)


# --- sizes from header bytes ------------------------------------------------

_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"
# Start-of-frame markers carry the size; C4 (DHT), C8 (JPG) and CC (DAC) do not.
_JPEG_SOF: Final = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_NO_LENGTH: Final = frozenset({0x01, 0xD8, *range(0xD0, 0xD8)})
# Enough for every format except JPEGs with large EXIF/ICC segments.
_HEAD_BYTES: Final = 64 * 1024


def image_size(data: bytes) -> Size | None:
    """Width and height from the first bytes of a PNG, GIF, WebP or JPEG."""
    if data.startswith(_PNG_SIGNATURE) and data[12:16] == b"IHDR" and len(data) >= 24:
        return _positive(struct.unpack(">II", data[16:24]))
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return _positive(struct.unpack("<HH", data[6:10]))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _positive(size: tuple[int, ...]) -> Size | None:
    width, height = size
    return (width, height) if width > 0 and height > 0 else None


def _webp_size(data: bytes) -> Size | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a" and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return _positive((width & 0x3FFF, height & 0x3FFF))
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return ((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(data) >= 30:
        return (int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1)
    return None


def _jpeg_size(data: bytes) -> Size | None:
    index = 2
    while index + 1 < len(data):
        if data[index] != 0xFF:
            return None
        while index < len(data) and data[index] == 0xFF:  # fill bytes
            index += 1
        if index + 2 >= len(data):
            return None
        marker = data[index]
        index += 1
        if marker in _JPEG_NO_LENGTH:
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan: no frame header seen
            return None
        (length,) = struct.unpack(">H", data[index : index + 2])
        if marker in _JPEG_SOF:
            if index + 7 > len(data):
                return None
            height, width = struct.unpack(">HH", data[index + 3 : index + 7])
            return _positive((width, height))
        index += length
    return None


def base64_image_size(payload: str) -> Size | None:
    """Size of a base64-encoded image, decoding only what the header needs."""
    head_chars = _HEAD_BYTES // 3 * 4
    size = image_size(decode_base64(payload[:head_chars]))
    if size is None and len(payload) > head_chars:
        # A JPEG whose frame header sits after large metadata segments, or a
        # prefix that did not decode on its own (line breaks in the payload).
        size = image_size(decode_base64(payload))
    return size


def data_url_image_size(url: str) -> Size | None:
    """Size of the image in a `data:<mime>;base64,<payload>` URL; None otherwise."""
    parts = split_data_url(url)
    return None if parts is None else base64_image_size(parts[1])
