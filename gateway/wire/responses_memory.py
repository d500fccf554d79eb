"""The chat messages a Responses conversation's items made last time, so a growing conversation
converts only its new items.

A Responses view builds new chat messages from the items on every request
(`responses.py`): on a 100 KB agent conversation, building them and then
writing every one of them as JSON again for the count took ~10% of the
gateway's CPU, for a request whose items were all known but the newest.

The parse hands out the very same item objects for a conversation's known
head (`incremental.py`), so the head is recognised by identity, item by item.
The messages made from it are taken as they are, with their JSON, up to the
last one that the new items cannot change: it ends before the known head
does (a run of model-side items that reached the head's end may go on), and
no call is left unanswered after it. Conversion goes on from there, and the
count compares the same JSON objects (instant) instead of writing them again.

An entry holds its items, so an item's `id` (the key: the conversation's
first item) is never another object's while the entry exists. Each key keeps
its `PER_OPENING` most recent conversations; the store is bounded by the
bytes it holds, least recently used first out. Used from the event loop only.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from typing import Any, Final

from gateway.openings import Openings
from gateway.wire.base import Message

PER_OPENING: Final = 8
DEFAULT_MAX_BYTES: Final = 32 * 1024 * 1024


@dataclass(frozen=True, eq=False)  # compared by identity
class Converted:
    """One conversation's items and the chat messages made from them, each message with the item
    indices it stands for, whether it is a run (model-side items, which later ones may join),
    whether every call is answered after it, and its JSON."""

    items: tuple[Any, ...]
    messages: tuple[Message, ...]
    origins: tuple[range, ...]
    runs: tuple[bool, ...]
    settled: tuple[bool, ...]
    encoded: tuple[bytes, ...]

    @classmethod
    def bare(cls, messages: Sequence[Message]) -> Converted:
        """Messages that are not remembered: no items, no JSON, nothing for a later request."""
        return cls((), tuple(messages), (), (), (), ())

    @property
    def columns(self) -> tuple[tuple[Any, ...], ...]:
        """Everything kept per message, in `Converted`'s order."""
        return (self.messages, self.origins, self.runs, self.settled, self.encoded)

    @cached_property
    def size(self) -> int:
        """Bytes held: the messages' JSON, and the messages and the items they were made from, each
        taken to be as large (the items may outlive the parse's memory of them)."""
        return 3 * sum(map(len, self.encoded))

    def reusable(self, items: Sequence[Any]) -> int:
        """How many leading messages `items` makes exactly as these items did."""
        known = 0
        for ours, theirs in zip(self.items, items, strict=False):
            if ours is not theirs:
                break
            known += 1
        count = bisect_right(
            self.origins, known, key=attrgetter("stop")
        )  # messages whose items are all known
        while count and not (
            self.settled[count - 1] and (self.origins[count - 1].stop < known or not self.runs[count - 1])
        ):
            count -= 1
        return count


class Conversions:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._openings: Openings[Converted] = Openings(PER_OPENING, max_bytes)

    def longest(self, items: Sequence[Any]) -> tuple[Converted | None, int]:
        """The remembered conversation whose messages `items` reuses the most of, and how many."""
        if not items:
            return None, 0
        best: Converted | None = None
        best_count = 0
        for converted in self._openings.newest_first(id(items[0])):
            count = converted.reusable(items)
            if count > best_count:
                best, best_count = converted, count
        return best, best_count

    def remember(self, converted: Converted, replaces: Converted | None) -> None:
        if converted.items:
            self._openings.remember(id(converted.items[0]), converted, replaces)

    @property
    def size(self) -> int:
        return self._openings.size

    def __len__(self) -> int:
        return len(self._openings)
