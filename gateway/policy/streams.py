"""Counting a streamed chat completion for a team without changing what its client receives.

A stream reports its usage only when asked (``stream_options.include_usage``). When the client
did not ask, the gateway asks upstream, and then takes out of the stream exactly what asking
added, as OpenAI documents it: one extra chunk before ``[DONE]`` with ``"choices": []`` and the
usage, and a ``"usage": null`` member in every other chunk. The client sees the events it would
have seen without the gateway.

The null members are removed from the bytes, not by re-encoding the JSON, so everything else in
the event stays byte for byte. The patterns below can only match JSON structure: inside a JSON
string a quote is always escaped, so ``,"usage"`` cannot occur there.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gateway.policy.limits import Usage
from gateway.proxy.relay import RecentBytes, prompt_tokens, reported_count, usage_of

_EVENT_END = re.compile(rb"\r?\n\r?\n")
_NULL_USAGE = re.compile(rb'\s*,\s*"usage"\s*:\s*null(?=\s*[,}])|"usage"\s*:\s*null\s*,\s*')
# An event still open after this many bytes is relayed as it is (a stream that never ends its
# events must not make the gateway buffer without bound).
MAX_PENDING_BYTES = 1024 * 1024
# Of such an event, the last bytes kept to read its usage from (`StreamMeter._note_usage_in_tail`).
LONG_EVENT_TAIL = 64 * 1024
# Bytes of such an event held back from each piece: the blank line ending it may be split.
SEPARATOR_SPLIT = 3
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')


def ask_for_usage(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The request with ``stream_options.include_usage`` set, or None if it already asks (or if
    its stream_options is malformed: the upstream will say so)."""
    options = payload.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("include_usage") is True:
        return None
    return {**payload, "stream_options": {**options, "include_usage": True}}


class StreamMeter:
    """Watches a stream's events as they pass: finds the usage, counts content events.

    The usage is where each API puts it: a chat completion's last chunk; Anthropic's
    `message_start` (the prompt, cache included) and `message_delta` (the output so far); the
    Responses API's `response.completed`. An output count is final only when no delta came
    after it (Anthropic's `message_start` states one before the answer starts).

    With ``strip``, returns the stream without what the gateway's own include_usage added;
    otherwise returns every chunk unchanged (and unbuffered).
    """

    def __init__(self, *, strip: bool) -> None:
        self.strip = strip
        self.prompt: int | None = None
        self.completion: int | None = None
        # Delta events seen: about one token each, the estimate for a stream that dies early.
        self.delta_events = 0
        self._completion_final = False
        self._pending = b""
        # Chunks of the open event after `_pending` that end no event: held as they came, read
        # once more only when the event ends (each chunk scanned with all the event's bytes
        # before it made an event arriving in small pieces cost the square of its length: 33 s
        # of the event loop for 1 MB in 512-byte chunks), and their last bytes, where a blank
        # line the next chunk ends may begin.
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._last = b""
        # The end of an event too long to hold, while it is relayed piece by piece.
        self._long_tail: RecentBytes | None = None

    def feed(self, chunk: bytes) -> bytes:
        if self._long_tail is None and _EVENT_END.search(self._last + chunk) is None:
            return self._hold(chunk)
        data = self._taken() + chunk
        events = _EVENT_END.split(data)
        separators = _EVENT_END.findall(data)
        self._pending = events.pop()
        out = []
        self._last = self._pending[-SEPARATOR_SPLIT:]
        if self._long_tail is not None:  # inside an event too long to hold: relayed as it comes
            if not separators:
                out.append(self._relay_long())
                return b"".join(out) if self.strip else chunk
            end = events.pop(0)
            out.append(end + separators.pop(0))
            self._note_usage_in_tail(self._long_tail.value() + end)
            self._long_tail = None
        out_of_events = self._relay_long() if len(self._pending) > MAX_PENDING_BYTES else b""
        for event, separator in zip(events, separators, strict=True):
            kept = self._event(event)
            if kept or not event:
                out.append(kept + separator)
        out.append(out_of_events)
        return b"".join(out) if self.strip else chunk

    def _hold(self, chunk: bytes) -> bytes:
        """A chunk inside the open event, which it does not end: held (relayed at once when the
        event outgrows MAX_PENDING_BYTES, as `feed` would have relayed it)."""
        self._held.append(chunk)
        self._held_bytes += len(chunk)
        self._last = (self._last + chunk)[-SEPARATOR_SPLIT:]
        if len(self._pending) + self._held_bytes <= MAX_PENDING_BYTES:
            return b"" if self.strip else chunk
        self._pending = self._taken()
        relayed = self._relay_long()
        return relayed if self.strip else chunk

    def _taken(self) -> bytes:
        """The open event's bytes so far, the held chunks joined to them."""
        if self._held:
            self._pending = self._pending + b"".join(self._held)
            self._held.clear()
            self._held_bytes = 0
        return self._pending

    def _relay_long(self) -> bytes:
        """The pending bytes of an event too long to hold, relayed from here on, all but the last
        few (they may begin the blank line that ends it); its end so far is kept in `_long_tail`."""
        relayed, self._pending = self._pending[:-SEPARATOR_SPLIT], self._pending[-SEPARATOR_SPLIT:]
        if self._long_tail is None:
            self._long_tail = RecentBytes(LONG_EVENT_TAIL)
        self._long_tail.add(relayed)
        return relayed

    def _note_usage_in_tail(self, tail: bytes) -> None:
        """The usage of an event too long to hold, read from its end: the Responses API's
        `response.completed` echoes the whole output (images, files) before its usage."""
        # The last `"usage": {`: only strings (`user`, `metadata`) follow the usage in the event,
        # and inside a string its quotes would be escaped.
        for found in reversed(list(_USAGE_OBJECT.finditer(tail))):
            try:
                usage, _ = json.JSONDecoder().raw_decode(tail[found.end() - 1 :].decode("utf-8", "replace"))
            except ValueError:
                continue
            if isinstance(usage, dict):
                self._note(usage)
                return

    def flush(self) -> bytes:
        rest, self._pending, self._last = self._taken(), b"", b""
        if self._long_tail is not None:  # the stream ended inside an event too long to hold
            self._note_usage_in_tail(self._long_tail.value() + rest)
            self._long_tail = None
            return rest if self.strip else b""
        if not rest:
            return b""
        kept = self._event(rest)
        return kept if self.strip else b""

    def _event(self, event: bytes) -> bytes:
        """The event as the client should get it (b"" to drop it)."""
        if b'"delta"' in event:
            self.delta_events += 1
            self._completion_final = False
        if b'"usage"' not in event:
            return event
        if self.strip:
            stripped = _NULL_USAGE.sub(b"", event)
            if stripped != event:
                return stripped
        payload = _data(event)
        usage = usage_of(payload)
        if not isinstance(usage, dict):
            return event
        self._note(usage)
        if self.strip and isinstance(payload, dict) and payload.get("choices") == []:
            return b""
        return event

    def _note(self, usage: dict[str, Any]) -> None:
        # A later prompt count never lowers an earlier one: Anthropic's message_delta may restate
        # the input without the cache tokens its message_start counted.
        prompt, completion = prompt_tokens(usage), _completion_tokens(usage)
        if prompt is not None:
            self.prompt = max(prompt, self.prompt or 0)
        if completion is not None:
            self.completion, self._completion_final = completion, True

    def settlement(self, prompt_counted: int, saved: int) -> Usage:
        """The upstream's usage as far as it sent it; else the gateway's prompt count, and the
        deltas seen for the output."""
        prompt = prompt_counted if self.prompt is None else self.prompt
        final = self.completion is not None and self._completion_final
        completion = self.completion if final and self.completion is not None else self.delta_events
        return Usage(requests=1, prompt=prompt, completion=completion, saved=saved)


async def metered(
    stream: AsyncIterator[bytes], meter: StreamMeter, on_end: Callable[[], None]
) -> AsyncIterator[bytes]:
    """``stream`` through ``meter``; ``on_end`` runs however it ends (finished, broken, client gone)."""
    try:
        async for chunk in stream:
            out = meter.feed(chunk)
            if out:
                yield out
        tail = meter.flush()
        if tail:
            yield tail
    finally:
        on_end()


def _data(event: bytes) -> object:
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    try:
        return orjson.loads(b"\n".join(lines))
    except orjson.JSONDecodeError:
        return None


def usage_counts(usage: object) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a ``usage`` object, if it states both (chat completions'
    prompt/completion_tokens, or the native APIs' input/output_tokens; the prompt with the
    tokens Anthropic reports apart as cache writes and reads)."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = prompt_tokens(usage), _completion_tokens(usage)
    return None if prompt is None or completion is None else (prompt, completion)


def _completion_tokens(usage: dict[str, Any]) -> int | None:
    """The output tokens a usage object reports: chat's `completion_tokens`, else the native
    APIs' `output_tokens`."""
    return reported_count(usage.get("completion_tokens" if "completion_tokens" in usage else "output_tokens"))
