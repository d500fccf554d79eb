"""User messages in a row joined into one, for chat templates that need roles to alternate.

`fit` leaves two user messages in a row where it cuts: each marker of a
dropped span is a user message of its own, right before a kept user turn or
right after the task before kept steps, and a kept head can end on a user
message whose answer went. Strict APIs accept that and Anthropic merges them,
but the chat templates of some open models refuse it when a server such as
vLLM or llama.cpp applies them ("Conversation roles must alternate
user/assistant/..."). Joined, the texts say the same in order, and the roles
alternate as they did in the request (such an upstream refused any request
that did not). A user message carrying tool results (Anthropic's
`tool_result` blocks, which must open it) is never joined. Joining saves a
message's framing, so a fitted prompt still fits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.compress.fit import Message


def join_user_runs(messages: Sequence[Message], text_part: str = "text") -> list[Message]:
    """`messages` with each run of user messages in a row joined into one, where both can be;
    a text joined to content parts becomes a part of type `text_part` (the wire format's own:
    `text` for chat and Anthropic, `input_text` for Responses)."""
    out: list[Message] = []
    for message in messages:
        if out and _joinable(out[-1]) and _joinable(message):
            out[-1] = _joined(out[-1], message, text_part)
        else:
            out.append(message)
    return out


def _joinable(message: Message) -> bool:
    content = message.get("content")
    if message.get("role") != "user":
        return False
    if isinstance(content, str):
        return True
    return isinstance(content, list) and not any(
        isinstance(part, Mapping) and part.get("type") == "tool_result" for part in content
    )


def _joined(first: Message, second: Message, text_part: str) -> dict[str, Any]:
    a, b = first["content"], second["content"]
    if isinstance(a, str) and isinstance(b, str):
        return {**first, "content": f"{a}\n\n{b}"}

    def as_parts(content: Any) -> list[Any]:
        return list(content) if isinstance(content, list) else [{"type": text_part, "text": content}]

    return {**first, "content": [*as_parts(a), *as_parts(b)]}
