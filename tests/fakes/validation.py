"""Strict validation of a chat-completions `messages` list, worded like the real APIs.

The gateway promises that whatever it sends upstream "is accepted by a strict
API". This is that strict API: the shape checks and the tool-pairing rules of
OpenAI (`tool_calls` / `role: tool`) and of Anthropic (`tool_use` /
`tool_result` content blocks), with the providers' own error texts so tests
read like production logs. Pure: no I/O, no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Error = tuple[str, str]
"""(message, param) of the first problem found."""

ROLES = ("system", "assistant", "user", "function", "tool", "developer")
# Roles whose messages must carry content; an assistant may instead carry tool calls.
CONTENT_REQUIRED = ("system", "developer", "user", "tool")

# "preceeding" is the API's own spelling.
TOOL_WITHOUT_CALL = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
    "with 'tool_calls'."
)
CALL_WITHOUT_TOOL = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
    "'tool_call_id'. The following tool_call_ids did not have response messages: {ids}"
)
TOOL_USE_WITHOUT_RESULT = (
    "messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: {ids}. "
    "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
)
RESULT_WITHOUT_TOOL_USE = (
    "messages.{index}.content.{block}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. "
    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
)
RESULTS_NOT_FIRST = (
    "messages.{index}: Did not find {count} `tool_result` block(s) at the beginning of this message. "
    "Messages following `tool_use` blocks must begin with a matching number of `tool_result` blocks."
)


def validate_chat_messages(messages: object) -> Error | None:
    """Return (message, param) of the first error the real API would report, or None if valid."""
    if not isinstance(messages, list):
        return _invalid_type("messages", "an array", messages)
    if not messages:
        return _empty_array("messages")
    for index, message in enumerate(messages):
        error = _check_shape(index, message)
        if error is not None:
            return error
    return _check_tool_calls(messages) or _check_tool_use_blocks(messages)


def _json_type(value: object) -> str:
    # bool before int: bool is an int subclass in Python but not in JSON.
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "null"


def _invalid_type(param: str, expected: str, value: object) -> Error:
    return f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.", param


def _empty_array(param: str) -> Error:
    expected = "Expected an array with minimum length 1, but got an empty array instead."
    return f"Invalid '{param}': empty array. {expected}", param


def _check_shape(index: int, message: object) -> Error | None:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        return _invalid_type(where, "an object", message)
    if "role" not in message:
        return f"Missing required parameter: '{where}.role'.", f"{where}.role"
    role = message["role"]
    if role not in ROLES:
        supported = ", ".join(f"'{r}'" for r in ROLES[:-1]) + f", and '{ROLES[-1]}'"
        return f"Invalid value: '{role}'. Supported values are: {supported}.", f"{where}.role"
    if role in CONTENT_REQUIRED and "content" not in message:
        return f"Missing required parameter: '{where}.content'.", f"{where}.content"
    if message.get("content") is None and not (role == "assistant" and _has_calls(message)):
        return "Invalid value for 'content': expected a string, got null.", f"messages.[{index}].content"
    if role == "tool" and "tool_call_id" not in message:
        return f"Missing required parameter: '{where}.tool_call_id'.", f"{where}.tool_call_id"
    if role == "assistant" and "tool_calls" in message:
        return _check_tool_calls_shape(where, message["tool_calls"])
    return None


def _has_calls(message: Mapping[str, Any]) -> bool:
    return bool(message.get("tool_calls")) or message.get("function_call") is not None


def _check_tool_calls_shape(where: str, calls: object) -> Error | None:
    param = f"{where}.tool_calls"
    if not isinstance(calls, list):
        return _invalid_type(param, "an array", calls)
    if not calls:
        return _empty_array(param)
    for position, call in enumerate(calls):
        if not isinstance(call, Mapping):
            return _invalid_type(f"{param}[{position}]", "an object", call)
        if "id" not in call:
            return f"Missing required parameter: '{param}[{position}].id'.", f"{param}[{position}].id"
        # A function call names its function and passes JSON text; a custom tool's, free text.
        kind = "custom" if call.get("type") == "custom" else "function"
        request = call.get(kind)
        fields = ("name", "input") if kind == "custom" else ("name", "arguments")
        if not isinstance(request, Mapping):
            return f"Missing required parameter: '{param}[{position}].{kind}'.", f"{param}[{position}].{kind}"
        for field in fields:
            if not isinstance(request.get(field), str):
                return _invalid_type(f"{param}[{position}].{kind}.{field}", "a string", request.get(field))
    return None


def _check_tool_calls(messages: Sequence[Mapping[str, Any]]) -> Error | None:
    """OpenAI pairing: tool messages directly follow their assistant and answer each of its calls once."""
    pending: list[object] = []  # ids of the current assistant's calls not answered yet
    owner = -1  # index of that assistant
    for index, message in enumerate(messages):
        if message["role"] == "tool":
            if message["tool_call_id"] not in pending:
                return TOOL_WITHOUT_CALL, f"messages.[{index}].role"
            pending.remove(message["tool_call_id"])
            continue
        if pending:
            break
        if message["role"] == "assistant" and message.get("tool_calls"):
            pending = [call["id"] for call in message["tool_calls"]]
            owner = index
    if pending:
        return CALL_WITHOUT_TOOL.format(ids=", ".join(map(str, pending))), f"messages.[{owner}].role"
    return None


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, Mapping)]


def _tool_use_ids(message: Mapping[str, Any]) -> list[object]:
    if message["role"] != "assistant":
        return []
    return [block.get("id") for block in _blocks(message) if block.get("type") == "tool_use"]


def _check_tool_use_blocks(messages: Sequence[Mapping[str, Any]]) -> Error | None:
    """Anthropic pairing: each `tool_use` is answered by a `tool_result` in the very next (user) message."""
    for index, message in enumerate(messages):
        offered = _tool_use_ids(messages[index - 1]) if index else []
        for block_index, block in enumerate(_blocks(message)):
            tool_use_id = block.get("tool_use_id")
            if block.get("type") == "tool_result" and tool_use_id not in offered:
                text = RESULT_WITHOUT_TOOL_USE.format(index=index, block=block_index, id=tool_use_id)
                return text, f"messages.[{index}].content"
        used = _tool_use_ids(message)
        if not used:
            continue
        following = messages[index + 1] if index + 1 < len(messages) else None
        answered = []
        if following is not None and following["role"] == "user":
            answered = [b.get("tool_use_id") for b in _blocks(following) if b.get("type") == "tool_result"]
        missing = [tool_use_id for tool_use_id in used if tool_use_id not in answered]
        if missing:
            text = TOOL_USE_WITHOUT_RESULT.format(index=index, ids=", ".join(map(str, missing)))
            return text, f"messages.[{index}].content"
        assert following is not None  # every id answered: the next message holds the results
        leading = _blocks(following)[: len(used)]
        if len(leading) < len(used) or any(block.get("type") != "tool_result" for block in leading):
            text = RESULTS_NOT_FIRST.format(index=index + 1, count=len(used))
            return text, f"messages.[{index + 1}].content"
    return None


DEEPSEEK_THINKING_MODELS = ("deepseek-reasoner", "deepseek-v4")
MISSING_REASONING = (
    "Missing `reasoning_content` field in the assistant message at message index {index}. For more "
    "information, please refer to https://api-docs.deepseek.com/guides/thinking_mode#tool-calls"
)


def thinking_mode(body: Mapping[str, Any]) -> bool:
    """DeepSeek's thinking mode: a reasoner model, or `thinking: {"type": "enabled"}` (for any
    model but Claude's, whose rule is `check_final_thinking`)."""
    model = str(body.get("model", ""))
    return (thinking_enabled(body) and not model.startswith("claude")) or model.startswith(
        DEEPSEEK_THINKING_MODELS
    )


def thinking_enabled(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") == "enabled"


# Claude's rule as a gateway in front of it (litellm) answers it for chat completions, its signed
# thinking carried beside the assistant message.
FINAL_THINKING = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`. "
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block "
    "(preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
    "thinking blocks from previous turns. To avoid this requirement, disable `thinking`."
)
CHAT_SIGNED = ("thinking_blocks", "reasoning_details")


def check_final_thinking(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """Claude with thinking on, through chat completions: where the last user turn carries tool
    results (tool messages, then any user messages), the assistant they answer carries its signed
    thinking (litellm's `thinking_blocks`, OpenRouter's `reasoning_details`)."""
    end = len(messages)
    while end > 0 and messages[end - 1].get("role") == "user":
        end -= 1
    start = end
    while start > 0 and messages[start - 1].get("role") == "tool":
        start -= 1
    if start == end or start == 0 or messages[start - 1].get("role") != "assistant":
        return None
    assistant = messages[start - 1]
    if any(isinstance(assistant.get(key), list) and assistant[key] for key in CHAT_SIGNED):
        return None
    system = sum(1 for m in messages[:start] if m.get("role") in ("system", "developer"))
    return FINAL_THINKING.format(index=start - 1 - system)


def check_reasoning_passed_back(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """DeepSeek in thinking mode: every assistant message after the last user message carries
    `reasoning_content` (empty allowed), as its tool loop needs it passed back."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    for index in range(users[-1] + 1 if users else 0, len(messages)):
        message = messages[index]
        if message.get("role") == "assistant" and not isinstance(message.get("reasoning_content"), str):
            return MISSING_REASONING.format(index=index)
    return None


def alternates(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether user and assistant messages alternate after the system prompt, starting with the
    user, as strict chat templates check it (Mistral's: tool calls and their results are left
    out of the check, so an agent loop passes)."""
    roles = [
        m.get("role")
        for m in messages
        if m.get("role") == "user" or (m.get("role") == "assistant" and not m.get("tool_calls"))
    ]
    return all(role == ("user" if n % 2 == 0 else "assistant") for n, role in enumerate(roles))
