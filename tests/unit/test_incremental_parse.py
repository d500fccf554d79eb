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


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{number}",
            "description": f"Tool number {number}. " * 40,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for number in range(12)
]


def test_the_tool_definitions_after_the_messages_are_taken_from_the_last_body_too() -> None:
    parser = IncrementalParser("messages")
    messages = conversation(8)
    parser.parse(body(messages, tools=TOOLS, stream=True), validate_chat_body)
    tools = []
    for steps in (8, 9, 10):
        messages = [*messages, *step(steps)]
        raw = body(messages, tools=TOOLS, stream=True)
        parsed = parser.parse(raw, validate_chat_body)
        assert parsed.reused == len(messages) - 2
        assert parsed.payload == orjson.loads(raw)
        assert list(parsed.payload) == ["model", "messages", "tools", "stream"]
        tools.append(parsed.payload["tools"])
    # Parsed once, from the first body that repeated them, then taken as they are.
    assert tools[0] is tools[1] is tools[2]
    # Other tools: the definitions the body holds, not the remembered ones.
    changed = [{"type": "function", "function": {**TOOLS[0]["function"], "name": "other"}}]
    raw = body([*messages, *step(11)], tools=changed, stream=True)
    assert parser.parse(raw, validate_chat_body).payload == orjson.loads(raw)


def test_members_after_the_messages_are_set_as_a_whole_parse_sets_them() -> None:
    """Repeated keys after the prompt list: a second `model` takes the first one's place; a second
    `messages` list is the one read, validated whole, and the one whose JSON is handed on."""
    messages = conversation(8)
    second_lists = (b'[{"role":"robot","content":"tiny"}]', orjson.dumps(messages))
    for extra in (b'"model":"gpt-4o-mini"', *(b'"messages":' + second for second in second_lists)):
        parser = IncrementalParser("messages")
        for raw in (
            body(messages, tools=TOOLS)[:-1] + b"," + extra + b"}",
            body([*messages, *step(8)], tools=TOOLS)[:-1] + b"," + extra + b"}",
        ):
            got = outcome(lambda raw=raw, parser=parser: parser.parse(raw, validate_chat_body))  # type: ignore[misc]
            expected = whole(raw)
            if not isinstance(expected, dict):
                assert got == expected
                continue
            assert got.payload == expected and list(got.payload) == list(expected)
            written = tuple(orjson.dumps(message) for message in got.payload["messages"])
            assert got.encoded is None or got.encoded == written


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
        "repeated_member",
        "lookalike_tail",
    ]
)


TAILS: list[dict[str, Any]] = [
    {},
    {"tools": TOOLS, "stream": False},
    {"tools": TOOLS[:3], "temperature": 0.5},
]


def edited(
    previous: list[dict[str, Any]], edit: str, number: int, tail: dict[str, Any]
) -> tuple[list[dict[str, Any]], bytes]:
    messages = [dict(message) for message in previous]

    def body(messages: list[Any]) -> bytes:
        return orjson.dumps({"model": "gpt-4o", "messages": messages, **tail})

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
    elif edit == "repeated_member":  # a member set before the list set again after it
        return messages, body([*messages, *step(number)])[:-1] + b',"model":"gpt-4o-mini"}'
    elif edit == "lookalike_tail":  # the remembered end, after a list that is not the prompt's
        grown = [*messages, *step(number)]
        raw = body(grown)
        close = len(b'{"model":"gpt-4o","messages":') + len(orjson.dumps(grown)) - 1
        return messages, raw[:close] + b'],"other":[1' + raw[close:]
    return messages, body(messages)


@settings(max_examples=120, deadline=None)
@given(script=st.lists(edits, min_size=1, max_size=12), tail=st.sampled_from(TAILS))
def test_every_body_parses_as_a_whole_parse_would(script: list[str], tail: dict[str, Any]) -> None:
    parser = IncrementalParser("messages")
    messages = conversation(7)
    parser.parse(body(messages, **tail), validate_chat_body)
    messages = [*messages, *step(7)]
    assert parser.parse(body(messages, **tail), validate_chat_body).reused == 16  # every example reuses
    for number, edit in enumerate(script):
        messages, raw = edited(messages, edit, number, tail)
        got = outcome(lambda raw=raw: parser.parse(raw, validate_chat_body).payload)  # type: ignore[misc]
        assert got == whole(raw), edit
