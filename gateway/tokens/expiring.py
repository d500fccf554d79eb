"""A bounded map whose entries expire: per-model state that hostile names cannot grow."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class ExpiringLRU(Generic[V]):
    """At most ``max_size`` entries, least recently used evicted first; each entry expires at a
    wall-clock time of its own (shared with other replicas through the store)."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max(1, max_size)
        self._entries: OrderedDict[str, tuple[V, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def get(self, key: str) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, expires_at = entry
        if expires_at <= time.time():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: str, value: V, expires_at: float) -> None:
        self._entries[key] = (value, expires_at)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_size:
            self._entries.popitem(last=False)

    def pop(self, key: str) -> None:
        self._entries.pop(key, None)
