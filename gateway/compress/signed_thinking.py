"""Keep a fitted conversation acceptable to an API that checks signed thinking.

With extended thinking on, the Messages API reads consecutive user messages as one turn, and
when that last turn carries `tool_result` blocks, the assistant turn they answer must start
with its thinking block. Stage 1 drops old thinking, and dropping turns can leave an old step
(its thinking gone) right before the last user messages: its results then read as the final
tool results, and the API refuses the request. Such a step is history; its call and results
go on as text blocks, which the rule does not concern, rather than as tool blocks: the call
as one line naming the tool and its input, each result as a line naming the tool, followed by
what the result held (its text, and its images or documents as they were), less the ids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from gateway.compress.units import Message

SIGNED_THINKING = frozenset({"thinking", "redacted_thinking"})


def unpinned(messages: Sequence[Message], originals: Sequence[Message | None]) -> dict[int, Message]:
    """The messages to replace (by index) so that the last user messages' tool results answer an
    assistant turn that starts with thinking, where its original (`originals`, parallel to
    `messages`; None for a message the fit added) did; empty when nothing needs to change."""
    start = len(messages)
    while start > 0 and messages[start - 1].get("role") == "user":
        start -= 1
    if start == 0 or start == len(messages) or messages[start - 1].get("role") != "assistant":
        return {}
    assistant, original = messages[start - 1], originals[start - 1]
    if original is None or not starts_with_thinking(original) or starts_with_thinking(assistant):
        return {}
    calls = _calls(assistant)
    answered = {
        index
        for index in range(start, len(messages))
        if any(_answers(block, calls) for block in _blocks(messages[index]))
    }
    if not answered:
        return {}
    changed: dict[int, Message] = {start - 1: _with_content(assistant, _call_text)}
    for index in answered:
        changed[index] = _with_content(messages[index], lambda block: _result_text(block, calls))
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


def starts_with_thinking(message: Message) -> bool:
    """An assistant turn as the Messages API requires it before the final tool results."""
    blocks = _blocks(message)
    return bool(blocks) and blocks[0].get("type") in SIGNED_THINKING


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


def _call_text(block: Mapping[str, Any]) -> list[Any]:
    if block.get("type") != "tool_use":
        return [block]
    arguments = orjson.dumps(block.get("input")).decode() if "input" in block else "{}"
    return [_text_block(block, f"[called {block.get('name')} with {arguments}]")]


def _result_text(block: Mapping[str, Any], calls: Mapping[str, Any]) -> list[Any]:
    if not _answers(block, calls):
        return [block]
    heading = f"[{calls[block['tool_use_id']]} {'failed' if block.get('is_error') else 'returned'}:]"
    content = block.get("content")
    if isinstance(content, str):
        return [_text_block(block, f"{heading}\n{content}" if content else heading)]
    # Blocks a tool result holds (text, images, documents) are user content blocks as well.
    held = [part for part in content if isinstance(part, Mapping)] if isinstance(content, list) else []
    if not held:
        return [_text_block(block, heading)]
    last = {**held[-1], "cache_control": block["cache_control"]} if "cache_control" in block else held[-1]
    return [{"type": "text", "text": heading}, *held[:-1], last]
