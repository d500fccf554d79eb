"""What the gateway reads back from native answers: usage in each API's place, in-stream overflows."""

from __future__ import annotations

import orjson

from gateway.overflow import classify_stream_error
from gateway.relay import prompt_tokens, prompt_tokens_from_sse_tail, usage_from_json
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
