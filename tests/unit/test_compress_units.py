"""Grouping messages into atomic units and finding the protected ones."""

from __future__ import annotations

from typing import Any

from gateway.compress.units import group_units, is_tool_result_carrier


def call(i: str) -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def spans(messages: list[dict[str, Any]]) -> list[tuple[int, int, bool]]:
    return [(u.start, u.end, u.protected) for u in group_units(messages)]


def test_openai_tool_group_with_parallel_answers_is_one_unit() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "next"},
    ]
    assert spans(messages) == [(0, 1, True), (1, 2, False), (2, 5, False), (5, 6, False), (6, 7, True)]


def test_anthropic_tool_use_and_result_carrier_are_one_unit() -> None:
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "g", "input": {}}]},
        result,
        {"role": "assistant", "content": "a"},
    ]
    assert is_tool_result_carrier(result)
    # The carrier is not the user speaking: the latest turn starts at "q".
    assert spans(messages) == [(0, 1, True), (1, 3, True), (3, 4, True)]


def test_latest_turn_runs_from_the_last_real_user_message_to_the_end() -> None:
    messages = [
        {"role": "user", "content": "old"},
        {"role": "assistant", "content": "a"},
        {"role": "developer", "content": "d"},
        {"role": "user", "content": [{"type": "text", "text": "new"}]},
        {"role": "assistant", "content": None, "tool_calls": [call("p")]},  # pending, no answer yet
    ]
    units = group_units(messages)
    assert [u.protected for u in units] == [False, False, True, True, True]
    assert [u.turn_start for u in units] == [True, False, False, True, False]


def test_without_any_user_message_the_last_unit_is_protected() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]
    assert [u.protected for u in group_units(messages)] == [True, False, True]
    assert group_units([]) == []


def test_units_after_the_latest_user_message_are_steps() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": None, "tool_calls": [call("a")]},
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "b", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b", "content": "2"}]},
        {"role": "system", "content": "mid-loop instruction"},
        {"role": "assistant", "content": None, "tool_calls": [call("c")]},  # pending: no answer yet
    ]
    units = group_units(messages)
    assert [(u.start, u.step) for u in units] == [
        (0, False),
        (1, False),
        (2, False),  # a tool round of an older turn is not a step
        (4, False),  # the task itself
        (5, True),
        (7, False),  # a system message stays protected, never a step
        (8, True),
    ]
    # Without any user message there is no turn, so no steps.
    assert not any(u.step for u in group_units(messages[2:4]))


def test_tool_results_sent_apart_from_the_next_question_join_its_turn() -> None:
    """The Messages API merges consecutive user messages: the results and the question are one
    turn, and the assistant turn they answer must keep its thinking when thinking is on, so
    the step belongs to the protected latest turn (as when both come in one user message)."""
    thinking = {"type": "thinking", "thinking": "t", "signature": "s"}
    tool_use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "x"}
    split = [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": [thinking, tool_use]},
        {"role": "user", "content": [result]},
        {"role": "user", "content": "thanks, now answer"},
    ]
    units = group_units(split)
    assert [(u.start, u.end, u.protected, u.step) for u in units] == [
        (0, 1, False, False),
        (1, 3, True, False),
        (3, 4, True, False),
    ]
    merged = [*split[:2], {"role": "user", "content": [result, {"type": "text", "text": "thanks"}]}]
    assert [u.protected for u in group_units(merged)] == [False, True]
    # OpenAI-style tool answers are not user messages: the question alone opens the turn.
    openai = [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": None, "tool_calls": [call("t1")]},
        {"role": "tool", "tool_call_id": "t1", "content": "x"},
        {"role": "user", "content": "thanks, now answer"},
    ]
    assert [u.protected for u in group_units(openai)] == [False, False, True]
