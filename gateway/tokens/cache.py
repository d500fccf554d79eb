"""Per-message count cache, so a growing conversation only tokenizes what is new.

Keys are the counting profile, the length of the message's canonical bytes
(orjson with sorted keys) and Python's hash of them, so the same message
counted for two tokenizers gets two entries. Python's bytes hash is SipHash
with a per-process random key: a collision between two of at most 50,000
entries of equal length has odds around 1e-10, and nobody outside the
process can aim for one. It is ~4x cheaper than a BLAKE2b digest, which
matters because every message of every request is keyed (measured by
`bench/count.py`, where hashing is compared with tokenizing). A message
orjson cannot serialize (a non-dict Mapping, lone surrogates) is not cached.

Lookups come from the event loop and from counting threads
(`count_request_async`), hence the lock around the LRU bookkeeping.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

DEFAULT_MAX_ENTRIES = 50_000  # ~150 bytes each: ~8 MB when full


CacheKey = tuple[bytes, int, int]


def message_key(namespace: bytes, message: Mapping[str, Any], *, keep_order: bool = False) -> CacheKey | None:
    """(profile, byte length, hash) of the message's canonical JSON; the length also sizes the work.
    `keep_order`: keys in the order given, for what is counted as JSON text (a tool's or a
    schema's definition: its keys in another order are other tokens)."""
    try:
        canonical = orjson.dumps(message, option=None if keep_order else orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    return (namespace, len(canonical), hash(canonical))


class CountCache:
    """Bounded LRU from message digest to raw token count."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self._max_entries = max_entries
        self._entries: OrderedDict[CacheKey, int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: CacheKey) -> int | None:
        with self._lock:
            count = self._entries.get(key)
            if count is not None:
                self._entries.move_to_end(key)
            return count

    def put(self, key: CacheKey, count: int) -> None:
        self.refresh((key,), (count,))

    def refresh(self, keys: Sequence[CacheKey], counts: Sequence[int]) -> None:
        """Put entries as just used (those still held move to the newest end), under one lock."""
        with self._lock:
            for key, count in zip(keys, counts, strict=True):
                self._entries[key] = count
                self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
