"""Shared state (learned windows, calibration): memory or Redis behind one interface."""

from gateway.store.base import Store
from gateway.store.memory import MemoryStore

__all__ = ["MemoryStore", "Store", "open_store"]


def open_store(redis_url: str | None) -> Store:
    if not redis_url:
        return MemoryStore()
    from gateway.store.redis import RedisStore

    return RedisStore(redis_url)
