"""Parsing a growing conversation's body in proportion to its new part.

An agent sends its whole conversation again after every step: the body of the
next request is the last one's bytes up to its newest message, then a few new
messages. Parsing and validating the repeated head again cost most of the
gateway's own work on a 100 KB body. Here the head is recognised by its bytes
and its parsed, validated messages are taken from the last request instead.

A body is remembered when its prompt list (`messages`, or `input`) is laid
out as orjson writes it (compact, key order kept: what httpx, the OpenAI and
Anthropic SDKs and `JSON.stringify` send): each message's JSON is then a
slice of the body, checked with `startswith` at its offset. A later body
that starts with the same bytes up to the end of message k is parsed with
those k messages cut out and one marker value put in their place: the
marker, a random integer nobody outside the process can know, must come
back as the first element of the parsed prompt list, which proves the cut
was that list's head, not a look-alike elsewhere in the body (a duplicate
key, a nested field). The k remembered objects then replace it.

What follows the prompt list repeats as well: an agent's tool definitions
(often 10-30 KB, in the SDKs' key order after the messages) and settings.
When a body ends with the same bytes, from the `]` closing its list, as the
body it continues, those bytes are cut too and replaced by a marker member
(a random key) closing the object: it must come back as the parsed object's
last member, which proves the cut ends a list in the top-level object, where
the remembered bytes were parsed before. The members they set are then set
again, one by one as a parse sets them (a member repeated from before the
list keeps its place and takes the later value), unless they set the prompt
list itself again: that body is parsed the other way. Anything
unexpected — the marker missing, invalid JSON, a validation error, whose
message names indices — falls back to parsing the whole body.

The messages (and the members after them) are shared between requests, so
nothing may mutate a parsed payload's values (nothing does: compression and the wire formats build new
ones, which the compression property tests check). Bodies under
`MIN_BODY_BYTES` are parsed whole: the gain is in proportion to the size.
Conversations are found by their first `KEY_BYTES`; each such opening keeps
its `PER_OPENING` most recent conversations, and the store is bounded by the
bytes it holds (`DEFAULT_MAX_BYTES`), least recently used first out. A body
costs at most `PER_OPENING` × 2 memcmp passes over it before its parse, one
more for its end, and
a body that fails the reuse is parsed whole: work stays linear in its size.
Used from the event loop only, hence no lock.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

import orjson

from gateway.errors import GatewayError
from gateway.json_bytes import dumps_kept
from gateway.openings import Openings

MIN_BODY_BYTES: Final = 16 * 1024
KEY_BYTES: Final = 4096
PER_OPENING: Final = 8
DEFAULT_MAX_BYTES: Final = 32 * 1024 * 1024

# Validates a payload whose first `known` prompt entries were validated before.
Validator = Callable[[object, int], None]


@dataclass(frozen=True, eq=False)  # compared by identity
class Members:
    """A body from the `]` closing its prompt list to its end: the members after the list. Bodies
    of one conversation that end alike share one, so the members are parsed once."""

    raw: bytes

    @cached_property
    def parsed(self) -> dict[str, Any] | None:
        """The members, as the body's parse set them (None: not an object's members). Parsed the
        first time a body reuses them."""
        if not self.raw.startswith(b"],"):
            return None
        try:
            members = orjson.loads(b"{" + self.raw[2:])
        except orjson.JSONDecodeError:
            return None
        return members if isinstance(members, dict) else None


@dataclass(frozen=True, eq=False)  # compared by identity
class Head:
    """A body as remembered: its bytes, where its prompt list starts, each entry laid out as
    orjson writes it (where it ends in the body, its JSON, its parsed object), and the members
    after the list (when every entry is laid out)."""

    raw: bytes
    start: int
    ends: tuple[int, ...]
    encoded: tuple[bytes, ...]
    messages: tuple[Any, ...]
    tail: Members | None

    @property
    def size(self) -> int:
        """The bytes held: the body, its entries' JSON once more, their parsed objects (taken to
        be about as large as their JSON), and the members after the list, as bytes and parsed."""
        tail = 0 if self.tail is None else len(self.tail.raw)
        return len(self.raw) + 2 * (self.ends[-1] - self.start) + 2 * tail

    def shared_with(self, raw: bytes) -> int:
        """How many leading entries `raw` has byte for byte as this body has them: all (it grew from
        this one), all but the newest (a retry, an edit of the newest), or none as far as this
        is concerned (an older entry was rewritten: the body is parsed whole). Two passes of
        memcmp over it at most, so a body costs at most `PER_OPENING` × 2 of them. The newest entry
        is compared first (once more, when it matches): when it differs, the whole head would
        differ only at its end, one pass for nothing."""
        body, ends = memoryview(self.raw), self.ends
        count = len(ends)
        newest = self.start if count == 1 else ends[-2] + 1  # after the comma ending the entry before
        if raw.startswith(body[newest : ends[-1]], newest) and raw.startswith(body[: ends[-1]]):
            return count
        if count > 1 and raw.startswith(body[: ends[-2]]):
            return count - 1
        return 0


@dataclass(frozen=True)
class Parsed:
    payload: dict[str, Any]
    # Each prompt entry's compact JSON, when the body was laid out that way (the count compares it).
    encoded: tuple[bytes, ...] | None = None
    reused: int = 0  # leading entries taken from an earlier request


class IncrementalParser:
    def __init__(self, field: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.field = field
        self._key_prefix = b'"' + field.encode() + b'":['
        self._openings: Openings[Head] = Openings(PER_OPENING, max_bytes)
        self._marker = secrets.randbits(62)
        self._marker_bytes = str(self._marker).encode()
        self._marker_key = f"x-gateway-{secrets.token_hex(8)}"
        self._marker_member = b'],"' + self._marker_key.encode() + b'":0}'

    def parse(self, raw: bytes, validate: Validator) -> Parsed:
        """The validated payload of `raw`; raises what `orjson.loads` or `validate` raise."""
        if len(raw) < MIN_BODY_BYTES:
            return Parsed(_whole(raw, validate))
        key = hash(raw[:KEY_BYTES])
        found, shared = self._longest(key, raw)
        if found is not None:
            parsed = self._with_head(raw, key, found, shared, validate)
            if parsed is not None:
                return parsed
        payload = _whole(raw, validate)
        entries = payload.get(self.field)
        if not isinstance(entries, list) or not entries:
            return Parsed(payload)
        encoded = _encoded(entries)
        if encoded is None:
            return Parsed(payload)
        start = raw.find(self._key_prefix + encoded[0])
        if start < 0:
            return Parsed(payload, encoded)  # not laid out as orjson writes it: nothing to find next time
        start += len(self._key_prefix)
        self._remember(key, _laid_out(raw, start, _ends(raw, start, encoded), encoded, entries, None), None)
        return Parsed(payload, encoded)

    def _with_head(self, raw: bytes, key: int, head: Head, shared: int, validate: Validator) -> Parsed | None:
        start, end = head.start, head.ends[shared - 1]
        # The members after the prompt list (tool definitions, settings) repeat too: when the body
        # ends with the same bytes, they are cut as well (module docstring).
        tail = head.tail
        cut = len(raw) - (0 if tail is None else len(tail.raw))
        trailing = tail.parsed if tail is not None and cut >= end and raw.endswith(tail.raw) else None
        if trailing is not None and self.field in trailing:
            trailing = None  # a second prompt list after the first: the whole parse decides
        if trailing is None:
            text = b"".join((raw[:start], self._marker_bytes, raw[end:]))
        else:
            text = b"".join((raw[:start], self._marker_bytes, raw[end:cut], self._marker_member))
        try:
            payload = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        entries = payload.get(self.field) if isinstance(payload, dict) else None
        if not isinstance(entries, list) or not entries:
            return None
        first = entries[0]
        if type(first) is not int or first != self._marker:
            return None  # the cut was not the head of the prompt list the body is read with
        if trailing is not None:
            if next(reversed(payload)) != self._marker_key or payload.pop(self._marker_key) != 0:
                return None
            # Set one by one, as the parse would have: a member also set earlier keeps its place.
            for name, value in trailing.items():
                payload[name] = value
        try:
            validate(payload, 1)
        except GatewayError:
            return None  # parsed whole again, for an error that names the right index
        new = entries[1:]
        entries[:] = [*head.messages[:shared], *new]
        added = _encoded(new)
        if added is None:
            return Parsed(payload, reused=shared)
        encoded = head.encoded[:shared] + added
        # The new entries are remembered as far as they too are laid out as orjson writes them.
        ends = head.ends[:shared] + (_ends(raw, end + 1, added) if raw[end : end + 1] == b"," else ())
        grown = _laid_out(raw, start, ends, encoded, entries, tail)
        replaces = head if shared >= len(head.ends) - 1 else None
        self._remember(key, grown, replaces)
        return Parsed(payload, encoded, shared)

    def _longest(self, key: int, raw: bytes) -> tuple[Head | None, int]:
        """The remembered body sharing the most leading entries with `raw`, and how many."""
        best: Head | None = None
        best_shared = 0
        for head in self._openings.newest_first(key):
            shared = head.shared_with(raw)
            if shared > best_shared:
                best, best_shared = head, shared
                if shared == len(head.ends):
                    break  # the newest conversation this body continues
        return best, best_shared

    def _remember(self, key: int, head: Head, replaces: Head | None) -> None:
        if head.encoded:
            self._openings.remember(key, head, replaces)

    @property
    def size(self) -> int:
        """Bytes held (the parsed messages estimated)."""
        return self._openings.size

    def __len__(self) -> int:
        return len(self._openings)


def _whole(raw: bytes, validate: Validator) -> dict[str, Any]:
    payload = orjson.loads(raw)
    validate(payload, 0)
    return payload  # type: ignore[no-any-return]  # validate refuses anything but an object


def _encoded(entries: Sequence[Any]) -> tuple[bytes, ...] | None:
    try:
        return tuple(dumps_kept(entry) for entry in entries)
    except TypeError:
        return None


def _laid_out(
    raw: bytes,
    start: int,
    ends: tuple[int, ...],
    encoded: tuple[bytes, ...],
    entries: Sequence[Any],
    previous: Members | None,
) -> Head:
    """The body remembered with its entries as far as `ends` found them laid out, and the members
    after its list when all were: `previous` when the body ends with the same bytes."""
    laid_out = len(ends)
    tail: Members | None = None
    if laid_out == len(entries) and raw[ends[-1] : ends[-1] + 1] == b"]":
        if previous is not None and len(raw) - ends[-1] == len(previous.raw) and raw.endswith(previous.raw):
            tail = previous
        else:
            tail = Members(raw[ends[-1] :])
    return Head(raw, start, ends, encoded[:laid_out], tuple(entries[:laid_out]), tail)


def _ends(raw: bytes, start: int, encoded: Sequence[bytes]) -> tuple[int, ...]:
    """Where each of the leading `encoded` that follow each other in `raw` from `start`,
    comma-separated, ends."""
    ends: list[int] = []
    offset = start
    for entry in encoded:
        if not raw.startswith(entry, offset):
            break
        end = offset + len(entry)
        ends.append(end)
        if raw[end : end + 1] != b",":
            break
        offset = end + 1
    return tuple(ends)
