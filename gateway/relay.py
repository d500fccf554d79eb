"""Relaying a chat answer to the client, and reading what the gateway learns from it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import aiohttp
import orjson

from gateway.errors import error_body
from gateway.upstream import UpstreamReply, upstream_broken, upstream_timeout

# The usage chunk is the last data event before [DONE]: this much tail is enough to find it,
# and it spans at most a few of the upstream's chunks.
TAIL_BYTES = 4096
TAIL_CHUNKS = 4


def sse_error_event(message: str, code: str) -> bytes:
    """An OpenAI-style error event: the SDKs raise it as an APIError instead of hanging."""
    return b"data: " + error_body(message, type="server_error", code=code) + b"\n\n"


async def relay_sse(
    first_chunk: bytes,
    rest: AsyncIterator[bytes],
    *,
    idle_timeout: float,
    on_complete: Callable[[bytes], None],
) -> AsyncIterator[bytes]:
    """Yield the stream as it comes; a stalled or broken upstream ends it with an error event.

    ``on_complete`` receives the stream's tail once the upstream finished normally.
    """
    # The last few chunks, not a running copy of the tail: copying on every chunk costs more.
    recent: deque[bytes] = deque((first_chunk,), maxlen=TAIL_CHUNKS)
    yield first_chunk
    try:
        async for chunk in rest:
            recent.append(chunk)
            yield chunk
    except TimeoutError:
        yield sse_error_event(
            f"The upstream stream stalled for more than {idle_timeout:g} s or ran past the gateway's "
            "total time limit; the gateway closed it.",
            "upstream_idle_timeout",
        )
        return
    except aiohttp.ClientError:
        yield sse_error_event("The upstream connection broke in the middle of the stream.", "upstream_broken")
        return
    on_complete(b"".join(recent)[-TAIL_BYTES:])


async def first_chunk(reply: UpstreamReply, idle_timeout: float) -> tuple[bytes, AsyncGenerator[bytes, None]]:
    """The stream's first bytes (to look for an error event inside a 200) and the rest of it."""
    body = reply.iter_body(idle_timeout)
    try:
        first = await anext(body, b"")
    except TimeoutError:
        await body.aclose()
        # Nothing has reached the client yet: answer with a proper status, not an unhandled error.
        raise upstream_timeout(
            f"The upstream sent its response headers, then nothing for more than {idle_timeout:g} s."
        ) from None
    except aiohttp.ClientError as exc:
        await body.aclose()
        raise upstream_broken(
            f"The upstream connection broke before the stream's first event ({type(exc).__name__})."
        ) from None
    return first, body


def usage_from_json(body: bytes) -> object:
    """The ``usage`` member of a non-streamed answer (None if it has none)."""
    try:
        return orjson.loads(body).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return None


def prompt_tokens_from_sse_tail(tail: bytes) -> int | None:
    """``usage.prompt_tokens`` from the last usage-bearing event of a stream's tail."""
    for event in reversed(tail.split(b"\n\n")):
        line = event.strip()
        if not line.startswith(b"data:") or b'"usage"' not in line:
            continue
        try:
            usage = orjson.loads(line[5:]).get("usage")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        tokens = prompt_tokens(usage)
        if tokens is not None:
            return tokens
    return None


def prompt_tokens(usage: object) -> int | None:
    if isinstance(usage, dict):
        value = usage.get("prompt_tokens")
        if isinstance(value, int) and value >= 0:
            return value
    return None


async def cancel_safely(stream: AsyncGenerator[bytes, None]) -> None:
    """Close a body iterator we will not read to its end (closes the upstream connection)."""
    await asyncio.shield(stream.aclose())
