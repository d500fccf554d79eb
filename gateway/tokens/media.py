"""Token cost of non-image attachments: `input_audio` clips and PDF files.

Audio: OpenAI bills user audio at 1 token per 100 ms (Realtime API guide;
consistent with the launch price of $100/1M audio tokens ≈ $0.06/minute). The
duration comes from the WAV header, or from the MP3 frame header (bitrate, or
the frame count of a Xing VBR header). When neither can be read, the clip is
assumed to be encoded at 8 kbit/s, the lowest MPEG audio bitrate, so the
duration — and the count — is an over-estimate rather than an under-estimate.

PDF: OpenAI puts both the extracted text and an image of every page into the
context (file inputs guide). Each page is counted as the model's unknown-size
image figure plus `PDF_PAGE_TEXT_TOKENS`, a conservative allowance for a dense
page of prose (~600–800 tokens). Pages are counted from the `/Type /Page`
objects; PDFs that hide them in compressed object streams fall back to one
page per 50 KB. A file referenced only by `file_id` cannot be seen from here:
it counts as one page, and an upstream overflow teaches the real size.
"""

from __future__ import annotations

import math
import re
import struct
from typing import Final

from gateway.tokens.payloads import decode_base64, decoded_length

AUDIO_TOKENS_PER_SECOND: Final = 10
_FALLBACK_BITS_PER_SECOND: Final = 8_000
_HEAD_CHARS: Final = 4096

PDF_PAGE_TEXT_TOKENS: Final = 1000
_PDF_BYTES_PER_PAGE_FALLBACK: Final = 50_000
_PDF_PAGE: Final = re.compile(rb"/Type\s*/Page(?![A-Za-z])")

# MPEG audio layer III tables (ISO 11172-3 / 13818-3), kbit/s and Hz.
_MP3_BITRATES: Final = {
    1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MP3_SAMPLE_RATES: Final = {1: (44100, 48000, 32000), 2: (22050, 24000, 16000), 25: (11025, 12000, 8000)}


def audio_tokens(payload: str, audio_format: str) -> int:
    """Tokens for a base64 `input_audio` clip in `wav` or `mp3` format."""
    total = decoded_length(payload)
    head = decode_base64(payload[:_HEAD_CHARS])
    seconds = _wav_seconds(head, total) if audio_format == "wav" else _mp3_seconds(head, total)
    if seconds is None:
        seconds = total * 8 / _FALLBACK_BITS_PER_SECOND
    return math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)


def _wav_seconds(head: bytes, total: int) -> float | None:
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    byte_rate = 0
    position = 12
    while position + 8 <= len(head):
        chunk, size = head[position : position + 4], struct.unpack("<I", head[position + 4 : position + 8])[0]
        if chunk == b"fmt " and position + 20 <= len(head):
            (byte_rate,) = struct.unpack("<I", head[position + 16 : position + 20])
        elif chunk == b"data":
            # Streaming writers leave the size at 0 or 0xFFFFFFFF: use the rest.
            remaining = total - position - 8
            data_size = size if 0 < size <= remaining else remaining
            return data_size / byte_rate if byte_rate else None
        position += 8 + size + (size & 1)
    # The next chunk header lies beyond the decoded head (large metadata
    # chunks): everything from there on at the header's byte rate is an
    # upper bound on the audio data.
    return max(0, total - position - 8) / byte_rate if byte_rate else None


def _mp3_seconds(head: bytes, total: int) -> float | None:
    offset = 0
    if head[:3] == b"ID3" and len(head) >= 10:
        syncsafe = head[6:10]
        offset = 10 + ((syncsafe[0] << 21) | (syncsafe[1] << 14) | (syncsafe[2] << 7) | syncsafe[3])
    if offset + 4 > len(head) or head[offset] != 0xFF or head[offset + 1] & 0xE0 != 0xE0:
        return None
    version = {3: 1, 2: 2, 0: 25}.get((head[offset + 1] >> 3) & 3)
    is_layer3 = (head[offset + 1] >> 1) & 3 == 1
    bitrate_index, rate_index = head[offset + 2] >> 4, (head[offset + 2] >> 2) & 3
    if version is None or not is_layer3 or rate_index == 3 or bitrate_index in (0, 15):
        return None
    sample_rate = _MP3_SAMPLE_RATES[version][rate_index]
    frames = _xing_frames(head[offset : offset + 200])
    if frames is not None:
        samples_per_frame = 1152 if version == 1 else 576
        return frames * samples_per_frame / sample_rate
    kbps = _MP3_BITRATES[1 if version == 1 else 2][bitrate_index]
    return (total - offset) * 8 / (kbps * 1000)


def _xing_frames(frame: bytes) -> int | None:
    """Frame count of a VBR file's Xing header (its first-frame bitrate is meaningless)."""
    for tag in (b"Xing", b"Info"):
        at = frame.find(tag)
        if at >= 0 and at + 12 <= len(frame):
            (flags,) = struct.unpack(">I", frame[at + 4 : at + 8])
            if flags & 1:
                return int(struct.unpack(">I", frame[at + 8 : at + 12])[0])
    return None


def pdf_pages(payload: str) -> int:
    """Page count of a base64 PDF (see the module docstring for the fallback)."""
    data = decode_base64(payload)
    pages = len(_PDF_PAGE.findall(data))
    return pages or max(1, math.ceil(len(data) / _PDF_BYTES_PER_PAGE_FALLBACK))


def pdf_tokens(pages: int, page_image_tokens: int) -> int:
    return pages * (page_image_tokens + PDF_PAGE_TEXT_TOKENS)
