from __future__ import annotations

import redis.asyncio as redis_asyncio

KEY_PREFIX = "context-gateway:"


class RedisStore:
    """Redis-backed store shared by every gateway replica."""

    def __init__(self, url: str) -> None:
        self._client = redis_asyncio.Redis.from_url(
            url, decode_responses=True, socket_connect_timeout=2.0, socket_timeout=2.0
        )

    async def get(self, key: str) -> str | None:
        value = await self._client.get(KEY_PREFIX + key)
        return None if value is None else str(value)

    async def set(self, key: str, value: str, ttl_seconds: int | None = None) -> None:
        await self._client.set(KEY_PREFIX + key, value, ex=ttl_seconds or None)

    async def delete(self, key: str) -> bool:
        return bool(await self._client.delete(KEY_PREFIX + key))

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
        return bool(await self._client.ping())

    async def close(self) -> None:
        await self._client.aclose()


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)
