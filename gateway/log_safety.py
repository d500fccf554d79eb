"""Client-supplied text in log lines: one line each, bounded, never able to forge another."""

from __future__ import annotations

# Longest piece of client text quoted in a log line.
LOG_TEXT_LIMIT = 200


def printable(text: str, limit: int = LOG_TEXT_LIMIT) -> str:
    """``text`` with control characters (CR, LF, ESC …) escaped and its length bounded."""
    clipped = text[:limit]
    if not clipped.isprintable():
        clipped = clipped.encode("unicode_escape").decode("ascii")
    return clipped + ("…" if len(text) > limit else "")
