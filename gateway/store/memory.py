"""Process-local store: the default when no Redis is configured.

Bounded as a cache is: every model name a client sends leaves a discovery record, every dropped
span a summary, so an unbounded dict grew with each new name (20,000 invented model names left
13,569 records behind, expired ones included, while `windows.max_models` was 100). Past
MAX_ENTRIES entries or MAX_CHARS characters of keys and values, the least recently used go, as
Redis evicts under `maxmemory-policy allkeys-lru`; what is lost is learned again or recomputed.
"""

from __future__ import annotations

import time
from collections import OrderedDict

MAX_ENTRIES = 10_000
MAX_CHARS = 16 * 1024 * 1024


class MemoryStore:
    shared = False

    def __init__(self, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        self._values: OrderedDict[str, tuple[str, float | None]] = OrderedDict()
        self._chars = 0
        self._max_entries = max_entries
        self._max_chars = max_chars

    async def get(self, key: str) -> str | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        value, expires_at = entry
        if expires_at is not None and expires_at <= time.monotonic():
            self._discard(key)
            return None
        self._values.move_to_end(key)
        return value

    async def set(self, key: str, value: str, ttl_seconds: int | None = None) -> None:
        expires_at = time.monotonic() + ttl_seconds if ttl_seconds else None
        self._discard(key)
        self._values[key] = (value, expires_at)
        self._chars += len(key) + len(value)
        while len(self._values) > self._max_entries or self._chars > self._max_chars:
            self._discard(next(iter(self._values)))

    async def add(self, key: str, value: str, ttl_seconds: int) -> bool:
        if await self.get(key) is not None:
            return False
        await self.set(key, value, ttl_seconds)
        return True

    async def remove_if(self, key: str, value: str) -> None:
        if await self.get(key) == value:
            self._discard(key)

    async def delete(self, key: str) -> bool:
        return self._discard(key)

    async def keys(self, prefix: str, limit: int) -> list[str]:
        live = [
            key for key in list(self._values) if key.startswith(prefix) and await self.get(key) is not None
        ]
        return live[:limit]

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._values.clear()
        self._chars = 0

    def _discard(self, key: str) -> bool:
        entry = self._values.pop(key, None)
        if entry is None:
            return False
        self._chars -= len(key) + len(entry[0])
        return True
