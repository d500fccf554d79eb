"""Chat completions: the view is the body itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.wire.base import ChatView, Message


class ChatCompletions:
    name = "chat"

    def view(self, payload: Mapping[str, Any]) -> ChatView:
        messages = payload.get("messages")
        return ChatView(messages if isinstance(messages, list) else [], payload)

    def emit(self, payload: Mapping[str, Any], view: ChatView, messages: Sequence[Message]) -> dict[str, Any]:
        return {**payload, "messages": list(messages)}


CHAT = ChatCompletions()
