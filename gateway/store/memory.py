from __future__ import annotations

import time


class MemoryStore:
    """Process-local store: the default when no Redis is configured."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[str, float | None]] = {}

    def _live(self, key: str) -> str | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        value, expires_at = entry
        if expires_at is not None and expires_at <= time.monotonic():
            del self._values[key]
            return None
        return value

    async def get(self, key: str) -> str | None:
        return self._live(key)

    async def set(self, key: str, value: str, ttl_seconds: int | None = None) -> None:
        expires_at = time.monotonic() + ttl_seconds if ttl_seconds else None
        self._values[key] = (value, expires_at)

    async def incr_by(self, key: str, amount: int, ttl_seconds: int | None = None) -> int:
        current = self._live(key)
        total = int(current or 0) + amount
        entry = self._values.get(key)
        expires_at = entry[1] if entry is not None and current is not None else None
        if expires_at is None and ttl_seconds:
            expires_at = time.monotonic() + ttl_seconds
        self._values[key] = (str(total), expires_at)
        return total

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._values.clear()
