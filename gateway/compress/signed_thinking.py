"""Keep a fitted conversation acceptable to an API that checks signed thinking.

With extended thinking on, the Messages API reads consecutive user messages as one turn, and
when that last turn carries `tool_result` blocks, the assistant turn they answer must start
with its thinking block. Stage 1 drops old thinking, and dropping turns can leave an old step
(its thinking gone) right before the last user messages: its results then read as the final
tool results, and the API refuses the request. Such a step is history; its call and results
go on as text blocks, which the rule does not concern, rather than as tool blocks: the call
as one line naming the tool and its input, each result as a line naming the tool, followed by
what the result held (its text, and its images or documents as they were), less the ids.
The fit was chosen for the blocks' tokens, so a message whose text would cost more (a long
tool name in every heading) takes the bare form instead: the call's tool name alone, the
result's content alone, each smaller than its block.

A step that a drop brings right before the last user messages goes on as text too, whatever
the history holds: a request may switch thinking on for a history that never had any.

The same holds in chat completions sent to Claude through a gateway that keeps its signed
thinking on the assistant message (litellm's `thinking_blocks`, OpenRouter's
`reasoning_details`): there the tool results are `role: tool` messages, which become the
last user turn's tool_result blocks, and the step goes on as an assistant's text and user
messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from gateway.compress.transforms import call_request
from gateway.compress.units import Message
from gateway.tokens.formats import compact_json

SIGNED_THINKING = frozenset({"thinking", "redacted_thinking"})
# Where chat completions carry Claude's signed thinking: litellm's field, OpenRouter's.
CHAT_SIGNED = ("thinking_blocks", "reasoning_details")
TOOL_MESSAGE_KEYS = frozenset({"role", "content", "tool_call_id", "name"})  # the rest go on, unknown


def unpinned(
    messages: Sequence[Message], originals: Sequence[Message | None], cost: Callable[[Message], int]
) -> dict[int, Message]:
    """The messages to replace (by index) so that the last user messages' tool results answer an
    assistant turn that starts with thinking, or none; empty when nothing needs to change. The
    step there lost its thinking, or a drop brought it there: a step from before thinking was
    switched on, and thinking can be switched on by any request, so nothing in a history tells
    that it is off.
    `originals` is parallel to `messages` (None for a message the fit added). No message costs
    more than before (`cost`: its tokens): where the readable form would, the bare one goes (the
    tool's name alone for a call, the result's content alone)."""
    start = len(messages)
    while start > 0 and messages[start - 1].get("role") == "user":
        start -= 1
    users = start
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    if start == 0 or start == len(messages) or messages[start - 1].get("role") != "assistant":
        return {}
    assistant, original = messages[start - 1], originals[start - 1]
    if original is None or starts_with_thinking(assistant):
        return {}
    # A step without thinking of its own is changed only where dropping brought it there (a
    # marker among the last user messages): otherwise the client sent it so (the newest step).
    dropped_after = any(originals[index] is None for index in range(users, len(messages)))
    if not (starts_with_thinking(original) or dropped_after):
        return {}
    if start < users:  # chat completions: the step's results are tool messages
        return _chat_step_as_text(messages, start - 1, users, cost)
    calls = _calls(assistant)
    answered = [
        index
        for index in range(start, len(messages))
        if any(_answers(block, calls) for block in _blocks(messages[index]))
    ]
    if not answered:
        return {}
    changed: dict[int, Message] = {}
    for index in [start - 1, *answered]:
        message = messages[index]
        readable = _with_content(message, partial(_as_text, calls=calls, bare=False))
        if cost(readable) > cost(message):
            readable = _with_content(message, partial(_as_text, calls=calls, bare=True))
        changed[index] = readable
    return changed


def _calls(message: Message) -> dict[str, Any]:
    """Tool call id -> tool name, of an assistant message's tool_use blocks."""
    return {
        block["id"]: block.get("name")
        for block in _blocks(message)
        if block.get("type") == "tool_use" and isinstance(block.get("id"), str)
    }


def _blocks(message: Message) -> list[Mapping[str, Any]]:
    content = message.get("content")
    return [block for block in content if isinstance(block, Mapping)] if isinstance(content, list) else []


def _chat_step_as_text(
    messages: Sequence[Message], at: int, end: int, cost: Callable[[Message], int]
) -> dict[int, Message]:
    """The chat step at `at` (an assistant's tool_calls, its tool messages up to `end`) as text:
    each call a line of the assistant's content, each result a user message. Only where the
    whole step costs no more than it did (else the bare form: names, contents; else as it is)."""
    assistant = messages[at]
    calls = assistant.get("tool_calls")
    asked = (
        [_chat_call(call) for call in calls if isinstance(call, Mapping)] if isinstance(calls, list) else []
    )
    names = {call_id: name for call_id, name, _ in asked}
    said = {key: value for key, value in assistant.items() if key != "tool_calls"}
    for bare in (False, True):
        lines = [f"[called {name}]" if bare else f"[called {name} with {given}]" for _, name, given in asked]
        changed: dict[int, Message] = {at: {**said, "content": _with_lines(assistant.get("content"), lines)}}
        for index in range(at + 1, end):
            result = messages[index]
            heading = "" if bare else f"[{names.get(result.get('tool_call_id'))} returned:]"
            kept = {key: value for key, value in result.items() if key not in TOOL_MESSAGE_KEYS}
            changed[index] = {**kept, "role": "user", "content": _chat_result(result.get("content"), heading)}
        if sum(map(cost, changed.values())) <= sum(cost(messages[i]) for i in changed):
            return changed
    return {}


def _with_lines(content: Any, lines: list[str]) -> Any:
    """An assistant's content with the call lines after what it said (text, or its parts)."""
    if isinstance(content, list) and content:
        return [*content, {"type": "text", "text": "\n".join(lines)}]
    return "\n".join([content, *lines] if isinstance(content, str) and content else lines)


def _chat_call(call: Mapping[str, Any]) -> tuple[object, object, str]:
    """(id, tool name, what it was given) of a chat tool call, a function's or a custom tool's."""
    asked = call_request(call)
    if asked is None:
        return call.get("id"), None, ""
    _, request, field = asked
    given = request.get(field)
    return call.get("id"), request.get("name"), given if isinstance(given, str) else ""


def _chat_result(content: Any, heading: str) -> Any:
    """A tool message's content as a user message's: its text under the heading (never blank)."""
    if isinstance(content, str):
        body = content if content.strip() else "[result]"
        return f"{heading}\n{body}" if heading else body
    parts = [part for part in content if isinstance(part, Mapping)] if isinstance(content, list) else []
    kept = [part for part in parts if _worth_a_block(part)]
    if not kept:
        return heading or "[result]"
    return [{"type": "text", "text": heading}, *kept] if heading else kept


def starts_with_thinking(message: Message) -> bool:
    """An assistant turn as the Messages API requires it before the final tool results: its first
    block signed thinking, or in chat completions signed thinking beside it (`CHAT_SIGNED`).
    (Asked of every message of every fit: it reads as far as the first block, no further.)"""
    if any(isinstance(message.get(key), list) and message[key] for key in CHAT_SIGNED):
        return True
    content = message.get("content")
    first = (
        next((block for block in content if isinstance(block, Mapping)), None)
        if isinstance(content, list)
        else None
    )
    return first is not None and first.get("type") in SIGNED_THINKING


def _answers(block: Mapping[str, Any], calls: Mapping[str, Any]) -> bool:
    return block.get("type") == "tool_result" and block.get("tool_use_id") in calls


def _with_content(message: Message, convert: Callable[[Mapping[str, Any]], list[Any]]) -> Message:
    content = message.get("content")
    assert isinstance(content, list)  # only messages with blocks are converted
    converted = [convert(block) if isinstance(block, Mapping) else [block] for block in content]
    return {**message, "content": [new for blocks in converted for new in blocks]}


def _text_block(block: Mapping[str, Any], text: str) -> dict[str, Any]:
    new: dict[str, Any] = {"type": "text", "text": text}
    if "cache_control" in block:  # a cache breakpoint stays where the client put it
        new["cache_control"] = block["cache_control"]
    return new


def _as_text(block: Mapping[str, Any], calls: Mapping[str, Any], *, bare: bool) -> list[Any]:
    """A tool_use or answering tool_result block as text blocks; any other block as it is."""
    if block.get("type") == "tool_use" and block.get("id") in calls:
        name = block.get("name")
        if bare:
            return [_text_block(block, f"[called {name}]")]
        arguments = compact_json(block.get("input")) if "input" in block else "{}"
        return [_text_block(block, f"[called {name} with {arguments}]")]
    if not _answers(block, calls):
        return [block]
    outcome = "failed" if block.get("is_error") else "returned"
    heading = "" if bare else f"[{calls[block['tool_use_id']]} {outcome}:]"
    content = block.get("content")
    if isinstance(content, str) and content.strip():
        return [_text_block(block, f"{heading}\n{content}" if heading else content)]
    # Blocks a tool result holds (text, images, documents) are user content blocks as well; out
    # of it, a text block of whitespace alone (a command's bare newline) is refused by the API.
    held = [part for part in content if _worth_a_block(part)] if isinstance(content, list) else []
    if not held:
        return [_text_block(block, heading or "[result]")]
    last = {**held[-1], "cache_control": block["cache_control"]} if "cache_control" in block else held[-1]
    return [*([{"type": "text", "text": heading}] if heading else []), *held[:-1], last]


def _worth_a_block(part: object) -> bool:
    """A tool result's part that may stand as a user content block: not text of whitespace alone."""
    if not isinstance(part, Mapping):
        return False
    text = part.get("text")
    return not (part.get("type") == "text" and isinstance(text, str) and not text.strip())
