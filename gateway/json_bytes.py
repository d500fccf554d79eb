"""JSON bytes that are kept: in a buffer of their own size.

orjson (3.13) returns its output in the buffer it wrote into, reserved ahead for the worst
case: at least 4 KiB for any value, about 8 times the length of a long string. A request's
body is written once and let go, but what the conversation memories keep (each message's JSON:
`wire/incremental.py`, `tokens/prefixes.py`, `wire/responses_memory.py`) is weighed by its
length, and 60,000 short messages held 240 MiB where their length said 2 MiB. Kept JSON is
copied out once, into an exact buffer (a memcpy, much cheaper than the write).
"""

from __future__ import annotations

from typing import Any

import orjson


def exact(encoded: bytes) -> bytes:
    """`encoded` in a buffer of its own length (a new object: `bytes(b)` would return `b`)."""
    return bytes(memoryview(encoded))


def dumps_kept(value: Any) -> bytes:
    """`orjson.dumps(value)`, for bytes that outlive the request (raises what orjson raises)."""
    return exact(orjson.dumps(value))
