"""The JSON the conversation memories keep of each message is held in a buffer of its own size.

orjson returns its output in the buffer it wrote into (at least 4 KiB, ~8x a long string), and
the memories weigh what they keep by its length: kept as orjson wrote it, 60,000 short messages
held ~240 MiB where their bound counted 2 MiB, and a gateway fed distinct conversations of
short messages grew by gigabytes within its byte bounds (gateway/json_bytes.py)."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import orjson

import gateway  # noqa: F401  (offline tiktoken cache)
from gateway.json_bytes import dumps_kept
from gateway.tokens.prefixes import Encoded
from gateway.wire.chat import validate_chat_body
from gateway.wire.incremental import IncrementalParser
from gateway.wire.responses import ResponsesInput
from gateway.wire.responses_memory import Conversions

COUNT = 3000
# A bytes object's header and its slot in the tuple or list holding it, with room for the
# allocator's rounding; orjson's own buffers are 4 KiB each.
PER_ENTRY = 96


def held(build: Callable[[], Sequence[bytes | None]]) -> tuple[int, Sequence[bytes | None]]:
    """Bytes allocated by `build` and still held by what it returns, and what it returned."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, kept
    finally:
        tracemalloc.stop()


def assert_compact(size: int, kept: Sequence[bytes | None]) -> None:
    lengths = sum(len(entry) for entry in kept if entry is not None)
    assert len(kept) >= COUNT
    assert size <= lengths + PER_ENTRY * len(kept), (size, lengths, len(kept))


def short_messages(tag: str = "") -> list[dict[str, Any]]:
    return [
        {"role": "user" if number % 2 == 0 else "assistant", "content": f"{tag}m{number}"}
        for number in range(COUNT)
    ]


def test_kept_json_is_exactly_its_length() -> None:
    values = short_messages()
    size, kept = held(lambda: tuple(dumps_kept(value) for value in values))
    assert list(kept) == [orjson.dumps(value) for value in values]
    assert_compact(size, kept)


def test_the_parse_keeps_each_entry_s_json_compact() -> None:
    raw = orjson.dumps({"model": "gpt-4o", "messages": short_messages()})
    parser = IncrementalParser("messages", max_bytes=0)  # remembers nothing: only the JSON is held

    def encoded() -> Sequence[bytes]:
        parsed = parser.parse(raw, validate_chat_body)
        assert parsed.encoded is not None
        return parsed.encoded

    assert_compact(*held(encoded))


def test_the_count_s_comparison_keeps_each_message_s_json_compact() -> None:
    messages = orjson.loads(orjson.dumps(short_messages()))
    assert_compact(*held(lambda: Encoded(messages).all()))


def test_the_responses_view_keeps_each_message_s_json_compact() -> None:
    items = [{"role": message["role"], "content": message["content"]} for message in short_messages()]
    payload = orjson.loads(orjson.dumps({"model": "gpt-4o", "input": items}))
    wire = ResponsesInput(Conversions(max_bytes=0))

    def encoded() -> Sequence[bytes]:
        view = wire.view(payload)
        assert view.encoded is not None
        return view.encoded

    assert_compact(*held(encoded))
