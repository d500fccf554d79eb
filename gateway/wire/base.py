"""What every wire format gives the planner: a chat-shaped view of its prompt and a way back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from gateway.compress.transforms import TEXT_REASONING_FIELDS

Message = Mapping[str, Any]
# Fields of a chat completions message that the compression reads on any chat view. Messages of
# the Anthropic and Responses APIs have none of them, and their messages reach the view as they
# are: their validators refuse these, which the compression would take for calls and reasoning.
CHAT_MESSAGE_FIELDS: Final = ("tool_calls", "tool_call_id", "function_call", *TEXT_REASONING_FIELDS)


@dataclass(frozen=True)
class ChatView:
    """A request's prompt as `gateway.compress` and `gateway.tokens` see it.

    `messages` are chat-completions-shaped (system first when there is one);
    `counted` is a chat-completions body with the same prompt tokens and
    output reserve (messages, tool definitions, `max_tokens`), for the
    counter and the budget. `state` is whatever the format needs to write
    fitted messages back. `fittable` is False when the request is laid out
    so that fitting it could orphan a pair: it is then forwarded as it is.
    `encoded`, when the format knows it, is each message's compact JSON, for
    the count's comparison with the conversation's last request.
    """

    messages: list[Message]
    counted: Mapping[str, Any]
    state: Any = field(default=None, compare=False)
    fittable: bool = True
    encoded: tuple[bytes, ...] | None = field(default=None, compare=False)


def counted_body(
    messages: list[Message], tools: object, max_tokens: object, output_format: object = None
) -> dict[str, Any]:
    """A native body as the counter reads a chat-completions one. `output_format`: the native
    route's structured-output format (Responses `text.format`, Anthropic `output_config.format`,
    both `{"type": "json_schema", ...}` with the schema beside the type); its schema counts as
    a `response_format` one does."""
    body: dict[str, Any] = {"messages": messages}
    if isinstance(tools, list) and tools:
        body["tools"] = tools
    if isinstance(output_format, Mapping) and output_format.get("type") == "json_schema":
        schema = {key: value for key, value in output_format.items() if key != "type"}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        body["max_tokens"] = max_tokens
    return body


class WireFormat(Protocol):
    """One wire format: its chat view and the body with fitted messages written back."""

    name: str
    prompt_field: str  # the body field holding the conversation, named in errors about it
    text_part: str  # the type of a user message's text content part

    def view(self, payload: Mapping[str, Any]) -> ChatView: ...

    def emit(
        self, payload: Mapping[str, Any], view: ChatView, messages: Sequence[Message]
    ) -> dict[str, Any]: ...


class ChatCompletions:
    """Chat completions: the view is the body itself."""

    name = "chat"
    prompt_field = "messages"
    text_part = "text"

    def view(self, payload: Mapping[str, Any]) -> ChatView:
        messages = payload.get("messages")
        return ChatView(messages if isinstance(messages, list) else [], payload)

    def emit(self, payload: Mapping[str, Any], view: ChatView, messages: Sequence[Message]) -> dict[str, Any]:
        return {**payload, "messages": list(messages)}


CHAT = ChatCompletions()
