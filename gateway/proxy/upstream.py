"""The one HTTP client to the upstream: connection pool, retries, timeouts, relay.

aiohttp, not httpx: on this machine a starlette+aiohttp passthrough costs about
half the CPU per request of a starlette+httpx one and stays flat at
concurrency 32 where httpx queues (DESIGN.md; re-measured by
bench/proxy_overhead.py). This module knows nothing of teams or compression.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, ParamSpec

import aiohttp
import orjson
from multidict import CIMultiDict
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    stop_after_attempt,
    stop_before_delay,
    wait_random_exponential,
)
from yarl import URL

from gateway import metrics
from gateway.errors import GatewayError
from gateway.settings import UpstreamSettings

log = logging.getLogger("gateway.upstream")

# RFC 9110 §7.6.1 connection-specific headers, plus the ones the proxy recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
# The upstream's answers are evidence, not truth: what the gateway reads whole before relaying is
# bounded. An answer is read for its usage up to the request bodies' own bound (a 300 MB answer
# took a worker to 990 MB); an error, for what it says about the prompt, up to 1 MiB (the
# longest real refusal is a few KB). Anything larger goes to the client as it comes, unread.
MAX_READ_ANSWER_BYTES = 32 * 1024 * 1024
MAX_READ_ERROR_BYTES = 1024 * 1024
# Checks of a body's progress per idle timeout (see iter_body).
WATCHDOG_TICKS = 10


def upstream_timeout(message: str) -> GatewayError:
    return GatewayError(504, message, type="server_error", code="upstream_timeout")


def upstream_broken(message: str) -> GatewayError:
    return GatewayError(502, message, type="server_error", code="upstream_broken")


def own_key_rejected(method: str, url: URL) -> GatewayError:
    """The upstream refused the key the gateway itself supplied.

    Relaying its 401 would tell every client that *their* key is wrong and show them the
    upstream's message, which quotes part of the organisation's key. The operator is told
    in the log instead; the client learns only that the gateway is misconfigured.
    """
    log.error(
        "the upstream rejected the gateway's configured API key (401 on %s %s): check upstream.api_key",
        method,
        url.path,
    )
    return GatewayError(
        502,
        "The upstream rejected the gateway's own credentials. This is a gateway configuration "
        "problem for its operator; the request itself may be fine.",
        type="server_error",
        code="upstream_auth_failed",
    )


class RetryableStatus(Exception):
    """An upstream answer worth another attempt; kept whole so the last one can be relayed."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.headers = headers
        self.body = body
        self.retry_after = retry_after_seconds(headers)


@dataclass
class UpstreamReply:
    """Response headers have arrived; the body is still on the wire."""

    status: int
    headers: list[tuple[str, str]]
    response: aiohttp.ClientResponse | None
    buffered_body: bytes | None = None
    attempts: int = 1
    # Event-loop time by which the whole body must have arrived (timeouts.total).
    deadline: float | None = None
    # A body too large to read whole: what was read of it, and the rest, still on the wire.
    read_head: list[bytes] = field(default_factory=list)
    unread: AsyncGenerator[bytes, None] | None = None

    @property
    def content_length(self) -> int | None:
        if self.buffered_body is not None:
            return len(self.buffered_body)
        return self.response.content_length if self.response is not None else None

    async def read_within(self, idle_timeout: float, limit: int) -> bytes | None:
        """The whole body if it holds at most `limit` bytes; else None, and `relayed` gives it to
        the client as it comes (what was read of it first). Nothing has reached the client yet,
        so a body that stalls or breaks becomes the gateway's own 504 or 502."""
        if self.buffered_body is not None:
            return self.buffered_body
        if self.unread is not None:
            return None
        chunks: list[bytes] = []
        size = 0
        body = self.read_chunks(idle_timeout)
        try:
            async for chunk in body:
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:  # (kept as read: joined, they were held twice over)
                    self.read_head, self.unread = chunks, body
                    return None
        finally:
            if self.unread is None:
                await body.aclose()
        return b"".join(chunks)

    async def relayed(self) -> AsyncGenerator[bytes, None]:
        """A body `read_within` found too large: what was read, then the rest as it arrives."""
        assert self.unread is not None
        async with aclosing(self.unread) as rest:
            head, self.read_head = self.read_head, []
            head.reverse()
            while head:  # each piece let go once sent
                yield head.pop()
            async for chunk in rest:
                yield chunk

    async def read_chunks(self, idle_timeout: float) -> AsyncGenerator[bytes, None]:
        """The body as it arrives, for the gateway to read before answering: a body that stalls
        or breaks becomes the gateway's own 504 or 502."""
        try:
            async with aclosing(self.iter_body(idle_timeout)) as body:
                async for chunk in body:
                    yield chunk
        except TimeoutError:
            raise upstream_timeout(
                f"The upstream stopped sending its answer for more than {idle_timeout:g} s "
                "(or ran past the gateway's total time limit)."
            ) from None
        except aiohttp.ClientError as exc:
            raise upstream_broken(
                f"The upstream connection broke in the middle of the answer ({type(exc).__name__})."
            ) from None

    def iter_body(self, idle_timeout: float) -> AsyncGenerator[bytes, None]:
        assert self.response is not None
        return iter_body(self.response, idle_timeout, self.deadline)

    def close(self) -> None:
        if self.response is not None:
            self.response.close()


def retry_after_seconds(headers: Iterable[tuple[str, str]]) -> float | None:
    for name, value in headers:
        if name.lower() != "retry-after":
            continue
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, parsed.timestamp() - time.time())
    return None


def forward_headers(
    headers: Iterable[tuple[str, str]], drop: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """Headers to pass on, either direction: everything but hop-by-hop ones and `drop` (lower case).

    Each name is lowered once: on every request this runs over both directions' headers."""
    pairs = [(name.lower(), name, value) for name, value in headers]
    dropped = HOP_BY_HOP | drop
    for lower, _, value in pairs:
        if lower == "connection":  # the headers it names are hop-by-hop too
            dropped = dropped | {token.strip().lower() for token in value.split(",")}
    return [(name, value) for lower, name, value in pairs if lower not in dropped]


P = ParamSpec("P")


def _timed(send: Callable[P, Awaitable[UpstreamReply]]) -> Callable[P, Awaitable[UpstreamReply]]:
    """Time ``send`` into ``gateway_upstream_duration_seconds`` by status class (error: raised)."""

    @functools.wraps(send)
    async def timed(*args: P.args, **kwargs: P.kwargs) -> UpstreamReply:
        started = time.perf_counter()
        status = "error"
        try:
            reply = await send(*args, **kwargs)
            status = metrics.status_class(reply.status)
            return reply
        finally:
            metrics.UPSTREAM_DURATION.labels(status).observe(time.perf_counter() - started)

    return timed


class Upstream:
    def __init__(self, settings: UpstreamSettings) -> None:
        self.settings = settings
        self._base = settings.base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.settings.max_connections, limit_per_host=0)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # Bytes are relayed as they come: compressed stays compressed.
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=self.settings.timeouts.connect, sock_read=None),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def url_for(self, path: str, query: str) -> URL:
        """Map ``/v1/<rest>`` onto the configured base URL (which usually ends in ``/v1``)."""
        rest = path[3:] if path.startswith("/v1/") or path == "/v1" else path
        raw = self._base + rest + (f"?{query}" if query else "")
        return URL(raw, encoded=True)

    @_timed
    async def send(
        self,
        method: str,
        url: URL,
        headers: Mapping[str, str] | list[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
        *,
        gateway_credentials: bool = False,
    ) -> UpstreamReply:
        """Send and wait for the response headers, retrying what is safe to retry.

        Only re-sendable bodies (bytes or none) are retried; nothing has reached the
        client yet at this point, so a retry can never duplicate relayed bytes.
        ``gateway_credentials``: the request carries the gateway's own key, so a 401 is the
        operator's problem, not the client's (see `own_key_rejected`).
        """
        attempts = self.settings.retries.max_attempts if not isinstance(body, AsyncIterator) else 1
        total = self.settings.timeouts.total
        deadline = asyncio.get_running_loop().time() + total
        retrying: AsyncRetrying | None = None
        try:
            try:
                # The first attempt runs without tenacity: it costs ~25 µs a request.
                reply = await self._attempt(method, url, headers, body, deadline)
            except (RetryableStatus, aiohttp.ClientError, TimeoutError) as failure:
                if attempts <= 1:
                    raise
                retrying = self._retrying(attempts, total)
                reply = await self._retry(retrying, failure, method, url, headers, body, deadline)
            reply.deadline = deadline
        except RetryableStatus as exhausted:
            # Attempts actually made: the time bound or a long Retry-After can stop before max_attempts.
            made = 1 if retrying is None else int(retrying.statistics.get("attempt_number", attempts))
            return UpstreamReply(exhausted.status, exhausted.headers, None, exhausted.body, made)
        except TimeoutError as exc:
            waited = (
                self.settings.timeouts.connect
                if isinstance(exc, aiohttp.ConnectionTimeoutError)
                else min(self.settings.timeouts.first_byte, total)
            )
            raise upstream_timeout(f"The upstream did not answer within {waited:g} s.") from None
        except aiohttp.ClientError as exc:
            raise GatewayError(
                502,
                f"The upstream could not be reached ({type(exc).__name__}).",
                type="server_error",
                code="upstream_unreachable",
            ) from None
        if gateway_credentials and reply.status == 401:
            reply.close()
            raise own_key_rejected(method, url)
        return reply

    def _retrying(self, attempts: int, total: float) -> AsyncRetrying:
        cfg = self.settings.retries
        return AsyncRetrying(
            stop=stop_after_attempt(attempts) | stop_before_delay(min(cfg.max_total_seconds, total)),
            wait=self._wait,
            retry=self._should_retry,
            reraise=True,
        )

    async def _retry(
        self,
        retrying: AsyncRetrying,
        first_failure: BaseException,
        method: str,
        url: URL,
        headers: Mapping[str, str] | list[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
        deadline: float,
    ) -> UpstreamReply:
        """Attempts 2..n under the retry policy; attempt 1 is the failure already in hand."""
        pending: BaseException | None = first_failure
        async for attempt in retrying:
            with attempt:
                if pending is not None:
                    failure, pending = pending, None
                    raise failure
                reply = await self._attempt(method, url, headers, body, deadline)
                reply.attempts = attempt.retry_state.attempt_number
                return reply
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _should_retry(self, state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, RetryableStatus):
            # A Retry-After beyond the cap is not waited out: the 429 goes to the client.
            return (exc.retry_after or 0.0) <= self.settings.retries.retry_after_cap
        # Connection failures happen before the request was processed: safe to resend.
        # Other timeouts are not retried: the upstream may still be generating (and billing).
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return True
        return isinstance(exc, aiohttp.ClientConnectionError) and not isinstance(exc, TimeoutError)

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, RetryableStatus) and exc.retry_after is not None:
            return exc.retry_after
        cfg = self.settings.retries
        backoff = wait_random_exponential(multiplier=cfg.backoff_initial, max=cfg.backoff_max)
        return float(backoff(state))

    async def fetch_json(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, *, max_bytes: int
    ) -> Any:
        """One attempt, no retries, for the gateway's own look-ups (window discovery): the
        parsed JSON of a 200 answer, else None. Never raises; callers bound the time."""
        if self._session is None:
            return None
        try:
            async with self._session.request(
                method,
                URL(url),
                headers={
                    **headers,
                    "Accept": "application/json",
                    "Accept-Encoding": "identity",
                    **({"Content-Type": "application/json"} if body is not None else {}),
                },
                data=body,
                allow_redirects=False,
            ) as response:
                if response.status != 200:
                    return None
                content = await read_at_most(response.content, max_bytes)
                return None if len(content) > max_bytes else orjson.loads(content)
        except (aiohttp.ClientError, orjson.JSONDecodeError, ValueError, UnicodeError):
            return None

    async def _attempt(
        self,
        method: str,
        url: URL,
        headers: Mapping[str, str] | list[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
        deadline: float,
    ) -> UpstreamReply:
        assert self._session is not None, "Upstream.start() was not awaited"
        # timeouts.total bounds the whole request: the wait for headers too.
        first_byte_by = asyncio.get_running_loop().time() + self.settings.timeouts.first_byte
        async with asyncio.timeout_at(min(first_byte_by, deadline)):
            response = await self._session.request(
                method, url, headers=CIMultiDict(headers), data=body, allow_redirects=False
            )
        reply_headers = forward_headers(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers
        )
        if response.status in RETRYABLE_STATUSES:
            whole = False
            try:
                async with asyncio.timeout(self.settings.timeouts.idle):
                    error_body = await read_at_most(response.content, MAX_READ_ERROR_BYTES)
                whole = len(error_body) <= MAX_READ_ERROR_BYTES
            finally:
                if whole:
                    response.release()
                else:  # the rest is left unread: the connection cannot be reused
                    response.close()
            if not whole:
                raise upstream_broken(
                    f"The upstream answered {response.status} with an error body over "
                    f"{MAX_READ_ERROR_BYTES:,} bytes; it was not relayed."
                )
            raise RetryableStatus(response.status, reply_headers, error_body)
        return UpstreamReply(response.status, reply_headers, response)


class _Watchdog:
    """Fails `content`'s read with TimeoutError once the upstream has sent nothing for
    `idle_timeout`, or at `end_by` (event-loop time)."""

    def __init__(self, content: aiohttp.StreamReader, idle_timeout: float, end_by: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.content = content
        self.idle_timeout = idle_timeout
        self.end_by = end_by
        # New bytes are noticed at the next tick, so a silence is cut within 1/WATCHDOG_TICKS of
        # idle_timeout past it (one check per idle period would let it run to twice as long).
        self.tick = idle_timeout / WATCHDOG_TICKS
        self.seen_bytes = content.total_bytes
        self.last_progress = self.loop.time()
        self.timer: asyncio.TimerHandle | None = self.loop.call_at(
            min(self.last_progress + self.tick, end_by), self.check
        )

    def check(self) -> None:
        now = self.loop.time()
        if self.content.total_bytes != self.seen_bytes:
            self.seen_bytes, self.last_progress = self.content.total_bytes, now
        due = min(self.last_progress + self.idle_timeout, self.end_by)
        if now >= due:
            self.content.set_exception(TimeoutError())
            self.timer = None
        else:
            self.timer = self.loop.call_at(min(now + self.tick, due), self.check)

    def stop(self) -> None:
        # The handle holds `self.check`: dropping it leaves no reference loop, so the response and
        # its buffers are freed as the request ends, not by the cyclic collector.
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


async def read_at_most(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body, or its first `limit` + 1 bytes: longer than `limit` means larger than allowed."""
    parts: list[bytes] = []
    size = 0
    while size <= limit and (chunk := await content.read(limit + 1 - size)):
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


async def iter_body(
    response: aiohttp.ClientResponse, idle_timeout: float, deadline: float | None = None
) -> AsyncGenerator[bytes, None]:
    """Yield the body as it arrives.

    An upstream silent for longer than ``idle_timeout``, or still sending at ``deadline``
    (event-loop time), makes the read raise TimeoutError. One watchdog timer per body
    checks the upstream's byte count a few times per idle period, instead of a timeout armed
    around every chunk: it measures the upstream's silence (not the client's pace) and costs
    nothing per chunk.
    The connection is closed (not returned to the pool) unless the body was read to its
    end, so a client that goes away stops the upstream generation at once.
    """
    watchdog = _Watchdog(response.content, idle_timeout, math.inf if deadline is None else deadline)
    complete = False
    try:
        while True:
            chunk = await response.content.readany()
            if not chunk:
                complete = True
                return
            yield chunk
    finally:
        watchdog.stop()
        if complete:
            response.release()
        else:
            response.close()
