from __future__ import annotations

import time


class MemoryStore:
    """Process-local store: the default when no Redis is configured."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[str, float | None]] = {}

    async def get(self, key: str) -> str | None:
        entry = self._values.get(key)
        if entry is None:
            return None
        value, expires_at = entry
        if expires_at is not None and expires_at <= time.monotonic():
            del self._values[key]
            return None
        return value

    async def set(self, key: str, value: str, ttl_seconds: int | None = None) -> None:
        expires_at = time.monotonic() + ttl_seconds if ttl_seconds else None
        self._values[key] = (value, expires_at)

    async def delete(self, key: str) -> bool:
        return self._values.pop(key, None) is not None

    async def keys(self, prefix: str, limit: int) -> list[str]:
        live = [
            key for key in list(self._values) if key.startswith(prefix) and await self.get(key) is not None
        ]
        return live[:limit]

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._values.clear()
