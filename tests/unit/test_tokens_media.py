"""Audio durations and PDF page counts."""

from __future__ import annotations

import base64
import math
import struct

import pytest

from gateway.tokens.media import PDF_PAGE_TEXT_TOKENS, audio_tokens, pdf_pages, pdf_tokens


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wav(
    seconds: float, rate: int = 24_000, channels: int = 1, data_size: int | None = None, pad: int = 0
) -> bytes:
    byte_rate = rate * channels * 2
    data = b"\0" * int(seconds * byte_rate)
    fmt = struct.pack("<HHIIHH", 1, channels, rate, byte_rate, channels * 2, 16)
    extra = b"LIST" + struct.pack("<I", pad) + b"\0" * pad if pad else b""
    size = len(data) if data_size is None else data_size
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + extra + b"data" + struct.pack("<I", size) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


@pytest.mark.parametrize(
    ("seconds", "rate", "channels"), [(1.0, 16_000, 1), (3.5, 24_000, 1), (2.0, 44_100, 2)]
)
def test_wav_duration(seconds: float, rate: int, channels: int) -> None:
    assert audio_tokens(b64(wav(seconds, rate, channels)), "wav") == math.ceil(seconds * 10)


def test_streaming_wav_without_data_size() -> None:
    assert audio_tokens(b64(wav(2.0, data_size=0xFFFFFFFF)), "wav") == 20


def test_wav_with_data_beyond_the_decoded_head() -> None:
    assert audio_tokens(b64(wav(2.0, pad=10_000)), "wav") == 20


def mp3_frame_header(bitrate_index: int, mpeg1: bool = True) -> bytes:
    version_bits = 0b11 if mpeg1 else 0b10
    second = 0xE0 | (version_bits << 3) | (0b01 << 1) | 1  # layer III, no CRC
    return bytes([0xFF, second, (bitrate_index << 4) | (0 << 2), 0xC0])


def test_mp3_cbr_duration_from_bitrate() -> None:
    id3 = b"ID3\x04\x00\x00" + bytes([0, 0, 0, 20]) + b"\0" * 20
    clip = id3 + mp3_frame_header(9) + b"\0" * (160_000 - 4)  # 128 kbit/s, 160 KB of frames
    assert audio_tokens(b64(clip), "mp3") == math.ceil(160_000 * 8 / 128_000 * 10)


def test_mp3_vbr_duration_from_xing_frames() -> None:
    xing = b"Xing" + struct.pack(">II", 1, 1000)  # 1000 frames × 1152 samples at 44.1 kHz
    clip = mp3_frame_header(9) + b"\0" * 32 + xing + b"\0" * 50_000
    assert audio_tokens(b64(clip), "mp3") == math.ceil(1000 * 1152 / 44_100 * 10)


def test_unreadable_audio_assumes_the_lowest_bitrate() -> None:
    junk = b"\x01" * 10_000
    assert audio_tokens(b64(junk), "mp3") == math.ceil(10_000 * 8 / 8_000 * 10)
    assert audio_tokens(b64(junk), "wav") == math.ceil(10_000 * 8 / 8_000 * 10)


def test_pdf_pages() -> None:
    pdf = b"%PDF-1.7\n<</Type /Pages /Count 3>>" + b"<</Type /Page>>" * 2 + b"<</Type/Page/Parent 1 0 R>>"
    assert pdf_pages(b64(pdf)) == 3
    compressed = b"%PDF-1.7\n" + b"\x9c" * 120_000  # page objects hidden in object streams
    assert pdf_pages(b64(compressed)) == 3  # one page per 50 KB
    assert pdf_tokens(2, 1445) == 2 * (1445 + PDF_PAGE_TEXT_TOKENS)
