"""Remembered conversations (gateway/tokens/prefixes.py): a growing conversation's known head is
found by comparison, never keyed or tokenized again, and every count stays exact."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

import gateway  # noqa: F401  (offline tiktoken cache)
from gateway.chat_request import parse_chat_request
from gateway.tokens import cache as cache_module
from gateway.tokens.cache import CountCache
from gateway.tokens.calibration import Calibration
from gateway.tokens.counter import TokenCounter, request_lookup
from gateway.tokens.prefixes import ConversationPrefixes, Encoded
from gateway.wire.anthropic import ANTHROPIC
from gateway.wire.anthropic_validation import validate_messages_body
from gateway.wire.responses import RESPONSES
from gateway.wire.responses_validation import validate_responses_body
from tests.unit.test_tokens_cost import SpyEncoding


def fresh(model: str = "gpt-4o") -> TokenCounter:
    return TokenCounter(model, calibration=Calibration(), cache=CountCache())


def agent(steps: int, task: str = "fix the failing test") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 20},
        {"role": "user", "content": task},
    ]
    for step in range(steps):
        call = f"call_{step}"
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {"name": "run", "arguments": f'{{"n":{step}}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call, "content": f"step {step} output line\n" * 40},
        ]
    return messages


def reparsed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the gateway sees on the next request: new objects parsed from the client's bytes."""
    parsed: list[dict[str, Any]] = orjson.loads(orjson.dumps(messages))
    return parsed


def test_a_growing_agent_loop_keys_and_tokenizes_only_its_new_step(monkeypatch: Any) -> None:
    counter = fresh()
    counter.request({"messages": agent(10)})
    keyed: list[Any] = []
    real_key = cache_module.message_key

    def spying_key(namespace: bytes, message: Any) -> Any:
        keyed.append(message)
        return real_key(namespace, message)

    monkeypatch.setattr("gateway.tokens.counter.message_key", spying_key)
    body = {"messages": reparsed(agent(11))}
    lookup = request_lookup(counter, body)
    # The opening (system prompt and task) identifies the conversation; the 20 messages of the
    # ten known steps are taken by comparison; only the new step's two messages are keyed.
    assert lookup.shared == 22
    assert keyed == body["messages"][:2] + body["messages"][22:]
    assert [lookup.messages[i]["role"] for i in lookup.missing] == ["assistant", "tool"]
    assert counter.finish_request(body, lookup) == fresh().request(body)


def test_the_head_is_put_back_in_the_count_cache_before_a_fit() -> None:
    shared = CountCache(max_entries=60)  # room for the conversation and one round of other traffic
    counter = TokenCounter("gpt-4o", calibration=Calibration(), cache=shared)
    for steps in range(1, 12):
        body = {"messages": reparsed(agent(steps))}
        lookup = request_lookup(counter, body)
        counter.finish_request(body, lookup)
        for other in range(20):  # other traffic: over the steps, enough to push an untouched head out
            shared.put((b"other", steps, other), 1)
    assert len(shared) == 60 and shared.get(lookup.keys[2]) is None  # type: ignore[arg-type]  # pushed out
    counter.keep_warm(lookup)  # what the planner does before fitting
    # Fitting counts the same messages one by one: all found, nothing tokenized again.
    spy = SpyEncoding(counter.encoding)
    counter.encoding = spy  # type: ignore[assignment]
    for message in agent(11):
        counter.message(message)
    assert spy.texts == []


operations = st.lists(
    st.sampled_from(["grow", "grow", "edit_last", "repeat", "branch", "other_task", "retype"]),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(script=operations, model=st.sampled_from(["gpt-4o", "gpt-4", "claude-sonnet-4-5"]))
def test_counts_through_remembered_conversations_equal_a_cold_count(script: list[str], model: str) -> None:
    """Whatever a client does between requests — grow, retry, rewrite its newest message, branch
    off, start another task under the same system prompt — each count equals a cold one."""
    counter = TokenCounter(model, calibration=Calibration(), cache=CountCache())
    conversations: list[list[dict[str, Any]]] = [agent(1)]
    for number, operation in enumerate(script):
        current = copy.deepcopy(conversations[-1])
        if operation == "grow":
            current += agent(len(current) // 2)[-2:]
            current[-1]["content"] += f" grown {number}"
        elif operation == "edit_last":
            current[-1]["content"] = f"rewritten {number}"
        elif operation == "branch":
            current = [*current[: max(2, len(current) // 2)], {"role": "user", "content": f"branch {number}"}]
        elif operation == "other_task":
            current = agent(number % 4, task=f"task {number}")
        elif operation == "retype":  # the same value to Python, another JSON number or flag
            part = {
                "type": "tool_use",
                "id": "t",
                "name": "set",
                "input": {"level": (1, 1.0, True)[number % 3]},
            }
            current[-1] = {"role": "assistant", "content": [part]}
        conversations.append(current)
        body = {"messages": reparsed(current)}
        cold = TokenCounter(model, calibration=Calibration(), cache=CountCache()).request(body)
        assert counter.request(body) == cold


def test_the_store_is_bounded_by_the_bytes_it_holds() -> None:
    store = ConversationPrefixes(max_bytes=10_000)
    counter = TokenCounter("gpt-4o", calibration=Calibration(), cache=CountCache(), conversations=store)
    openings = []
    for number in range(200):
        body = {"messages": reparsed(agent(2, task=f"task {number}"))}
        counter.request(body)
        openings.append((request_lookup(counter, body).opening, body["messages"]))
    held = store.size
    assert held <= 10_000 and len(store) >= 2
    # The newest conversations are the ones kept.
    newest, oldest = openings[-1], openings[0]
    assert store.longest(newest[0], Encoded(newest[1]))[1] == len(newest[1])  # type: ignore[arg-type]
    assert store.longest(oldest[0], Encoded(oldest[1])) == (None, 0)  # type: ignore[arg-type]


def test_an_opening_keeps_its_newest_branches_only() -> None:
    counter = fresh()
    base = agent(3)

    def branch(number: int) -> list[dict[str, Any]]:
        return reparsed([*base[:4], {"role": "user", "content": f"branch {number}"}, base[4]])

    for number in range(10):
        counter.request({"messages": branch(number)})
    store = counter._conversations
    assert len(store) == 4
    # The newest branch is remembered whole; of the oldest, only the head all branches share.
    opening = request_lookup(counter, {"messages": branch(9)}).opening
    assert opening is not None
    assert store.longest(opening, Encoded(branch(9)))[1] == 6
    assert store.longest(opening, Encoded(branch(0)))[1] == 4


def test_a_number_rewritten_as_another_type_is_a_new_message() -> None:
    """Equal in Python (1 == 1.0 == True), not the same tokens: compared as JSON, counted exactly."""
    counter = fresh()
    opening = agent(0)

    def with_input(value: object) -> dict[str, Any]:
        part = {"type": "tool_use", "id": "t1", "name": "set", "input": {"level": value}}
        return {
            "messages": [
                *opening,
                {"role": "assistant", "content": [part]},
                {"role": "user", "content": "ok"},
            ]
        }

    counter.request(with_input(1))
    for variant in (1.0, True):
        body = with_input(variant)
        assert counter.request(body) == fresh().request(body)


def test_the_parse_s_json_spares_the_comparison_writing_it_again(monkeypatch: Any) -> None:
    """The incremental parse hands over each message's JSON (the head's as the previous request's
    very bytes objects): the head is recognised without serializing a message, counts exact."""
    counter = fresh()
    written: list[Any] = []
    for steps in (30, 31):
        chat = parse_chat_request(orjson.dumps({"model": "gpt-4o", "messages": agent(steps)}), Headers())
        assert chat.encoded is not None
        monkeypatch.setattr(Encoded, "_write_next", written.append)
        lookup = request_lookup(counter, chat.payload, chat.encoded)
        monkeypatch.undo()
        assert written == []
        assert counter.finish_request(chat.payload, lookup) == fresh().request(chat.payload)
    assert lookup.shared == 62  # the 30 steps' messages and the opening, by identity


def test_each_wire_format_s_view_takes_the_parse_s_json_where_it_holds_the_parsed_entries() -> None:
    turns = [{"role": role, "content": f"{role} says " * 2000} for role in ("user", "assistant", "user")]
    messages_body = {"model": "claude-sonnet-4-5", "max_tokens": 10, "system": "Be brief.", "messages": turns}
    raw = orjson.dumps(messages_body)
    chat = parse_chat_request(raw, Headers(), validate=validate_messages_body, wire=ANTHROPIC)
    # The view puts the system prompt first, then holds the parsed messages themselves.
    assert chat.view_encoded == tuple(orjson.dumps(message) for message in chat.view.messages)
    assert chat.view_encoded is not None and chat.view_encoded[1:] == chat.encoded
    lookup = request_lookup(fresh("claude-sonnet-4-5"), chat.view.counted, chat.view_encoded)
    assert lookup.encoded is not None and lookup.encoded.done[1:] == list(chat.encoded or ())
    # Responses items become new chat-shaped messages: nothing of the parse's to take (the route's
    # view writes its own: test_responses_memory.py).
    responses_body = {"model": "gpt-4o", "instructions": "Be brief.", "input": turns}
    chat = parse_chat_request(
        orjson.dumps(responses_body), Headers(), validate=validate_responses_body, wire=RESPONSES
    )
    assert chat.encoded is not None and chat.view_encoded is None
