"""Inline binary payloads: `data:` URLs and base64 text, decoded leniently."""

from __future__ import annotations

import binascii


def split_data_url(url: str) -> tuple[str, str] | None:
    """`data:<mime>;base64,<payload>` → (mime, payload); None for anything else."""
    if not url.startswith("data:"):
        return None
    header, _, payload = url.partition(",")
    if not header.endswith(";base64"):
        return None
    return header[5:-7].lower(), payload


def decode_base64(text: str) -> bytes:
    """Decoded bytes, or b"" when the text is not valid base64 as given.

    A prefix cut at a multiple of 4 characters decodes on its own, which is
    how callers read a header without decoding a multi-megabyte payload.
    """
    try:
        return binascii.a2b_base64(text)
    except (binascii.Error, ValueError):
        return b""


def decoded_length(payload: str) -> int:
    """Byte length of a base64 payload without decoding it."""
    return len(payload) * 3 // 4 - payload[-2:].count("=")
