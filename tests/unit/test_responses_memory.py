"""The route's Responses view converts only a growing conversation's new items
(`gateway/wire/responses_memory.py`): what it makes must be what a fresh view makes, always."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

import gateway  # noqa: F401  (offline tiktoken cache)
from gateway.chat_request import parse_chat_request
from gateway.tokens.counter import request_lookup
from gateway.wire.base import ChatView
from gateway.wire.responses import RESPONSES, ResponsesInput
from gateway.wire.responses_memory import Conversions
from gateway.wire.responses_validation import validate_responses_body
from tests.unit.test_conversation_prefixes import fresh
from tests.unit.test_wire_properties import responses_body

GPT = "gpt-4o"


def step(n: int, output: str = "") -> list[dict[str, Any]]:
    """One agent step as Responses items: reasoning, a call, its output."""
    return [
        {"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": "e" * 40},
        {"type": "function_call", "call_id": f"call_{n}", "name": "grep", "arguments": f'{{"q":"{n}"}}'},
        {"type": "function_call_output", "call_id": f"call_{n}", "output": output or f"hit {n}\n" * 400},
    ]


def loop_body(steps: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Find where the config is read."}]
    for n in range(steps):
        items += step(n)
    return {"model": GPT, "instructions": "You are a coding agent.", "input": items}


def same_as_fresh(view: ChatView, payload: dict[str, Any]) -> None:
    """The view is what a view without memory makes of the payload, and (when it may be fitted)
    writes it back unchanged."""
    plain = RESPONSES.view(copy.deepcopy(payload))
    assert view.messages == plain.messages
    assert view.fittable == plain.fittable
    if view.fittable:
        assert RESPONSES.emit(payload, view, view.messages) == payload
    if view.encoded is not None:
        assert view.encoded == tuple(orjson.dumps(message) for message in view.messages)


def test_a_growing_loop_reuses_its_known_messages_and_their_json_and_counts_exactly() -> None:
    wire = ResponsesInput(Conversions())
    views = []
    for steps in (20, 21, 22):
        payload = loop_body(steps)
        chat = parse_chat_request(
            orjson.dumps(payload), Headers(), validate=validate_responses_body, wire=wire
        )
        same_as_fresh(chat.view, chat.payload)
        lookup = request_lookup(fresh(), chat.view.counted, chat.view_encoded)
        assert fresh().finish_request(chat.view.counted, lookup) == fresh().request(chat.view.counted)
        views.append(chat)
    first, second = views[0].view, views[1].view
    # System, task, then a run and an output per step: all of the first request's, but its last
    # step's output (the newest item: a later step's reasoning run may follow it)... is reused
    # too, since an output ends a step whatever comes next.
    assert len(first.messages) == 2 + 2 * 20
    assert all(a is b for a, b in zip(first.messages[1:], second.messages[1:42], strict=True))
    assert first.encoded is not None and second.encoded is not None
    assert all(a is b for a, b in zip(first.encoded[1:], second.encoded[1:42], strict=True))
    assert len(wire.conversions) == 1  # each request replaced the one it grew from


def test_a_run_that_reached_the_end_of_the_known_items_is_made_again() -> None:
    """A body ending in model-side items (reasoning) may continue that run in the next one."""
    wire = ResponsesInput(Conversions())
    items = loop_body(3)["input"]
    reasoning = {"type": "reasoning", "id": "rs_x", "summary": [], "encrypted_content": "e" * 40}
    first = wire.view({"model": GPT, "input": [*items, reasoning]})
    call = {"type": "function_call", "call_id": "call_x", "name": "grep", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_x", "output": "none"}
    payload = {"model": GPT, "input": [*items, reasoning, call, output]}
    second = wire.view(payload)
    same_as_fresh(second, payload)
    assert second.messages[-2] is not first.messages[-1]
    assert second.messages[-2]["tool_calls"][0]["id"] == "call_x"


def test_new_questions_after_the_same_answer_keep_one_conversation() -> None:
    """Each request asks another question after the same history ending in the model's answer (an
    edit, a retry, users of one few-shot prompt): each replaces the last, so one conversation is
    remembered and searched, not one per question. The answer is a run the new question ends, so
    it is made again: the rule for replacing counts items, not reused messages."""
    wire = ResponsesInput(Conversions())
    history = [
        {"role": "user", "content": "What does the config loader do?"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It reads YAML. " * 1200}]},
    ]
    for n in range(12):
        payload = {"model": GPT, "input": [*history, {"role": "user", "content": f"Question {n}?"}]}
        same_as_fresh(wire.view(payload), payload)
    assert len(wire.conversions) == 1


def test_an_item_replaced_by_another_object_is_converted_again_from_there() -> None:
    wire = ResponsesInput(Conversions())
    items = loop_body(4)["input"]
    wire.view({"model": GPT, "input": items})
    changed = [*items[:6], {**items[6], "output": "rewritten"}, *items[7:], *step(9)]
    payload = {"model": GPT, "input": changed}
    view = wire.view(payload)
    same_as_fresh(view, payload)
    assert view.messages[4]["content"] == "rewritten"


def test_an_unpaired_layout_after_a_known_head_is_not_fittable() -> None:
    wire = ResponsesInput(Conversions())
    items = loop_body(3)["input"]
    wire.view({"model": GPT, "input": items})
    orphan = {"type": "function_call_output", "call_id": "nobody", "output": "?"}
    payload = {"model": GPT, "input": [*items, orphan]}
    view = wire.view(payload)
    assert not view.fittable
    same_as_fresh(view, payload)


EDITS = st.lists(
    st.tuples(
        st.sampled_from(["grow", "retry", "replace", "truncate", "orphan", "unanswered"]), st.integers(0, 99)
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.booleans(), EDITS)
def test_the_memory_never_changes_what_a_view_makes(
    seed: int, turns: int, reasoning: bool, edits: list[tuple[str, int]]
) -> None:
    """Whatever the next body does with the last one's items (the same objects, as the parse hands
    them out), the view is a fresh view's, and its JSON each message's."""
    wire = ResponsesInput(Conversions())
    body = responses_body(seed, turns, reasoning, string_parts=False)
    # A task long enough for the memory to keep the conversation (MIN_BODY_BYTES).
    task = {"role": "user", "content": "Context: " + "the config is read. " * 900}
    items: list[Any] = [task, *body["input"]]
    body["input"] = items
    wire.view(body)
    for serial, (edit, at) in enumerate(edits):
        k = at % (len(items) + 1)
        if edit == "grow":
            items = [*items, *step(1000 + serial, f"out {serial}")]
        elif edit == "retry":
            items = items[:-1] if items else items
        elif edit == "replace" and k < len(items):
            items = [*items[:k], copy.deepcopy(items[k]), *items[k + 1 :]]
        elif edit == "truncate":
            items = items[:k]
        elif edit == "orphan":
            items = [*items, {"type": "function_call_output", "call_id": "nobody", "output": "?"}]
        elif edit == "unanswered":
            items = [*items, step(2000 + serial)[1]]
        payload = {**body, "input": items}
        same_as_fresh(wire.view(payload), payload)


def test_a_conversation_too_small_for_the_parse_to_share_is_not_remembered() -> None:
    """Under MIN_BODY_BYTES the parse makes new items for every body: nothing could find them."""
    wire = ResponsesInput(Conversions())
    wire.view(loop_body(1))
    assert len(wire.conversions) == 0
    wire.view(loop_body(8))
    assert len(wire.conversions) == 1


def test_the_memory_stays_within_its_bytes() -> None:
    conversions = Conversions(max_bytes=200_000)
    wire = ResponsesInput(conversions)
    for task in range(40):
        items = loop_body(8)["input"]
        items[0] = {"role": "user", "content": f"task {task}"}
        wire.view({"model": GPT, "input": items})
    assert 0 < conversions.size <= 200_000
    assert len(conversions) < 40
