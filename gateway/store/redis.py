from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as redis_asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from gateway.store.breaker import CircuitBreaker

KEY_PREFIX = "context-gateway:"
# Compare-and-delete in one step: a lock that expired and was taken by another holder stays theirs.
REMOVE_IF = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
# Calls to Redis in flight at once, per client. One more waits for a free connection, within the
# call's own bound: redis-py's default pool raises at once instead, which read as "Redis down" and
# put team limits on memory for a cooldown (fuzzing admitted 1.8x a team's budget in a burst).
MAX_CONNECTIONS = 100
STORE_ERRORS = (RedisError, OSError, TimeoutError)
# Client options for commands that show what the store holds (never the request path): bytes that
# are not UTF-8 come back as lone surrogates, escaped when shown, and go back out unchanged (a key
# listed can be read and deleted), where strict decoding failed the whole listing.
READ_ANY_BYTES: dict[str, Any] = {"encoding_errors": "surrogateescape"}

T = TypeVar("T")


class StoreSkipped(RedisConnectionError):
    """A call not made: the breaker is open (it has logged why, once a minute at most)."""


def bounded_client(url: str, timeout: float, **options: Any) -> redis_asyncio.Redis:
    """A client whose every call, waiting for a connection included, is bounded by `timeout`."""
    pool = redis_asyncio.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=timeout,
        decode_responses=True,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        **options,
    )
    return redis_asyncio.Redis.from_pool(pool)


class RedisStore:
    """Redis-backed store shared by every gateway replica. Each call is bounded by `timeout` and
    a circuit breaker skips Redis for `cooldown` seconds after a few failures in a row: reads of
    learned state sit on the request path, and an outage must cost it a few bounded waits, not a
    socket timeout per request."""

    shared = True

    def __init__(self, url: str, *, timeout: float, cooldown: float, **client_options: Any) -> None:
        self._client = bounded_client(url, timeout, **client_options)
        self._breaker = CircuitBreaker(cooldown, "learned-state store")

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        if not self._breaker.allows():
            raise StoreSkipped("skipped: the store failed just now")
        try:
            result = await call()
        except STORE_ERRORS as exc:
            if not _wrong_type(exc):
                self._breaker.failed(exc, "learned state from this replica's memory")
            raise
        self._breaker.succeeded()
        return result

    async def get(self, key: str) -> str | None:
        value = await self._call(lambda: self._client.get(KEY_PREFIX + key))
        return None if value is None else str(value)

    async def set(self, key: str, value: str, ttl_seconds: int | None = None) -> None:
        await self._call(lambda: self._client.set(KEY_PREFIX + key, value, ex=ttl_seconds or None))

    async def add(self, key: str, value: str, ttl_seconds: int) -> bool:
        return bool(
            await self._call(lambda: self._client.set(KEY_PREFIX + key, value, ex=ttl_seconds, nx=True))
        )

    async def remove_if(self, key: str, value: str) -> None:
        await self._call(lambda: self._client.eval(REMOVE_IF, 1, KEY_PREFIX + key, value))

    async def delete(self, key: str) -> bool:
        return bool(await self._call(lambda: self._client.delete(KEY_PREFIX + key)))

    async def keys(self, prefix: str, limit: int) -> list[str]:
        pattern = _glob_escape(KEY_PREFIX + prefix) + "*"
        found: list[str] = []
        # SCAN, not KEYS: it never blocks the server, whatever the number of keys.
        async for key in self._client.scan_iter(match=pattern, count=1000):
            found.append(str(key)[len(KEY_PREFIX) :])
            if len(found) >= limit:
                break
        return found

    async def ping(self) -> bool:
        return bool(await self._call(self._client.ping))

    async def close(self) -> None:
        await self._client.aclose()


def _wrong_type(exc: BaseException) -> bool:
    """Redis answered that this one key holds another type: not a sign that it is down."""
    return isinstance(exc, ResponseError) and str(exc).startswith("WRONGTYPE")


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)
