from __future__ import annotations

from typing import Protocol


class Store(Protocol):
    """Small key/value interface; values are strings (JSON where structured)."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, ttl_seconds: int | None = None) -> None: ...

    async def delete(self, key: str) -> bool:
        """Remove ``key``; True when it existed."""
        ...

    async def keys(self, prefix: str, limit: int) -> list[str]:
        """Up to ``limit`` live keys starting with ``prefix`` (for listings, never on requests)."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
