"""Shared state (learned windows, calibration): memory or Redis behind one interface."""

from gateway.store.base import Store
from gateway.store.memory import MemoryStore

__all__ = ["MemoryStore", "Store", "open_store"]


def open_store(redis_url: str | None, *, timeout: float, cooldown: float) -> Store:
    """Redis when `redis_url` is set (each call bounded by `timeout`, skipped for `cooldown` seconds
    after a few failures in a row), else memory."""
    if not redis_url:
        return MemoryStore()
    from gateway.store.redis import RedisStore

    return RedisStore(redis_url, timeout=timeout, cooldown=cooldown)
