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

Only conversations of at least `MIN_BODY_BYTES` of JSON are remembered: a
smaller body is parsed whole, so its items are new objects every time, and
remembering them cost a one-shot request ~9 µs (bench/proxy_payloads.py's
small body, in-process) for nothing. An entry holds its items, so an item's
`id` (the key: the conversation's first item) is never another object's
while the entry exists. Each key keeps its `PER_OPENING` most recent
conversations; the store is bounded by the bytes it holds, least recently
used first out. Used from the event loop only.
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
from gateway.wire.incremental import MIN_BODY_BYTES

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
    def json_bytes(self) -> int:
        """The messages' JSON, in bytes."""
        return sum(map(len, self.encoded))

    @cached_property
    def size(self) -> int:
        """Bytes held: the messages' JSON, and the messages and the items they were made from, each
        taken to be as large (the items may outlive the parse's memory of them)."""
        return 3 * self.json_bytes

    def shared_with(self, items: Sequence[Any]) -> tuple[int, int]:
        """How many leading items `items` shares with these (the very objects), and how many leading
        messages it therefore makes exactly as these items did."""
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
        return known, count


@dataclass(frozen=True)
class Reuse:
    """What a request's items take from the remembered conversation sharing the most messages."""

    converted: Converted | None = None
    messages: int = 0  # leading messages made exactly as `converted`'s
    items: int = 0  # leading items shared with `converted`

    @property
    def replaces(self) -> Converted | None:
        """The remembered conversation the request's own takes the place of: the one it grew
        from, or whose newest item it rewrote (an edit, a retry, another question after the same
        history), which will not be sent again. Otherwise it branched off earlier: both are kept."""
        converted = self.converted
        return converted if converted is not None and self.items >= len(converted.items) - 1 else None


class Conversions:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self._openings: Openings[Converted] = Openings(PER_OPENING, max_bytes)

    def longest(self, items: Sequence[Any]) -> Reuse:
        """The remembered conversation whose messages `items` reuses the most of."""
        best = Reuse()
        if not items:
            return best
        for converted in self._openings.newest_first(id(items[0])):
            known, count = converted.shared_with(items)
            if count > best.messages:
                best = Reuse(converted, count, known)
        return best

    def remember(self, converted: Converted, replaces: Converted | None) -> None:
        """Keep `converted` in place of `replaces`, if it is large enough for the parse to hand its
        items out again (module docstring)."""
        if converted.items and converted.json_bytes >= MIN_BODY_BYTES:
            self._openings.remember(id(converted.items[0]), converted, replaces)

    @property
    def size(self) -> int:
        return self._openings.size

    def __len__(self) -> int:
        return len(self._openings)
