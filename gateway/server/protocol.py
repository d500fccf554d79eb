"""uvicorn's httptools protocol with the limits it lacks: connections, header size, slow clients.

What uvicorn 0.5x offers and why it is not enough here (read from its source):

- ``limit_concurrency`` answers 503 only once a request's headers are complete; connections
  that never finish (or never start) a request are held without limit until the process runs
  out of file descriptors. Here a connection beyond ``max_connections`` is never served: the
  oldest idle connection (no request under way) is closed to make room, else the new one is.
- ``h11_max_incomplete_event_size`` bounds headers for the h11 protocol only. httptools buffers
  a header value whole before any callback sees it, so a 100 MB header is 100 MB of memory.
  Here the bytes of unfinished headers are counted as they arrive: past ``max_header_bytes``
  the connection answers 431 and closes, having buffered at most one read more than the limit.
- ``timeout_keep_alive`` runs only between requests. Nothing bounds the time to send the
  headers or the silence inside a body (slowloris). Here ``header_timeout`` bounds the time
  from a request's first byte (or the connection's start) to the end of its headers, and
  ``body_timeout`` the silence between two pieces of its body; either answers 408 and closes.
  A body dripped a byte at a time beats any bound on silence (20 connections, one byte every
  2 s each, held every slot of a gateway for as long as they liked), so after ``body_timeout``
  a body must also average ``body_min_rate`` bytes a second: each byte received extends its
  time by 1/rate, as Apache's mod_reqtimeout MinRate does. Time the gateway itself held the
  body (reading paused) restarts both clocks.

Its refusals, and what the parser refuses (uvicorn answers that in plain text), are JSON in the
route's error shape. An upgrade offer (`Upgrade: h2c`, sent by curl --http2 on http://) makes
httptools read what follows the headers as the new protocol's bytes, so a request carrying a
body under one would reach the app empty: it is refused, naming the header.

A protocol subclass, not an ASGI middleware: ASGI sees a request only once its headers are
complete, too late for all of the above. The subclass touches uvicorn through its parser
callbacks and ``send_400_response`` (where a refused request ends), and costs one attribute
write per body piece.

It also tells the app whether a request's client has hung up (`client_gone`) from the
connection's own state. Starlette's `Request.is_disconnected` asks by cancelling a receive
inside an anyio cancel scope: measured at ~20% of the gateway's CPU for a small request, which
asks twice.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from starlette.requests import Request
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway import metrics
from gateway.errors import anthropic_error_body, anthropic_error_type, anthropic_path, error_body
from gateway.log_safety import printable
from gateway.middleware import REFUSED_STATUS, route_label
from gateway.proxy.headers import GATEWAY_REQUEST_ID, new_request_id
from gateway.request_log import RequestLines, RequestRecord
from gateway.request_path import prompt_route_alias

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
_TOO_LARGE = "The request's headers are larger than the gateway accepts."
_NOT_HTTP = "The request is not valid HTTP/1.1."
# The scope extension holding a request's `client_gone` check (the gateway's own server only).
CLIENT_GONE = "gateway.client_gone"


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    max_header_bytes: int
    header_timeout: float
    body_timeout: float
    body_min_rate: float  # bytes per second; 0: no floor


def limited_protocol(limits: ConnectionLimits, lines: RequestLines) -> type[HttpToolsProtocol]:
    """A protocol class for one server: the limits and the idle-connection registry are its own;
    `lines` writes the log line of each request it refuses before the app sees it."""

    class Protocol(LimitedHttpToolsProtocol):
        pass

    Protocol.limits = limits
    Protocol.idle = OrderedDict()
    Protocol.lines = lines
    return Protocol


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits]
    lines: ClassVar[RequestLines]
    # Connections with no request under way, oldest first: the ones to close when full.
    idle: ClassVar[OrderedDict[LimitedHttpToolsProtocol, None]]

    url = b""  # uvicorn sets it when a request begins; a refusal may come before
    _refusal: int | None = None
    _refusal_message = _NOT_HTTP
    _in_headers = False
    _header_bytes = 0
    _header_timer: asyncio.TimerHandle | None = None
    _body_timer: asyncio.TimerHandle | None = None
    _body_progress = 0.0
    _body_started = 0.0
    _body_received = 0
    _request_started = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections and not self._evict_idle():
            # Full of connections that are all mid-request: refuse this one at once, so file
            # descriptors are never exhausted (the cap sits below RLIMIT_NOFILE, see run.py).
            transport.abort()
            return
        super().connection_made(transport)
        self.idle[self] = None
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:  # refused in connection_made
            return
        self.idle.pop(self, None)
        self._cancel_timers()
        super().connection_lost(exc)

    def _evict_idle(self) -> bool:
        while self.idle:
            oldest, _ = self.idle.popitem(last=False)
            if not oldest.transport.is_closing():
                oldest.transport.abort()
                return True
        return False

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        self.idle.pop(self, None)
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm_header_timer()  # a new request starts after a keep-alive pause
        if self._in_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        # Headers still unfinished past the limit: stop before the parser buffers more of them.
        if self._in_headers and self._header_bytes > self.limits.max_header_bytes:
            self._refuse(431, _TOO_LARGE)

    # Parser callbacks --------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._header_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_headers = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        # Headers that arrived whole in one read are measured exactly here.
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_header_bytes:
            self._refusal, self._refusal_message = 431, _TOO_LARGE
            # Raising stops the parser; uvicorn then calls send_400_response, which answers 431.
            raise RequestRefused
        if self._offers_upgrade_with_body():
            # httptools reads what follows the headers of an upgrade offer (curl --http2 on
            # http:// offers h2c) as the new protocol's bytes: the app would get an empty body.
            self._refusal, self._refusal_message = (
                400,
                (
                    "The gateway speaks HTTP/1.1 and does not switch protocols: send the request "
                    "without the `Upgrade` header (curl: --http1.1 rather than --http2 on http://)."
                ),
            )
            raise RequestRefused
        super().on_headers_complete()
        if self.cycle is not None:
            extensions: dict[str, object] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
            extensions[CLIENT_GONE] = self._gone_check(self.cycle)
        self._body_progress = self._body_started = self.loop.time()
        self._body_received = 0
        self._body_timer = self.loop.call_later(self.limits.body_timeout, self._check_body)

    def on_body(self, body: bytes) -> None:
        self._body_progress = self.loop.time()
        self._body_received += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self.idle[self] = None

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to what the parser refused is plain text; the gateway's errors are JSON.
        self._write_refusal(self._refusal or 400, self._refusal_message)

    def _offers_upgrade_with_body(self) -> bool:
        # The parser's flag first (C, no header scan), as uvicorn does: this runs on every request.
        if not self.parser.should_upgrade() or self._get_upgrade() is None or self._should_upgrade():
            return False
        declared = dict(self.headers)
        length = declared.get(b"content-length", b"0").strip()
        return b"transfer-encoding" in declared or not length.isdigit() or int(length) > 0

    def _gone_check(self, cycle: RequestResponseCycle) -> Callable[[], bool]:
        # The check lives in the cycle's own scope: holding the cycle weakly keeps that from being
        # a reference loop, which would leave every finished request to the cyclic collector.
        held = weakref.ref(cycle)
        flow = self.flow

        def gone() -> bool:
            """Whether the client of the cycle hung up. Reading resumes, as a receive would: uvicorn
            pauses it while a large body waits for the app, and a hang-up is seen only once it
            reads again, so a later check sees what this one could not."""
            cycle = held()
            if cycle is None:  # the request is over, and nobody holds it any more
                return True
            if not cycle.disconnected and not cycle.response_complete:
                flow.resume_reading()
            return cycle.disconnected

        return gone

    # Timers ------------------------------------------------------------------------------------

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.limits.header_timeout, self._header_timeout)
        self._request_started = time.perf_counter()  # what a refusal's log line times from

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._in_headers:
            self._refuse(408, "The request's headers did not arrive in time.")
        elif not self.transport.is_closing():
            self.transport.close()  # connected, never started a request

    def _check_body(self) -> None:
        self._body_timer = None
        if self.cycle is None or not self.cycle.more_body or self.transport.is_closing():
            return
        now = self.loop.time()
        if self.flow.read_paused:
            # Reading is paused because the gateway has not taken the body yet: not the client's delay.
            self._body_progress = self._body_started = now
            self._body_received = 0
        silent_due = self._body_progress + self.limits.body_timeout
        rate_due = (
            self._body_started + self.limits.body_timeout + self._body_received / self.limits.body_min_rate
            if self.limits.body_min_rate
            else silent_due
        )
        if now < min(silent_due, rate_due):
            self._body_timer = self.loop.call_at(min(silent_due, rate_due), self._check_body)
        elif now >= silent_due:
            self._refuse(408, "The request body stalled: nothing arrived for too long.")
        else:
            self._refuse(408, "The request body arrived too slowly.")

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None

    # Refusals ----------------------------------------------------------------------------------

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` (unless an answer has started) and close the connection."""
        self._refusal = status
        if self._in_headers or self.cycle is None or self.cycle.response_complete:
            self._write_refusal(status, message)  # a request the app has not seen
            return
        # The app is reading this request's body: its guard counts and logs it, with this status.
        self.scope[REFUSED_STATUS] = status  # type: ignore[literal-required]
        if self.cycle.response_started:
            self.transport.close()
            return
        self._write_refusal(status, message, request_id=self.scope.get("state", {}).get("request_id", ""))

    def _write_refusal(self, status: int, message: str, request_id: str | None = None) -> None:
        """Answer a refused request and close; `request_id` when the app holds it, else the
        refusal is a request of its own, counted and logged here."""
        self._refusal = status
        self._cancel_timers()
        if self.transport.is_closing():
            return
        path = self.url.partition(b"?")[0].decode("latin-1")
        if request_id is None:
            request_id = self._account_refusal(status, path)
            if self.cycle is not None and not self.cycle.response_complete:
                # Pipelined behind a request still being answered: an answer now would be read as
                # that one's. The connection closes instead.
                self.transport.close()
                return
        if anthropic_path(prompt_route_alias(path) or path):  # `/v1/Messages` is Anthropic's too
            body = anthropic_error_body(message, anthropic_error_type(status))
        else:
            body = error_body(message, type="invalid_request_error", code="request_rejected")
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"%s: %s\r\nconnection: close\r\n\r\n"
            % (status, _REASONS[status], len(body), GATEWAY_REQUEST_ID.encode(), str(request_id).encode())
        )
        self.transport.write(head + body)
        self.transport.close()

    def _account_refusal(self, status: int, path: str) -> str:
        """A refusal the app never saw (headers too large or too slow, HTTP it cannot parse) is
        counted and logged as every answer is; an operator sees the attack in the metrics."""
        # The parser states a method once the request line is read (the url with it), else none.
        method = self.parser.get_method().decode("latin-1") if self.url else "-"
        record = RequestRecord(
            new_request_id(), printable(method, 16), route_label(path), started=self._request_started
        )
        record.status = status
        metrics.REQUESTS.labels(record.route, metrics.status_class(status)).inc()
        self.lines.write(record)
        return record.request_id


class RequestRefused(Exception):
    """Raised inside the parser's callback to stop it; never leaves the protocol."""


async def client_gone(request: Request) -> bool:
    """Whether the request's client has hung up: from the connection's state when the gateway's
    own server runs the app, else through starlette (any other ASGI server)."""
    check: Callable[[], bool] | None = request.scope.get("extensions", {}).get(CLIENT_GONE)
    if check is None:
        return await request.is_disconnected()
    return check()
