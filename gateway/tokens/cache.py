"""Per-message count cache, so a growing conversation only tokenizes what is new.

Keys are a 128-bit BLAKE2b digest of the message's canonical bytes (orjson with
sorted keys), keyed with the counting profile, so the same message counted for
two tokenizers gets two entries. Hashing runs at memory speed (~1 GB/s) where
BPE runs at tens of MB/s, and `bench/count.py` measures both. A message orjson
cannot serialize (a non-dict Mapping, lone surrogates) is simply not cached.

Lookups come from the event loop and from counting threads
(`count_request_async`), hence the lock around the LRU bookkeeping.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

DEFAULT_MAX_ENTRIES = 50_000  # ~150 bytes each: ~8 MB when full


def message_digest(namespace: bytes, message: Mapping[str, Any]) -> bytes | None:
    """128-bit digest of the message's canonical JSON, keyed by the counting profile."""
    try:
        canonical = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    return hashlib.blake2b(canonical, digest_size=16, key=namespace).digest()


class CountCache:
    """Bounded LRU from message digest to raw token count."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> int | None:
        with self._lock:
            count = self._entries.get(key)
            if count is not None:
                self._entries.move_to_end(key)
            return count

    def put(self, key: bytes, count: int) -> None:
        with self._lock:
            self._entries[key] = count
            self._entries.move_to_end(key)
            if len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
