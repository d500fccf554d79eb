"""Group a message list into atomic units and find what is protected.

A unit is kept, transformed or dropped as a whole, so tool pairs can never be
split: an assistant message with `tool_calls` together with the `role: tool`
answers that follow it (OpenAI; a legacy `function_call` with its `role:
function` answer alike), or an assistant message with `tool_use`
blocks together with the next user message when it carries the
`tool_result` blocks (Anthropic-style content lists).

Inside the latest turn, each unit after the user message is a step of an
agent loop (an assistant message with its tool calls and the results that
answer them): `fit` keeps the newest steps protected and compresses older
ones like older turns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Message = Mapping[str, Any]

PROTECTED_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True)
class Unit:
    start: int  # index of its first message in the original list
    end: int  # exclusive
    protected: bool
    turn_start: bool  # begins with a user message that is real user input
    step: bool = False  # in the latest turn, after its user message: a step of an agent loop


def _blocks(message: Message, kind: str) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(part, Mapping) and part.get("type") == kind for part in content
    )


def is_tool_result_carrier(message: Message) -> bool:
    """A user message made only of tool_result blocks: not the user speaking."""
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, list)
        and bool(content)
        and all(isinstance(part, Mapping) and part.get("type") == "tool_result" for part in content)
    )


def is_user_input(message: Message) -> bool:
    return message.get("role") == "user" and not is_tool_result_carrier(message)


def _group_end(messages: Sequence[Message], i: int) -> int:
    """End (exclusive) of the unit that starts at message i."""
    message = messages[i]
    end = i + 1
    if message.get("role") != "assistant":
        return end
    if message.get("tool_calls"):
        while end < len(messages) and messages[end].get("role") == "tool":
            end += 1
    elif (
        isinstance(message.get("function_call"), Mapping)
        and end < len(messages)
        and messages[end].get("role") == "function"
    ):
        end += 1  # the legacy functions API: one call, answered by the `role: function` message after it
    if (
        _blocks(message, "tool_use")
        and end < len(messages)
        and messages[end].get("role") == "user"
        and _blocks(messages[end], "tool_result")
    ):
        end += 1
    return end


def group_units(messages: Sequence[Message]) -> list[Unit]:
    """Split messages into units; system/developer ones and the latest turn are protected.

    The latest turn runs from the unit holding the last real user message to
    the end (without a user message: the last unit), so the pending question
    is never dropped; it takes in the step before when that step's results
    end right before the user message, in a user message of their own. The
    units after that user message are the turn's steps; `fit` decides how
    many of the newest stay protected.
    """
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(messages):
        end = _group_end(messages, i)
        spans.append((i, end))
        i = end
    latest = len(spans) - 1
    has_user = False
    for index in range(len(spans) - 1, -1, -1):
        start, end = spans[index]
        if any(is_user_input(messages[j]) for j in range(start, end)):
            latest = index
            has_user = True
            break
    first = latest
    if has_user and latest > 0 and is_tool_result_carrier(messages[spans[latest][0] - 1]):
        # The user message follows a step's tool results sent as a user message of their own: the
        # Messages API merges the two into one turn, whose assistant turn before it must keep its
        # thinking when thinking is on. That step is the latest turn's too.
        first = latest - 1
    return [
        Unit(
            start=start,
            end=end,
            protected=index >= first or messages[start].get("role") in PROTECTED_ROLES,
            turn_start=is_user_input(messages[start]),
            step=has_user and index > latest and messages[start].get("role") not in PROTECTED_ROLES,
        )
        for index, (start, end) in enumerate(spans)
    ]
