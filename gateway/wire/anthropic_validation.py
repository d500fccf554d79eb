"""Validation of an Anthropic Messages body before the gateway does any work on it.

Every field the gateway reads (to count, fit, budget or relay) is held to the shape the
Messages API documents; a malformed one answers 400 naming the field (the route writes it in
Anthropic's error shape). Fields the gateway only forwards (`temperature`, `metadata`,
`tool_choice` …) are left to the upstream. Content blocks share the chat validator's checks
(text, images, documents, tool_use/tool_result, thinking), nesting bounded the same way.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import GatewayError
from gateway.wire.base import CHAT_MESSAGE_FIELDS
from gateway.wire.chat import (
    check_content,
    check_count,
    check_depth,
    check_model,
    check_object_array,
    check_optional,
    invalid_type,
    json_type,
)

ROLES = ("user", "assistant", "system")  # `system`: text only (the SDK's SystemMessageParam)


def validate_messages_body(payload: object, known: int = 0) -> None:
    """Raise a 400 `GatewayError` naming the first malformed field of a Messages body."""
    if not isinstance(payload, dict):
        raise GatewayError(400, "The request body must be a JSON object.")
    check_model(payload.get("model"))
    check_count(payload, "max_tokens")
    check_optional(payload, "stream", bool, "a boolean")
    check_optional(payload, "thinking", dict, "an object")
    system = payload.get("system")
    if system is not None:
        if not isinstance(system, str | list):
            raise invalid_type("system", system, "a string or an array of text blocks")
        _text_blocks_only(system, "system")
        check_content(system, "system", depth=0)
    messages = payload.get("messages")
    if not isinstance(messages, list):
        raise GatewayError(
            400,
            "messages: Field required"
            if messages is None
            else (f"Invalid type for 'messages': expected an array, but got {json_type(messages)} instead."),
            param="messages",
        )
    for index in range(known, len(messages)):  # the first `known` were validated before
        _message(messages[index], f"messages[{index}]")
    check_object_array(payload, "tools")
    check_depth(payload)


def _message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise invalid_type(where, message, "an object")
    role = message.get("role")
    if role not in ROLES:
        shown = repr(role)[:60] if isinstance(role, str) else json_type(role)
        raise GatewayError(
            400,
            f"Invalid value for '{where}.role': {shown}. "
            "Supported values are: 'user', 'assistant', 'system'.",
            param=f"{where}.role",
        )
    content = message.get("content")
    if not isinstance(content, str | list):
        raise invalid_type(f"{where}.content", content, "a string or an array of content blocks")
    if role == "system":
        _text_blocks_only(content, f"{where}.content")
    check_content(content, f"{where}.content", depth=0)
    for name in CHAT_MESSAGE_FIELDS:
        if name in message:  # (the Messages API's own wording for a field it does not have)
            raise GatewayError(
                400, f"{where}.{name}: Extra inputs are not permitted", param=f"{where}.{name}"
            )


def _text_blocks_only(content: str | list[Any], where: str) -> None:
    """A system prompt (the `system` field, or a message of role system) holds text blocks only."""
    if isinstance(content, str):
        return
    for position, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise GatewayError(
                400,
                f"Invalid value for '{where}[{position}]': a system prompt holds text blocks only.",
                param=f"{where}[{position}]",
            )
