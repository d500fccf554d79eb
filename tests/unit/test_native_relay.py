"""What the gateway reads back from native answers: usage in each API's place, in-stream overflows."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gateway.proxy.overflow import classify_stream_error
from gateway.proxy.relay import (
    TAIL_BYTES,
    prompt_tokens,
    prompt_tokens_from_sse_tail,
    relay_sse,
    usage_from_json,
)
from gateway.routes.responses import _past_preamble
from tests.fakes import anthropic_api, responses_api
from tests.fakes.answers import Identity, Usage

IDENTITY = Identity("id_1", 1, "m")


def test_anthropic_usage_adds_cached_tokens() -> None:
    """Anthropic reports cache reads and writes apart from input_tokens: the prompt is their sum."""
    usage = {**anthropic_api.usage(100, 5), "cache_read_input_tokens": 900, "cache_creation_input_tokens": 40}
    body = anthropic_api.message(IDENTITY, [{"type": "text", "text": "x"}], "end_turn", usage)
    assert prompt_tokens(usage_from_json(orjson.dumps(body))) == 1040


def test_anthropic_stream_states_usage_in_message_start() -> None:
    events = anthropic_api.events(
        IDENTITY, [{"type": "text", "text": "hi"}], "end_turn", anthropic_api.usage(77, 3)
    )
    head, tail = events[0], b"".join(events[-2:])
    assert prompt_tokens_from_sse_tail(tail) is None  # message_delta carries output tokens only
    assert prompt_tokens_from_sse_tail(head) == 77


def _every_event_parsed(tail: bytes) -> int | None:
    """The reading the search must match: every event of the tail parsed, the last that states a
    prompt count winning."""
    for event in reversed(tail.split(b"\n\n")):
        for line in event.split(b"\n"):
            tokens = prompt_tokens(usage_from_json(line[5:])) if line.startswith(b"data:") else None
            if tokens is not None:
                return tokens
    return None


_USAGES = st.one_of(
    st.fixed_dictionaries({"prompt_tokens": st.integers(-2, 9), "completion_tokens": st.integers(0, 9)}),
    st.fixed_dictionaries(
        {"input_tokens": st.integers(0, 9)}, optional={"cache_read_input_tokens": st.integers(0, 9)}
    ),
    st.fixed_dictionaries({"output_tokens": st.integers(0, 9)}),
    st.just("usage"),
)
_EVENTS = st.one_of(
    st.builds(lambda u: {"type": "message_delta", "usage": u}, _USAGES),
    st.builds(lambda u: {"type": "message_start", "message": {"usage": u}}, _USAGES),
    st.builds(lambda u: {"type": "response.completed", "response": {"usage": u}}, _USAGES),
    st.builds(
        lambda text: {"choices": [{"delta": {"content": text}}]},
        st.sampled_from(['"usage"', "input_tokens", "x"]),
    ),
).map(lambda payload: b"data: " + orjson.dumps(payload))
_NOISE = st.sampled_from([b"event: ping", b"data: [DONE]", b"data: {broken", b": comment", b""])


@given(
    st.lists(st.one_of(_EVENTS, _NOISE), max_size=12),
    st.integers(0, 40),
    st.sampled_from([b"\n\n", b"\n\n\n", b"\n"]),
)
@example([b'data: {"usage": {"prompt_tokens": 3}}', b'data: {"usage": {"output_tokens": 4}}'], 0, b"\n\n")
def test_the_usage_search_reads_what_parsing_every_event_reads(
    events: list[bytes], cut: int, gap: bytes
) -> None:
    """Jumping to events that name a usage and a prompt count finds what parsing them all finds,
    however the tail was cut (a tail starts anywhere inside an event)."""
    tail = gap.join(events)[cut:]
    assert prompt_tokens_from_sse_tail(tail) == _every_event_parsed(tail)


def test_responses_usage_in_completed_event_and_body() -> None:
    output = [
        {"type": "message", "id": "m", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]}
    ]
    events = responses_api.events(IDENTITY, {}, output, Usage(55, 2))
    assert prompt_tokens_from_sse_tail(b"".join(events[-2:])) == 55
    body = responses_api.response(IDENTITY, {}, status="completed", output=output, usage=Usage(55, 2))
    assert prompt_tokens(usage_from_json(orjson.dumps(body))) == 55


def test_responses_failed_event_is_an_overflow() -> None:
    overflow = classify_stream_error(b"".join(responses_api.failed_events(IDENTITY, {})))
    assert overflow is not None and overflow.window is None


def test_completed_stream_mentioning_context_is_no_overflow() -> None:
    text = "context_length_exceeded is what the API says when " * 3
    output = [
        {
            "type": "message",
            "id": "m",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        }
    ]
    assert classify_stream_error(b"".join(responses_api.events(IDENTITY, {}, output, Usage(1, 1)))) is None


def test_a_responses_stream_head_is_complete_once_past_its_two_opening_events() -> None:
    """The opening events echo the request's settings (here a long instruction): the first
    event after them completes the head, wherever a chunk boundary falls."""
    output = [
        {"type": "message", "id": "m", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]}
    ]
    settings = {"instructions": "data: looks like an event\n" * 200}
    events = responses_api.events(IDENTITY, settings, output, Usage(5, 1))
    opening = b"".join(events[:2])
    assert not _past_preamble(opening)
    assert not _past_preamble(opening + events[2][:12])  # the third event cut before its type
    assert _past_preamble(opening + events[2])
    failed = b"".join(responses_api.failed_events(IDENTITY, settings))
    assert _past_preamble(failed)


async def _relayed_tail(stream: bytes, chunk_size: int) -> bytes:
    chunks = [stream[i : i + chunk_size] for i in range(0, len(stream), chunk_size)]

    async def rest() -> AsyncIterator[bytes]:
        for chunk in chunks[1:]:
            yield chunk

    tails: list[bytes] = []
    relayed = [
        piece async for piece in relay_sse(chunks[0], rest(), idle_timeout=1, on_complete=tails.append)
    ]
    assert b"".join(relayed) == stream  # relayed as it came
    return tails[0]


@pytest.mark.parametrize("chunk_size", [100, 1500, 1 << 20])
async def test_usage_is_read_from_a_last_event_longer_than_the_tail(chunk_size: int) -> None:
    """The Responses API's last event echoes the tools: with 20 of them it is ~11 KB."""
    tools = [
        {"type": "function", "name": f"tool_{i}", "description": "d " * 200, "parameters": {"type": "object"}}
        for i in range(20)
    ]
    output = [
        {
            "type": "message",
            "id": "m",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi"}],
        }
    ]
    events = responses_api.events(IDENTITY, {"tools": tools}, output, Usage(123, 5))
    assert len(events[-1]) > 2 * TAIL_BYTES
    tail = await _relayed_tail(b"".join(events), chunk_size)
    assert prompt_tokens_from_sse_tail(tail) == 123
    assert len(tail) < len(events[-1]) + TAIL_BYTES  # the last events, not the whole stream


async def test_a_long_stream_hands_on_a_bounded_tail() -> None:
    deltas = b"".join(b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i for i in range(20_000))
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":77,"completion_tokens":20000}}\n\ndata: [DONE]\n\n'
    tail = await _relayed_tail(deltas + usage, 512)
    assert prompt_tokens_from_sse_tail(tail) == 77
    assert len(tail) <= TAIL_BYTES + 512
