"""Fault modes the fake upstream can inject (see tests/fakes/upstream.py for how to ask for them)."""

from __future__ import annotations

from enum import StrEnum


class Fault(StrEnum):
    RESET = "reset"
    """Headers and part of the body, then a TCP reset (RST) mid-body."""
    HALF_STREAM = "half_stream"
    """Headers and part of the body (a few SSE chunks, never [DONE]), then a clean close (FIN)."""
    STALL = "stall"
    """Headers and part of the body, then silence for `hang_seconds`, then the rest."""
    HANG = "hang"
    """Silence for `hang_seconds` before any byte, then the normal answer."""
    RATE_LIMITED = "429"
    """429 with `retry-after` and OpenAI's rate-limit body."""
    SERVER_ERROR = "500"
    """500 with OpenAI's server_error body."""
    BAD_GATEWAY = "502"
    """502 with the CDN's HTML page, as OpenAI's edge sends it."""
    OVERLOADED = "503"
    """503 with OpenAI's "overloaded" body."""
    OVERFLOW = "overflow"
    """The context-length 400 (in `overflow_style`) whatever the prompt size (chat completions only)."""
    TRUNCATE = "truncate"
    """Ollama-like: accept any size and report usage.prompt_tokens capped at `truncate_to` (chat only)."""


# Faults that replace the answer with an error before the request is even looked at.
ERROR_STATUS = frozenset({Fault.RATE_LIMITED, Fault.SERVER_ERROR, Fault.BAD_GATEWAY, Fault.OVERLOADED})
# Faults that change how the bytes of an otherwise normal answer are delivered.
DELIVERY = frozenset({Fault.RESET, Fault.HALF_STREAM, Fault.STALL, Fault.HANG})
# Delivery faults that interrupt the body halfway.
MID_BODY = frozenset({Fault.RESET, Fault.HALF_STREAM, Fault.STALL})
