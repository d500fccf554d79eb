from __future__ import annotations

from typing import Protocol


class Store(Protocol):
    """Small key/value interface; values are strings (JSON where structured)."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, ttl_seconds: int | None = None) -> None: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
