"""Put a reply on the wire: paced SSE, delivery faults, and noticing a client that leaves.

Plain replies take a fast path (two ASGI sends). Streams and delayed replies
run next to a watcher on `receive()`: uvicorn silently drops writes after a
disconnect, so watching is the only way to tell a client that went away
from one that read everything.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import orjson
from starlette.types import Receive, Scope, Send

from tests.fakes.faults import DELIVERY, MID_BODY, Fault

JSON = "application/json"
EVENT_STREAM = "text/event-stream; charset=utf-8"
# Scope key under which the app keeps uvicorn's own `send` (see `_transport`).
RAW_SEND = "fake_upstream.raw_send"
# Time for the client to read the bytes sent before a reset: an RST can make
# the peer's kernel discard data it has received but the client not yet read.
RESET_GRACE_SECONDS = 0.05


@dataclass
class Reply:
    status: int
    body: bytes = b""
    events: list[bytes] | None = None
    """SSE events to stream one by one; None for a single body."""
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", self.content_type.encode())]
        if self.events is None:
            headers.append((b"content-length", str(len(self.body)).encode()))
        headers += [(name.encode(), value.encode()) for name, value in self.headers.items()]
        return headers

    def pieces(self, *, split: bool) -> list[bytes]:
        if self.events is not None:
            return self.events
        if split:
            half = len(self.body) // 2
            return [self.body[:half], self.body[half:]]
        return [self.body]


def json_reply(status: int, payload: object, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, orjson.dumps(payload), headers=headers or {})


def sse_reply(events: list[bytes]) -> Reply:
    return Reply(200, events=events, content_type=EVENT_STREAM)


class DeliveryState(Protocol):
    """The knobs and counters of the fake that delivery reads and updates."""

    chunk_delay: float
    hang_seconds: float
    active_streams: int
    cancelled_streams: int
    cancelled_requests: int


class _Transport(Protocol):
    def abort(self) -> None: ...
    def close(self) -> None: ...
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def _transport(scope: Scope) -> _Transport:
    # ASGI has no way to drop a connection. uvicorn's `send` is a bound method
    # of its per-request cycle, which holds the connection's transport; the app
    # keeps that raw `send` in the scope before Starlette wraps it.
    cycle = getattr(scope.get(RAW_SEND), "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        raise RuntimeError("connection faults need the app served by uvicorn (no transport behind send)")
    return cast(_Transport, transport)


async def _drop_connection(scope: Scope, *, reset: bool) -> None:
    transport = _transport(scope)
    if not reset:
        transport.close()
        return
    await asyncio.sleep(RESET_GRACE_SECONDS)
    # Linger 0 makes close() send RST instead of FIN: the peer sees ECONNRESET.
    sock = transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def _play(reply: Reply, fault: Fault | None, state: DeliveryState, scope: Scope, send: Send) -> bool:
    """Send the reply, applying `fault`. True if the connection was dropped on purpose."""
    if fault is Fault.HANG:
        await asyncio.sleep(state.hang_seconds)
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.raw_headers()})
    interrupted = fault in MID_BODY
    pieces = reply.pieces(split=interrupted)
    cut = len(pieces) // 2 if interrupted else len(pieces)
    for index, piece in enumerate(pieces):
        if index == cut:
            if fault is not Fault.STALL:
                await _drop_connection(scope, reset=fault is Fault.RESET)
                return True
            await asyncio.sleep(state.hang_seconds)
        if index and reply.events is not None and state.chunk_delay:
            await asyncio.sleep(state.chunk_delay)
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return False


async def _client_gone(receive: Receive) -> None:
    # The body was already read, so the next message is the disconnect (or
    # uvicorn's end-of-response notice, which only matters once `_play` is done).
    while (await receive())["type"] != "http.disconnect":
        pass


async def deliver(
    reply: Reply, fault: Fault | None, state: DeliveryState, scope: Scope, receive: Receive, send: Send
) -> None:
    if reply.events is None and fault not in DELIVERY:
        await send({"type": "http.response.start", "status": reply.status, "headers": reply.raw_headers()})
        await send({"type": "http.response.body", "body": reply.body})
        return
    streaming = reply.events is not None
    if streaming:
        state.active_streams += 1
    play = asyncio.ensure_future(_play(reply, fault, state, scope, send))
    watch = asyncio.ensure_future(_client_gone(receive))
    try:
        await asyncio.wait((play, watch), return_when=asyncio.FIRST_COMPLETED)
        if not play.done():
            if streaming:
                state.cancelled_streams += 1
            else:
                state.cancelled_requests += 1
        elif play.result():
            # Return only once uvicorn has seen the close, or it logs an
            # "incomplete response" error for a drop that was intended.
            await watch
    finally:
        play.cancel()
        watch.cancel()
        if streaming:
            state.active_streams -= 1
