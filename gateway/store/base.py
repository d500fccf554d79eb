from __future__ import annotations

from typing import Protocol


class Store(Protocol):
    """Small key/value interface; values are strings (JSON where structured)."""

    # Whether other processes write it too (Redis): a key gone from a process-local store was
    # only evicted, never removed by an operator's command.
    shared: bool

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, ttl_seconds: int | None = None) -> None: ...

    async def add(self, key: str, value: str, ttl_seconds: int) -> bool:
        """Set `key` only if absent (a lock: `value` is its holder's token); True when set."""
        ...

    async def remove_if(self, key: str, value: str) -> None:
        """Delete `key` only while it still holds `value` (release a lock only its holder owns)."""

    async def delete(self, key: str) -> bool:
        """Remove ``key``; True when it existed."""
        ...

    async def keys(self, prefix: str, limit: int) -> list[str]:
        """Up to ``limit`` live keys starting with ``prefix`` (for listings, never on requests)."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
