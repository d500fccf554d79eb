"""Incremental parsing (gateway/wire/incremental.py): a growing conversation's repeated head is
recognised by its bytes and taken from the previous body, and whatever the bytes, the result is
exactly what parsing the whole body gives — the same payload, or the same 400."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.wire.anthropic_validation import validate_messages_body
from gateway.wire.chat import validate_chat_body
from gateway.wire.incremental import MIN_BODY_BYTES, PER_OPENING, IncrementalParser, Validator
from gateway.wire.responses_validation import validate_responses_body

SYSTEM = "You are a coding agent working in a large repository. " * 60  # ~3 KB: one opening for all


def step(number: int, size: int = 2400) -> list[dict[str, Any]]:
    call = f"call_{number}"
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {"name": "read", "arguments": f'{{"n":{number}}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": f"line {number} of the file ü\n" * (size // 24)},
    ]


def conversation(steps: int, task: str = "fix the failing test") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task},
    ]
    for number in range(steps):
        messages += step(number)
    return messages


def body(messages: list[Any], **extra: Any) -> bytes:
    return orjson.dumps({"model": "gpt-4o", "messages": messages, **extra})


def outcome(parse: Any) -> Any:
    """The payload, or the error's status, message and param."""
    try:
        return parse()
    except GatewayError as error:
        return ("error", error.status, error.message, error.param)
    except orjson.JSONDecodeError:
        return ("invalid json",)


def whole(raw: bytes, validate: Validator = validate_chat_body) -> Any:
    def parse() -> Any:
        payload = orjson.loads(raw)
        validate(payload, 0)
        return payload

    return outcome(parse)


def test_a_growing_conversation_reuses_every_message_of_its_last_body() -> None:
    parser = IncrementalParser("messages")
    first = conversation(8)
    assert len(body(first)) > MIN_BODY_BYTES
    before = parser.parse(body(first), validate_chat_body)
    assert before.reused == 0 and len(parser) == 1
    grown = [*first, *step(8)]
    after = parser.parse(body(grown), validate_chat_body)
    assert after.reused == len(first)
    assert after.payload == orjson.loads(body(grown))
    # The first body's parsed messages themselves: nothing parsed or validated twice.
    assert all(a is b for a, b in zip(after.payload["messages"], before.payload["messages"], strict=False))
    assert after.encoded == tuple(orjson.dumps(message) for message in grown)
    # The next step builds on the grown body, which replaced the one it grew from.
    assert parser.parse(body([*grown, *step(9)]), validate_chat_body).reused == len(grown)
    assert len(parser) == 1


def test_a_retry_with_a_new_latest_message_reuses_all_but_it() -> None:
    parser = IncrementalParser("messages")
    messages = [*conversation(8), {"role": "user", "content": "first try"}]
    parser.parse(body(messages), validate_chat_body)
    retried = [*messages[:-1], {"role": "user", "content": "second try"}]
    parsed = parser.parse(body(retried), validate_chat_body)
    assert parsed.reused == len(messages) - 1
    assert parsed.payload == orjson.loads(body(retried))


def test_an_invalid_new_message_is_refused_with_its_own_index() -> None:
    parser = IncrementalParser("messages")
    messages = conversation(8)
    parser.parse(body(messages), validate_chat_body)
    bad = [*messages, {"role": "robot", "content": "hi"}]
    with pytest.raises(GatewayError) as refused:
        parser.parse(body(bad), validate_chat_body)
    assert refused.value.param == f"messages[{len(messages)}].role"
    assert outcome(lambda: parser.parse(body(bad), validate_chat_body).payload) == whole(body(bad))


def test_a_second_messages_key_is_read_as_a_whole_parse_reads_it() -> None:
    """A body with the remembered head in one `messages` array and another array under the same
    key later: orjson keeps the last, and so must the reuse (or a count could be bypassed)."""
    parser = IncrementalParser("messages")
    messages = conversation(8)
    parser.parse(body(messages), validate_chat_body)
    smuggled = body(messages)[:-1] + b',"messages":[{"role":"user","content":"tiny"}]}'
    parsed = parser.parse(smuggled, validate_chat_body)
    assert parsed.reused == 0
    assert parsed.payload["messages"] == [{"role": "user", "content": "tiny"}]


def test_the_head_in_another_field_is_not_taken_for_the_prompt() -> None:
    parser = IncrementalParser("messages")
    messages = conversation(8)
    decoy = orjson.dumps({"model": "gpt-4o", "metadata": {"messages": messages}, "messages": messages[:2]})
    parser.parse(decoy, validate_chat_body)
    again = decoy[:-2] + b',{"role":"user","content":"next"}]}'
    parsed = parser.parse(again, validate_chat_body)
    assert parsed.payload == orjson.loads(again)
    assert len(parsed.payload["messages"]) == 3


def test_bodies_laid_out_otherwise_are_parsed_whole_and_remembered_nowhere() -> None:
    parser = IncrementalParser("messages")
    messages = conversation(8)
    spaced = json.dumps({"model": "gpt-4o", "messages": messages}).encode()  # ", " and ": ", \\u escapes
    assert parser.parse(spaced, validate_chat_body).payload == orjson.loads(spaced)
    assert len(parser) == 0


def test_small_bodies_are_parsed_whole() -> None:
    parser = IncrementalParser("messages")
    small = body([{"role": "user", "content": "hi"}])
    assert parser.parse(small, validate_chat_body).payload == orjson.loads(small)
    assert len(parser) == 0


def test_the_store_is_bounded() -> None:
    parser = IncrementalParser("messages", max_bytes=400_000)
    for number in range(40):
        parser.parse(body(conversation(8, task=f"task {number}")), validate_chat_body)
    assert len(parser) <= PER_OPENING  # one opening (the system prompt's first 4 KB)
    held = parser.size
    assert held <= 400_000
    # The newest conversation is the one found again.
    newest = conversation(8, task="task 39")
    assert parser.parse(body([*newest, *step(8)]), validate_chat_body).reused == len(newest)


@pytest.mark.parametrize(
    ("field", "validate", "shape"),
    [
        ("messages", validate_messages_body, "anthropic"),
        ("input", validate_responses_body, "responses"),
    ],
)
def test_native_formats_reuse_their_prompt_lists(field: str, validate: Validator, shape: str) -> None:
    def native(turns: int) -> bytes:
        items: list[dict[str, Any]] = []
        for number in range(turns):
            items.append({"role": "user", "content": f"question {number} " * 300})
            items.append({"role": "assistant", "content": f"answer {number} " * 300})
        if shape == "anthropic":
            anthropic = {"model": "claude-sonnet-4-5", "max_tokens": 100, "system": SYSTEM, field: items}
            return orjson.dumps(anthropic)
        return orjson.dumps({"model": "gpt-4o", "instructions": SYSTEM, field: items})

    parser = IncrementalParser(field)
    parser.parse(native(6), validate)
    parsed = parser.parse(native(7), validate)
    assert parsed.reused == 12
    assert parsed.payload == orjson.loads(native(7))


# --- whatever the bytes: the same result as parsing them whole ---------------------------------

edits = st.sampled_from(
    [
        "grow",
        "grow",
        "grow",
        "retry",
        "rewrite_old",
        "bad_new",
        "duplicate_key",
        "truncate",
        "trailing_garbage",
        "spaced",
        "float",
        "other_task",
        "shrink",
        "key_order",
    ]
)


def edited(previous: list[dict[str, Any]], edit: str, number: int) -> tuple[list[dict[str, Any]], bytes]:
    messages = [dict(message) for message in previous]
    if edit == "grow":
        messages += step(number)
    elif edit == "retry":
        messages[-1] = {"role": "user", "content": f"again {number}"}
    elif edit == "rewrite_old":  # the oldest message after the system prompt (shrink keeps two)
        messages[1] = {**messages[1], "content": f"rewritten {number}"}
    elif edit == "bad_new":
        return messages, body([*messages, {"role": "user", "content": 5}])
    elif edit == "duplicate_key":
        return messages, body(messages)[:-1] + b',"messages":[{"role":"user","content":"x"}]}'
    elif edit == "truncate":
        raw = body(messages)
        return messages, raw[: len(raw) - 40]
    elif edit == "trailing_garbage":
        return messages, body(messages) + b"]"
    elif edit == "spaced":
        return messages, json.dumps({"model": "gpt-4o", "messages": messages}).encode()
    elif edit == "float":
        messages.append({"role": "user", "content": "n", "weight": 1e-05 * number})
    elif edit == "other_task":
        messages = conversation(number % 3 + 6, task=f"task {number}")
    elif edit == "shrink":
        messages = messages[: max(2, len(messages) // 2)]
    elif edit == "key_order":
        raw = orjson.dumps({"messages": messages, "model": "gpt-4o", "stream": number % 2 == 0})
        return messages, raw
    return messages, body(messages)


@settings(max_examples=80, deadline=None)
@given(script=st.lists(edits, min_size=1, max_size=12))
def test_every_body_parses_as_a_whole_parse_would(script: list[str]) -> None:
    parser = IncrementalParser("messages")
    messages = conversation(7)
    parser.parse(body(messages), validate_chat_body)
    messages = [*messages, *step(7)]
    assert parser.parse(body(messages), validate_chat_body).reused == 16  # every example reuses
    for number, edit in enumerate(script):
        messages, raw = edited(messages, edit, number)
        got = outcome(lambda raw=raw: parser.parse(raw, validate_chat_body).payload)  # type: ignore[misc]
        assert got == whole(raw), edit
