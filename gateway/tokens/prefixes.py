"""The latest message list of recent conversations, so a growing conversation's history is
recognised by comparison instead of being keyed again, message by message, on every request.

Keying a message for the count cache (`cache.py`) serializes it with sorted
keys and hashes the result: ~0.5 µs per KB, so a 100 KB agent conversation
paid ~50 µs per request to learn that nothing but its newest message was new.
Here a conversation is found by its opening (the count cache's keys of its
first messages), and the request's messages are compared with the remembered
ones as the compact JSON orjson writes for them (~10 GB/s, key order kept),
stopping at the first difference. Only messages after that point are keyed
and tokenized. Comparing JSON rather than Python values keeps counts exact:
`1`, `1.0` and `true` are equal in Python but not the same tokens.

Several conversations may share an opening (an app's fixed system prompt and
first question): each opening keeps its `PER_OPENING` most recent lists. The
store is bounded by the bytes it holds (`DEFAULT_MAX_BYTES`), least recently
used openings first out. Lookups come from the event loop and counting
threads, hence the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

from gateway.json_bytes import dumps_kept
from gateway.openings import Openings
from gateway.tokens.cache import CacheKey

DEFAULT_MAX_BYTES: Final = 32 * 1024 * 1024
PER_OPENING: Final = 4


@dataclass(frozen=True, eq=False)  # compared by identity: one entry is never equal to another
class Remembered:
    """One conversation as last counted: each message's JSON, count cache key and raw count."""

    encoded: tuple[bytes, ...]
    keys: tuple[CacheKey, ...]
    counts: tuple[int, ...]

    @cached_property
    def size(self) -> int:
        return sum(len(message) for message in self.encoded)


class Encoded:
    """A request's messages as JSON, each written once, when a comparison first needs it
    (None for a message that has no JSON: not serializable), or all given by the parse."""

    def __init__(self, messages: Sequence[Any], written: Sequence[bytes] | None = None) -> None:
        self.messages = messages
        self.done: list[bytes | None] = (
            list(written) if written is not None and len(written) == len(messages) else []
        )

    def __len__(self) -> int:
        return len(self.messages)

    def all(self) -> list[bytes | None]:
        while len(self.done) < len(self.messages):
            self._write_next()
        return self.done

    def _write_next(self) -> None:
        try:
            self.done.append(dumps_kept(self.messages[len(self.done)]))
        except TypeError:
            self.done.append(None)

    def shared_with(self, remembered: Remembered) -> int:
        """How many leading messages this request has in common with `remembered`."""
        done = self.done
        for index, theirs in enumerate(remembered.encoded[: len(self.messages)]):
            if index == len(done):
                self._write_next()
            if done[index] != theirs:
                return index
        return min(len(self.messages), len(remembered.encoded))


class ConversationPrefixes:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._openings: Openings[Remembered] = Openings(PER_OPENING, max_bytes)
        self._lock = threading.Lock()

    def longest(self, opening: CacheKey, messages: Encoded) -> tuple[Remembered | None, int]:
        """The remembered conversation sharing the most leading messages with `messages`, and how many."""
        with self._lock:
            candidates = self._openings.newest_first(opening)
        best: Remembered | None = None
        best_shared = 0
        for candidate in candidates:  # newest first
            shared = messages.shared_with(candidate)
            if shared > best_shared:
                best, best_shared = candidate, shared
                if shared >= len(messages) - 1 or shared == len(candidate.encoded):
                    break  # one message left to gain at most, or the newest conversation this one continues
        return best, best_shared

    def remember(self, opening: CacheKey, conversation: Remembered, replaces: Remembered | None) -> None:
        """Keep `conversation` as its opening's newest, in place of `replaces`, the one it grew from
        or rewrote the newest message of (a conversation that branched off earlier keeps its own
        entry beside it: both may go on)."""
        with self._lock:
            self._openings.remember(opening, conversation, replaces)

    def clear(self) -> None:
        with self._lock:
            self._openings.clear()

    @property
    def size(self) -> int:
        """Bytes held."""
        return self._openings.size

    def __len__(self) -> int:
        return len(self._openings)
