"""The most recent entries of conversations, grouped by how they open, bounded by count and bytes.

Both conversation memories (the count's `tokens/prefixes.py`, the parse's
`wire/incremental.py`) find a request's conversation among those sharing its
opening and keep, per opening, the newest few; openings leave least recently
used first while the entries' total size is over the bound. Not thread-safe:
a user called from several threads holds its own lock around it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, Protocol, TypeVar


class Weighed(Protocol):
    @property
    def size(self) -> int: ...


Entry = TypeVar("Entry", bound=Weighed)


class Openings(Generic[Entry]):
    def __init__(self, per_opening: int, max_bytes: int) -> None:
        self._per_opening = per_opening
        self._max_bytes = max_bytes
        self.size = 0
        self._openings: OrderedDict[Hashable, list[Entry]] = OrderedDict()

    def newest_first(self, opening: Hashable) -> list[Entry]:
        """The opening's entries, newest first (a copy), marking the opening as just used."""
        entries = self._openings.get(opening)
        if entries is None:
            return []
        self._openings.move_to_end(opening)
        return list(entries)

    def remember(self, opening: Hashable, entry: Entry, replaces: Entry | None) -> None:
        """Keep `entry` as its opening's newest, in place of `replaces` (one it grew from)."""
        entries = self._openings.setdefault(opening, [])
        self._openings.move_to_end(opening)
        if replaces is not None and replaces in entries:
            entries.remove(replaces)
            self.size -= replaces.size
        entries.insert(0, entry)
        self.size += entry.size
        while len(entries) > self._per_opening:
            self.size -= entries.pop().size
        while self.size > self._max_bytes and self._openings:
            _, evicted = self._openings.popitem(last=False)
            self.size -= sum(old.size for old in evicted)

    def clear(self) -> None:
        self._openings.clear()
        self.size = 0

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._openings.values())

    def __iter__(self) -> Iterator[Entry]:
        """Every entry, least recently used opening first, each opening's newest first."""
        for entries in self._openings.values():
            yield from entries
