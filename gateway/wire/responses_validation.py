"""Validation of an OpenAI Responses body before the gateway does any work on it.

Every field the gateway reads is held to the shape the Responses API documents: `input` (a
string or items: messages, the calls of client-run tools and their outputs with the ids that
pair them, `reasoning`, or any other typed item, forwarded whole), `instructions`, `tools`,
`max_output_tokens`, `stream`, and the server-state fields `previous_response_id`,
`conversation` and `truncation`. A malformed one answers 400 with OpenAI's wording naming
the field. Content parts share the chat validator's checks.
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
)
from gateway.wire.responses import item_type

ROLES = ("user", "assistant", "system", "developer")
TRUNCATIONS = ("auto", "disabled")
# Item fields that must be strings, and objects, by item type.
_ITEM_STRINGS = {
    "function_call": ("call_id", "name", "arguments"),
    "custom_tool_call": ("call_id", "name", "input"),
    "custom_tool_call_output": ("call_id",),
    "shell_call": ("call_id",),
    "shell_call_output": ("call_id",),
    "local_shell_call": ("call_id",),
    "local_shell_call_output": ("id", "output"),
    "apply_patch_call": ("call_id",),
    "apply_patch_call_output": ("call_id",),
    "computer_call": ("call_id",),
    "computer_call_output": ("call_id",),
    "reasoning": ("id",),
    "item_reference": ("id",),
}
_ITEM_OBJECTS = {"shell_call": "action", "local_shell_call": "action", "apply_patch_call": "operation"}
# Item fields that may be left out or null, else strings: a function's output made by a program
# (programmatic tool calling) need not name a call.
_ITEM_OPTIONAL_STRINGS = {"function_call_output": ("call_id",)}


def validate_responses_body(payload: object, known: int = 0) -> None:
    """Raise a 400 `GatewayError` naming the first malformed field of a Responses body."""
    if not isinstance(payload, dict):
        raise GatewayError(400, "The request body must be a JSON object.")
    prompt = payload.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, dict):
            raise invalid_type("prompt", prompt, "an object")
        if not isinstance(prompt.get("id"), str):
            raise invalid_type("prompt.id", prompt.get("id"), "a string")
    if payload.get("model") is not None or prompt is None:  # a stored prompt may name the model
        check_model(payload.get("model"))
    check_optional(payload, "stream", bool, "a boolean")
    check_optional(payload, "instructions", str, "a string")
    check_optional(payload, "previous_response_id", str, "a string")
    check_optional(payload, "store", bool, "a boolean")
    check_count(payload, "max_output_tokens")
    truncation = payload.get("truncation")
    if truncation is not None and truncation not in TRUNCATIONS:
        shown = repr(truncation)[:60] if isinstance(truncation, str) else "a non-string"
        raise GatewayError(
            400,
            f"Invalid value for 'truncation': {shown}. Supported values are: 'auto' and 'disabled'.",
            param="truncation",
        )
    conversation = payload.get("conversation")
    if conversation is not None and not isinstance(conversation, str):
        if not isinstance(conversation, dict):
            raise invalid_type("conversation", conversation, "a string or an object")
        if not isinstance(conversation.get("id"), str):
            raise invalid_type("conversation.id", conversation.get("id"), "a string")
    items = payload.get("input")
    if items is not None and not isinstance(items, str):
        if not isinstance(items, list):
            raise invalid_type("input", items, "a string or an array of input items")
        for index in range(known, len(items)):  # the first `known` were validated before
            _item(items[index], f"input[{index}]")
    check_object_array(payload, "tools")
    check_depth(payload)


def _item(item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise invalid_type(where, item, "an object")
    kind = item_type(item)
    if not isinstance(kind, str):
        raise invalid_type(f"{where}.type", kind, "a string")
    if kind == "message" and item.get("role") == "developer" and "content" not in item and "tools" in item:
        # Tools a developer adds at this point of the input.
        check_object_array(item, "tools", where=f"{where}.tools")
        return
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            shown = repr(role)[:60] if isinstance(role, str) else "a non-string"
            raise GatewayError(
                400,
                f"Invalid value for '{where}.role': {shown}. Supported values are: "
                + ", ".join(f"'{r}'" for r in ROLES)
                + ".",
                param=f"{where}.role",
            )
        content = item.get("content")
        if not isinstance(content, str | list):
            raise invalid_type(f"{where}.content", content, "a string or an array of content parts")
        check_content(content, f"{where}.content", depth=0)
        for name in CHAT_MESSAGE_FIELDS:
            if name in item:
                raise GatewayError(
                    400,
                    f"Unknown parameter: '{where}.{name}'.",
                    param=f"{where}.{name}",
                    code="unknown_parameter",
                )
        return
    for name in _ITEM_STRINGS.get(kind, ()):
        if not isinstance(item.get(name), str):
            raise invalid_type(f"{where}.{name}", item.get(name), "a string")
    for name in _ITEM_OPTIONAL_STRINGS.get(kind, ()):
        if not isinstance(item.get(name), str | None):
            raise invalid_type(f"{where}.{name}", item.get(name), "a string")
    if kind in _ITEM_OBJECTS and not isinstance(item.get(_ITEM_OBJECTS[kind]), dict):
        name = _ITEM_OBJECTS[kind]
        raise invalid_type(f"{where}.{name}", item.get(name), "an object")
    if kind == "shell_call_output":
        chunks = item.get("output")
        if not isinstance(chunks, list):
            raise invalid_type(f"{where}.output", chunks, "an array of output chunks")
        for number, chunk in enumerate(chunks):
            if not isinstance(chunk, dict):
                raise invalid_type(f"{where}.output[{number}]", chunk, "an object")
            for stream in ("stdout", "stderr"):
                if not isinstance(chunk.get(stream), str):
                    raise invalid_type(f"{where}.output[{number}].{stream}", chunk.get(stream), "a string")
    if kind == "computer_call":
        _computer_action(item, where)
    if kind == "computer_call_output":
        screenshot = item.get("output")
        if not isinstance(screenshot, dict):
            raise invalid_type(f"{where}.output", screenshot, "a computer_screenshot object")
        for name in ("image_url", "file_id", "detail"):
            if not isinstance(screenshot.get(name), str | None):
                raise invalid_type(f"{where}.output.{name}", screenshot.get(name), "a string")
    if kind == "apply_patch_call_output" and not isinstance(item.get("output"), str | None):
        raise invalid_type(f"{where}.output", item.get("output"), "a string")
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        if not isinstance(output, str | list):
            raise invalid_type(f"{where}.output", output, "a string or an array of content parts")
        check_content(output, f"{where}.output", depth=0)


def _computer_action(item: dict[str, Any], where: str) -> None:
    """A computer call holds its action as an object, or a batch of them as `actions`."""
    if "action" in item or "actions" not in item:
        if not isinstance(item.get("action"), dict):
            raise invalid_type(f"{where}.action", item.get("action"), "an object")
        return
    actions = item["actions"]
    if not isinstance(actions, list):
        raise invalid_type(f"{where}.actions", actions, "an array of objects")
    for number, action in enumerate(actions):
        if not isinstance(action, dict):
            raise invalid_type(f"{where}.actions[{number}]", action, "an object")
