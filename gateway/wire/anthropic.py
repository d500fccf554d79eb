"""Anthropic Messages: top-level `system` (string or text blocks) plus user/assistant messages.

The chat view is the `system` as a first system message followed by the
messages themselves, unchanged: their content blocks (`text`, `image`,
`document`, `tool_use`/`tool_result`, `thinking`/`redacted_thinking`) are
what gateway.compress already works on. Thinking blocks are signed: compress
drops them whole (stage 1) or leaves them alone, never edits them, and the
latest turn (with the assistant turn the final tool results answer) is never
touched by stages 1-5. `cache_control` markers stay on the block that
carries them (a transformed block keeps the field); dropped blocks take
theirs with them, so a fitted request never has more markers than it came
with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.wire.base import ChatView, Message, counted_body


class AnthropicMessages:
    name = "anthropic"
    prompt_field = "messages"
    text_part = "text"

    def view(self, payload: Mapping[str, Any]) -> ChatView:
        messages = payload.get("messages")
        chat: list[Message] = list(messages) if isinstance(messages, list) else []
        system = payload.get("system")
        has_system = isinstance(system, str | list) and bool(system)
        if has_system:
            chat.insert(0, {"role": "system", "content": system})
        config = payload.get("output_config")
        output_format = config.get("format") if isinstance(config, Mapping) else None
        counted = counted_body(chat, payload.get("tools"), payload.get("max_tokens"), output_format)
        return ChatView(chat, counted, has_system)

    def emit(self, payload: Mapping[str, Any], view: ChatView, messages: Sequence[Message]) -> dict[str, Any]:
        out = dict(payload)
        rest = list(messages)
        if view.state:
            out["system"] = rest.pop(0)["content"]
        out["messages"] = rest
        return out


ANTHROPIC = AnthropicMessages()
