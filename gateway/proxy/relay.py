"""Relaying an answer to the client, and reading what the gateway learns from it.

Any of the three prompt APIs: usage is `prompt_tokens` (chat completions), `input_tokens`
(Responses: cached tokens included) or `input_tokens` + `cache_creation_input_tokens` +
`cache_read_input_tokens` (Anthropic: cached tokens reported apart), at the top of a body
or event or inside its `message` (Anthropic's message_start) or `response` (Responses).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

import aiohttp
import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import error_body
from gateway.proxy.upstream import UpstreamReply, upstream_broken, upstream_timeout

# What a finished stream hands on: its last TAIL_BYTES, reaching back to where the event they
# start inside begins. The usage is in the last events (before [DONE] in chat completions); the
# Responses API's last event echoes the whole response, tools and instructions included, so it
# can be far longer than TAIL_BYTES. At most TAIL_LIMIT bytes of a stream are held for that.
TAIL_BYTES = 4096
TAIL_LIMIT = 128 * 1024


ErrorEvent = Callable[[str, str], bytes]  # (message, code) -> one SSE event in the API's own shape


# Larger counts are garbage, not usage: no model has a billion-token window.
MAX_REPORTED_TOKENS = 1_000_000_000


class RecentBytes:
    """The last `limit` bytes (at least) of what was added, as the pieces it came in: adding a
    piece copies nothing (a 64 KiB slice taken on every small chunk of a long event did)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pieces: deque[bytes] = deque()
        self.size = 0

    def add(self, piece: bytes) -> None:
        self.pieces.append(piece)
        self.size += len(piece)
        while self.size - len(self.pieces[0]) >= self.limit:
            self.size -= len(self.pieces.popleft())

    def value(self) -> bytes:
        return b"".join(self.pieces)[-self.limit :]


def sse_error_event(message: str, code: str) -> bytes:
    """An OpenAI-style error event: the SDKs raise it as an APIError instead of hanging."""
    return b"data: " + error_body(message, type="server_error", code=code) + b"\n\n"


async def relay_sse(
    first_chunk: bytes,
    rest: AsyncIterator[bytes],
    *,
    idle_timeout: float,
    on_complete: Callable[[bytes], None],
    error_event: ErrorEvent = sse_error_event,
) -> AsyncIterator[bytes]:
    """Yield the stream as it comes; a stalled or broken upstream ends it with an error event.

    ``on_complete`` receives the stream's tail once the upstream finished normally.
    """
    # The last chunks, not a running copy of the tail: copying on every chunk costs more.
    recent = RecentBytes(TAIL_LIMIT)
    recent.add(first_chunk)
    yield first_chunk
    try:
        async for chunk in rest:
            recent.add(chunk)
            yield chunk
    except TimeoutError:
        yield error_event(
            f"The upstream stream stalled for more than {idle_timeout:g} s or ran past the gateway's "
            "total time limit; the gateway closed it.",
            "upstream_idle_timeout",
        )
        return
    except aiohttp.ClientError:
        yield error_event("The upstream connection broke in the middle of the stream.", "upstream_broken")
        return
    on_complete(sse_tail(recent.pieces))


def sse_tail(chunks: Sequence[bytes]) -> bytes:
    """The last TAIL_BYTES of a stream's last `chunks`, from the start of the event they begin
    inside: its last events whole, however long the last one is (within the TAIL_LIMIT held).
    Only the chunks those bytes span are joined, unless that event starts before them."""
    taken: list[bytes] = []
    size = 0
    for chunk in reversed(chunks):
        taken.append(chunk)
        size += len(chunk)
        if size > TAIL_BYTES:
            break
    end = b"".join(reversed(taken))
    start = _last_events_start(end)
    if start is None and len(taken) < len(chunks):
        end = b"".join(chunks)[-TAIL_LIMIT:]
        start = _last_events_start(end)
    return end[start or 0 :]


def _last_events_start(end: bytes) -> int | None:
    """Where the event that the last TAIL_BYTES of `end` begin inside starts (None: before `end`)."""
    cut = len(end) - TAIL_BYTES
    if cut <= 0:
        return 0
    boundary = end.rfind(b"\n\n", 0, cut + 1)
    return boundary + 2 if boundary >= 0 else None


async def first_chunk(
    reply: UpstreamReply,
    idle_timeout: float,
    complete: Callable[[bytes], bool] = lambda head: True,
    limit: int = 16 * 1024,
) -> tuple[bytes, AsyncGenerator[bytes, None]]:
    """The stream's first bytes (to look for an error event inside a 200) and the rest of it.

    More chunks are read while ``complete(head)`` is False, up to ``limit`` bytes: an API
    that opens every stream with the same events reports an error only after them.
    """
    body = reply.iter_body(idle_timeout)
    try:
        head = await anext(body, b"")
        while head and not complete(head) and len(head) < limit:
            more = await anext(body, b"")
            if not more:
                break
            head += more
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
    return head, body


def usage_from_json(body: bytes) -> object:
    """The ``usage`` of a non-streamed answer, at its top or in its ``message`` / ``response``
    (None if it has none)."""
    try:
        return usage_of(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


def prompt_tokens_from_sse_tail(tail: bytes) -> int | None:
    """The prompt tokens of the last usage-bearing event of a stream's tail (or head).

    The search jumps from the end to each event naming ``"usage"`` and parses only those that
    also name a prompt count: a tail is mostly deltas, and Anthropic's last usage states output
    tokens only (its prompt is in the stream's head).
    """
    end = len(tail)
    while (found := tail.rfind(b'"usage"', 0, end)) >= 0:
        before = tail.rfind(b"\n\n", 0, found)
        start = 0 if before < 0 else before + 2
        stop = tail.find(b"\n\n", found)
        event = tail[start : len(tail) if stop < 0 else stop]
        end = start
        if b'"prompt_tokens"' not in event and b'"input_tokens"' not in event:
            continue
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            try:
                tokens = prompt_tokens(usage_of(orjson.loads(line[5:])))
            except orjson.JSONDecodeError:
                continue
            if tokens is not None:
                return tokens
    return None


def usage_of(payload: object) -> object:
    """An answer's or an event's ``usage``: at its top, or in its ``message`` (Anthropic's
    `message_start`) or ``response`` (the Responses API's answers and events)."""
    if not isinstance(payload, dict):
        return None
    for holder in (payload, payload.get("message"), payload.get("response")):
        if isinstance(holder, dict) and isinstance(holder.get("usage"), dict):
            return holder["usage"]
    return None


def prompt_tokens(usage: object) -> int | None:
    """The prompt tokens a usage object reports, cached ones included."""
    if not isinstance(usage, dict):
        return None
    value = reported_count(usage.get("prompt_tokens", usage.get("input_tokens")))
    if value is None:
        return None
    for cached in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        value += reported_count(usage.get(cached)) or 0
    return reported_count(value)  # three plausible parts can still add up to an implausible whole


def reported_count(value: object) -> int | None:
    """A token count an answer reports, or None when it is none: not an integer, negative, or
    beyond any model's reach (one answer reporting 2**64 tokens once set a team's day to
    1.8e19, answered every later request 429, and broke the Redis settlement script)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_REPORTED_TOKENS:
        return None
    return value


async def cancel_safely(stream: AsyncGenerator[bytes, None]) -> None:
    """Close a body iterator we will not read to its end (closes the upstream connection)."""
    await asyncio.shield(stream.aclose())


class RelayStream(StreamingResponse):
    """A streamed answer that stops when its client leaves, as starlette's does, on plain asyncio.

    Starlette runs the stream beside a disconnect listener in an anyio task group, whose
    cancel scopes cost about a fifth of the gateway's CPU for a small streamed request
    (py-spy). Two asyncio tasks do the same: whichever ends first ends the other, and a
    client gone cancels the stream, whose generators then close the upstream response.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        streaming = asyncio.ensure_future(self.stream_response(send))
        listening = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait((streaming, listening), return_when=asyncio.FIRST_COMPLETED)
        finally:  # the client left (or the server stops): the stream goes; else the listener does
            for task in (listening, streaming):
                task.cancel()
            outcome, _ = await asyncio.gather(streaming, listening, return_exceptions=True)
        if isinstance(outcome, Exception):
            raise outcome
        if self.background is not None:
            await self.background()
