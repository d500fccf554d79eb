"""The fake upstream's OpenAI Responses API: strict input validation, server state, answers, SSE.

Validation follows the real API where the gateway can break it: item types
and roles; every `function_call` answered by a `function_call_output` with
the same `call_id` ("No tool output found for function call …") and every
output answering an earlier call ("No tool call found for function call
output with call_id …"), across the stored history too; a `reasoning` item
must be followed by the item it produced; a computer call's output is a
screenshot and nothing else; the shapes the SDK's types allow besides (an
item reference or a message without `type`, a function output without
`call_id`, a developer item adding `tools`, a stored `prompt` naming the model
in place of `model`) are accepted. With a computer tool it answers computer
calls. `previous_response_id` and
`conversation` prepend history the fake stored; `truncation: "auto"` drops
the oldest items until the input fits, `"disabled"` (the default) refuses with
the Responses API's overflow error (a 400, or a `response.failed` event in a
200 stream). Pure: the state lives in `ResponsesState`, passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fakes.answers import ECHO_CHARS, ECHO_PREFIX, TOOL_TRIGGER, Identity, Usage, split_text, sse
from tests.fakes.tokens import count_text

Error = tuple[int, str, str | None, str | None]
"""(status, message, param, code) of the first problem found."""

# The calls of client-run tools, each with its output item's type.
CALL_OUTPUTS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "shell_call": "shell_call_output",
    "local_shell_call": "local_shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "computer_call": "computer_call_output",
}
COMPUTER_TOOLS = ("computer", "computer_use_preview")
OUTPUT_TYPES = frozenset(CALL_OUTPUTS.values())
ITEM_TYPES = ("message", "reasoning", "item_reference", *CALL_OUTPUTS, *OUTPUT_TYPES)
ROLES = ("user", "assistant", "system", "developer")
INPUT_PARTS = frozenset({"input_text", "input_image", "input_file"})
OUTPUT_PARTS = frozenset({"output_text", "refusal"})
TRUNCATIONS = ("auto", "disabled")
OVERFLOW_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
TOKENS_PER_ITEM = 3
IMAGE_TOKENS = 765


# Stored responses kept at most (oldest forgotten first), so a long benchmark stays bounded.
MAX_STORED = 1_000


@dataclass
class ResponsesState:
    """What the fake remembers between requests: stored responses and conversations (their items)."""

    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    conversations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    reasoning_of: dict[str, str] = field(default_factory=dict)
    """The reasoning item each output item with an id was produced after, by that item's id: sent
    back with its id, an item needs that reasoning item beside it."""

    def store(self, response_id: str, items: list[dict[str, Any]]) -> None:
        self.responses[response_id] = items
        if len(self.responses) > MAX_STORED:
            del self.responses[next(iter(self.responses))]

    def remember_reasoning(self, items: Sequence[Mapping[str, Any]]) -> None:
        """Note which reasoning item each later item of the same model turn came after."""
        reasoning: str | None = None
        for item in items:
            kind = item_type(item)
            if kind == "reasoning":
                reasoning = item.get("id")
            elif kind in OUTPUT_TYPES or (kind == "message" and item.get("role") != "assistant"):
                reasoning = None  # the client's side: the model's turn ended
            elif reasoning is not None and isinstance(item.get("id"), str):
                self.reasoning_of[item["id"]] = reasoning
        while len(self.reasoning_of) > 4 * MAX_STORED:
            del self.reasoning_of[next(iter(self.reasoning_of))]


def _invalid(message: str, param: str | None, code: str | None = "invalid_value") -> Error:
    return 400, message, param, code


def validate(body: object, state: ResponsesState, *, model_required: bool = True) -> Error | None:
    if not isinstance(body, Mapping):
        return _invalid("The request body must be a JSON object.", None, None)
    named = isinstance(body.get("model"), str) or isinstance(body.get("prompt"), Mapping)
    if model_required and not named:
        return _invalid("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return _invalid("Invalid type for 'instructions': expected a string.", "instructions", "invalid_type")
    truncation = body.get("truncation", "disabled")
    if truncation not in TRUNCATIONS:
        return _invalid(
            f"Invalid value: '{truncation}'. Supported values are: 'auto' and 'disabled'.", "truncation"
        )
    previous, conversation = body.get("previous_response_id"), body.get("conversation")
    if previous is not None and conversation is not None:
        return _invalid(
            "Mutually exclusive parameters: Ensure you are only providing one of: 'previous_response_id' "
            "or 'conversation'.",
            None,
            "mutually_exclusive_parameters",
        )
    if previous is not None and previous not in state.responses:
        return _invalid(f"Previous response with id '{previous}' not found.", "previous_response_id", None)
    if conversation is not None and _conversation_id(conversation) not in state.conversations:
        return (
            404,
            f"Conversation with id '{_conversation_id(conversation)}' not found.",
            "conversation",
            None,
        )
    items = body.get("input")
    if isinstance(items, str):
        return None
    if not isinstance(items, list):
        return _invalid(
            "Invalid type for 'input': expected one of a string or array.", "input", "invalid_type"
        )
    for index, item in enumerate(items):
        error = _check_item(index, item)
        if error:
            return error
    earlier = history(body, state)
    return _check_pairs(earlier, items) or _check_reasoned(earlier, items, state)


def _check_reasoned(
    earlier: Sequence[Mapping[str, Any]], items: Sequence[Mapping[str, Any]], state: ResponsesState
) -> Error | None:
    """An item sent back with the id of one a reasoning model produced after reasoning needs that
    reasoning item too (sent without its id, it is plain input)."""
    present = {item.get("id") for item in (*earlier, *items) if item_type(item) == "reasoning"}
    for item in items:
        item_id = item.get("id")
        required = state.reasoning_of.get(item_id) if isinstance(item_id, str) else None
        if required is not None and required not in present:
            return _invalid(
                f"Item '{item['id']}' of type '{item_type(item)}' was provided without its required "
                f"'reasoning' item: '{required}'.",
                "input",
                None,
            )
    return None


def _conversation_id(value: object) -> object:
    return value.get("id") if isinstance(value, Mapping) else value


def item_type(item: Mapping[str, Any]) -> object:
    """A message and an item reference may leave their type out, or send null (the SDK's types)."""
    kind = item.get("type")
    if kind is None:
        return "message" if "role" in item else "item_reference" if "id" in item else None
    return kind


def _check_item(index: int, item: object) -> Error | None:
    where = f"input[{index}]"
    if not isinstance(item, Mapping):
        return _invalid(f"Invalid type for '{where}': expected an object.", where, "invalid_type")
    kind = item_type(item)
    if kind not in ITEM_TYPES:
        supported = ", ".join(f"'{name}'" for name in ITEM_TYPES)
        return _invalid(f"Invalid value: '{kind}'. Supported values are: {supported}.", f"{where}.type")
    if kind == "message" and item.get("role") == "developer" and "content" not in item:
        if not isinstance(item.get("tools"), list):  # tools a developer adds at this point
            return _invalid(f"Missing required parameter: '{where}.content'.", f"{where}.content", None)
        return None
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            supported = ", ".join(f"'{name}'" for name in ROLES)
            return _invalid(f"Invalid value: '{role}'. Supported values are: {supported}.", f"{where}.role")
        content = item.get("content")
        if isinstance(content, str):
            return None
        if not isinstance(content, list):
            return _invalid(f"Missing required parameter: '{where}.content'.", f"{where}.content", None)
        allowed = OUTPUT_PARTS if role == "assistant" else INPUT_PARTS
        for position, part in enumerate(content):
            kind_of_part = part.get("type") if isinstance(part, Mapping) else None
            if kind_of_part not in allowed:
                supported = ", ".join(f"'{name}'" for name in sorted(allowed))
                return _invalid(
                    f"Invalid value: '{kind_of_part}'. Supported values are: {supported}.",
                    f"{where}.content[{position}].type",
                )
        return None
    required = {
        "function_call": ("call_id", "name", "arguments"),
        "function_call_output": ("output",),  # `call_id` optional: a program's call need not have one
        "custom_tool_call": ("call_id", "name", "input"),
        "custom_tool_call_output": ("call_id", "output"),
        "shell_call": ("call_id", "action"),
        "shell_call_output": ("call_id", "output"),
        "local_shell_call": ("id", "call_id", "action", "status"),
        "local_shell_call_output": ("id", "output"),
        "apply_patch_call": ("call_id", "operation", "status"),
        "apply_patch_call_output": ("call_id", "status"),
        "computer_call": ("id", "call_id", "pending_safety_checks", "status"),
        "computer_call_output": ("call_id", "output"),
        "reasoning": ("id", "summary"),
        "item_reference": ("id",),
    }[str(kind)]
    for name in required:
        if name not in item:
            param = f"{where}.{name}"
            return _invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    return _check_builtin_tool_item(where, str(kind), item)


def _check_builtin_tool_item(where: str, kind: str, item: Mapping[str, Any]) -> Error | None:
    """The shapes of the built-in tools' items that the API holds strictly: a shell call's commands,
    its output's chunks, a patch's operation, a local shell output's JSON text."""
    problem: tuple[str, str] | None = None  # (param, expected)
    if kind == "shell_call":
        commands = item["action"].get("commands") if isinstance(item["action"], Mapping) else None
        if not (isinstance(commands, list) and all(isinstance(c, str) for c in commands)):
            problem = (f"{where}.action.commands", "an array of strings")
    elif kind == "shell_call_output":
        chunks = item["output"]
        if not isinstance(chunks, list):
            problem = (f"{where}.output", "an array")
        for n, chunk in enumerate(chunks if isinstance(chunks, list) else []):
            if not (
                isinstance(chunk, Mapping)
                and isinstance(chunk.get("stdout"), str)
                and isinstance(chunk.get("stderr"), str)
                and isinstance(chunk.get("outcome"), Mapping)
                and chunk["outcome"].get("type") in ("exit", "timeout")
            ):
                problem = (f"{where}.output[{n}]", "an object with stdout, stderr and outcome")
                break
    elif kind == "local_shell_call":
        action = item["action"]
        if not (
            isinstance(action, Mapping)
            and action.get("type") == "exec"
            and isinstance(action.get("command"), list)
            and all(isinstance(c, str) for c in action["command"])
        ):
            problem = (f"{where}.action", "an exec action with its command")
    elif kind == "apply_patch_call":
        operation = item["operation"]
        if not (
            isinstance(operation, Mapping)
            and operation.get("type") in ("create_file", "update_file", "delete_file")
            and isinstance(operation.get("path"), str)
            and (operation["type"] == "delete_file" or isinstance(operation.get("diff"), str))
        ):
            problem = (f"{where}.operation", "a create_file, update_file or delete_file operation")
    elif kind == "computer_call":
        action, actions = item.get("action"), item.get("actions")
        batch = isinstance(actions, list) and all(isinstance(a, Mapping) and "type" in a for a in actions)
        if not (isinstance(action, Mapping) and "type" in action) and not batch:
            problem = (f"{where}.action", "an object with its type")
    elif kind == "computer_call_output":
        screenshot = item["output"]
        if not isinstance(screenshot, Mapping) or screenshot.get("type") != "computer_screenshot":
            kind_of = screenshot.get("type") if isinstance(screenshot, Mapping) else None
            return _invalid(
                f"Invalid value: '{kind_of}'. Supported values are: 'computer_screenshot'.",
                f"{where}.output.type",
            )
        if not isinstance(screenshot.get("image_url") or screenshot.get("file_id"), str):
            problem = (f"{where}.output.image_url", "a string")
    elif kind in ("apply_patch_call_output", "local_shell_call_output"):
        optional = kind == "apply_patch_call_output" and item.get("output") is None
        if not (optional or isinstance(item.get("output"), str)):
            problem = (f"{where}.output", "a string")
    if problem is None:
        return None
    return _invalid(f"Invalid type for '{problem[0]}': expected {problem[1]}.", problem[0], "invalid_type")


def _answers(output: Mapping[str, Any]) -> object:
    """The call id an output item answers: a local shell output names it as its `id`."""
    return output.get("id" if item_type(output) == "local_shell_call_output" else "call_id")


def _made_by_a_program(output: Mapping[str, Any]) -> bool:
    """A function output with no call id (programmatic tool calling: the SDK's optional `call_id`)."""
    return item_type(output) == "function_call_output" and output.get("call_id") is None


def _check_pairs(earlier: Sequence[Mapping[str, Any]], items: Sequence[Any]) -> Error | None:
    outputs = set(CALL_OUTPUTS.values())
    calls = {item.get("call_id") for item in earlier if item_type(item) in CALL_OUTPUTS}
    answered = {_answers(item) for item in (*earlier, *items) if item_type(item) in outputs}
    for index, item in enumerate(items):
        kind = item_type(item)
        if kind in CALL_OUTPUTS:
            if item["call_id"] not in answered:
                return _invalid(f"No tool output found for function call {item['call_id']}.", "input", None)
            calls.add(item["call_id"])
        elif kind in outputs and _answers(item) not in calls and not _made_by_a_program(item):
            return _invalid(
                f"No tool call found for function call output with call_id {_answers(item)}.", "input", None
            )
        elif kind == "reasoning":
            following = items[index + 1] if index + 1 < len(items) else None
            if (
                following is None
                or item_type(following) == "reasoning"
                or (item_type(following) == "message" and following.get("role") != "assistant")
            ):
                return _invalid(
                    f"Item '{item['id']}' of type 'reasoning' was provided without its required "
                    "following item.",
                    "input",
                    None,
                )
    return None


def as_items(value: object) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return [dict(item) for item in value] if isinstance(value, list) else []


def history(body: Mapping[str, Any], state: ResponsesState) -> list[dict[str, Any]]:
    """Items the server already holds for this request (previous response or conversation)."""
    previous = body.get("previous_response_id")
    if previous is not None:
        return state.responses.get(previous, [])
    conversation = body.get("conversation")
    if conversation is not None:
        return state.conversations.get(str(_conversation_id(conversation)), [])
    return []


# -- counting (the fake's own rules) ------------------------------------------


def _count_content(content: object) -> int:
    if isinstance(content, str):
        return count_text(content)
    total = 0
    for part in content if isinstance(content, list) else ():
        if isinstance(part, Mapping):
            if part.get("type") == "input_image":
                total += IMAGE_TOKENS
            else:
                total += count_text(part.get("text"))
    return total


def count_item(item: Mapping[str, Any]) -> int:
    kind = item_type(item)
    total = TOKENS_PER_ITEM
    if kind == "message":
        return total + count_text(item.get("role")) + _count_content(item.get("content"))
    if kind in ("function_call", "custom_tool_call"):
        return total + count_text(item.get("name")) + count_text(item.get("arguments") or item.get("input"))
    if kind in ("function_call_output", "custom_tool_call_output"):
        return total + _count_content(item.get("output"))
    if kind in ("shell_call", "local_shell_call"):
        return total + count_text(orjson.dumps(item.get("action")).decode())
    if kind == "apply_patch_call":
        return total + count_text(orjson.dumps(item.get("operation")).decode())
    if kind == "computer_call":
        return total + count_text(orjson.dumps(item.get("action") or item.get("actions")).decode())
    if kind == "computer_call_output":  # the model sees the screenshot
        return total + IMAGE_TOKENS
    if kind == "shell_call_output":  # the model reads what the commands printed
        chunks = item.get("output") if isinstance(item.get("output"), list) else []
        return total + sum(
            count_text(chunk.get("stdout")) + count_text(chunk.get("stderr"))
            for chunk in chunks
            if isinstance(chunk, Mapping)
        )
    if kind in ("local_shell_call_output", "apply_patch_call_output"):
        return total + count_text(item.get("output"))
    if kind == "reasoning":
        summary = item.get("summary")
        texts = (
            [part.get("text") for part in summary if isinstance(part, Mapping)]
            if isinstance(summary, list)
            else []
        )
        encrypted = item.get("encrypted_content")
        return (
            total
            + sum(count_text(t) for t in texts)
            + (len(encrypted) // 4 if isinstance(encrypted, str) else 0)
        )
    return total + count_text(orjson.dumps(item).decode())


def count_input(instructions: object, items: Sequence[Mapping[str, Any]], tools: object) -> int:
    total = count_text(instructions) + sum(count_item(item) for item in items)
    if tools:
        total += count_text(orjson.dumps(tools).decode())
    return total


def truncate_to_fit(items: list[dict[str, Any]], room: int) -> list[dict[str, Any]]:
    """What `truncation: "auto"` keeps: the newest items, dropping from the start (a call with its output)."""
    kept = list(items)
    while kept and sum(count_item(item) for item in kept) > room:
        first = kept.pop(0)
        if item_type(first) in CALL_OUTPUTS:
            kept = [item for item in kept if _answers(item) != first.get("call_id")]
    return kept


# -- answers ----------------------------------------------------------------


def _last_user_text(items: Sequence[Mapping[str, Any]]) -> str:
    for item in reversed(items):
        if item_type(item) == "message" and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            texts = [p.get("text") for p in content or () if isinstance(p, Mapping)]
            return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def output_items(
    body: Mapping[str, Any], items: Sequence[Mapping[str, Any]], serial: int
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(body.get("reasoning"), Mapping):
        out.append({"type": "reasoning", "id": f"rs_fake_{serial}", "summary": []})
    tools = body.get("tools")
    name = (
        tools[0].get("name") if isinstance(tools, list) and tools and isinstance(tools[0], Mapping) else None
    )
    last = items[-1] if items else {}
    user_text = _last_user_text(items)
    computer = isinstance(tools, list) and any(
        isinstance(tool, Mapping) and tool.get("type") in COMPUTER_TOOLS for tool in tools
    )
    if computer and (item_type(last) == "computer_call_output" or TOOL_TRIGGER in user_text):
        action = {"type": "click", "button": "left", "x": 10 * serial, "y": 20}
        out.append(
            {
                "type": "computer_call",
                "id": f"cu_fake_{serial}",
                "call_id": f"call_fake_{serial}",
                "action": action,
                "pending_safety_checks": [],
                "status": "completed",
            }
        )
        return out
    if isinstance(name, str) and item_type(last) == "message" and TOOL_TRIGGER in user_text:
        out.append(
            {
                "type": "function_call",
                "id": f"fc_fake_{serial}",
                "call_id": f"call_fake_{serial}",
                "name": name,
                "arguments": "{}",
                "status": "completed",
            }
        )
        return out
    text = ECHO_PREFIX + user_text[:ECHO_CHARS]
    out.append(
        {
            "type": "message",
            "id": f"msg_fake_{serial}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    )
    return out


def spoken(items: Sequence[Mapping[str, Any]]) -> str:
    texts = []
    for item in items:
        if item_type(item) == "message":
            texts += [part["text"] for part in item["content"]]
        elif item_type(item) == "function_call":
            texts.append(item["name"] + item["arguments"])
    return " ".join(texts)


def response(
    identity: Identity,
    body: Mapping[str, Any],
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": identity.id,
        "object": "response",
        "created_at": identity.created,
        "status": status,
        "error": error,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "model": identity.model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store", True),
        "tool_choice": "auto",
        "tools": body.get("tools") or [],
        "truncation": body.get("truncation", "disabled"),
        "usage": usage.responses() if usage else None,
    }


def _item_events(index: int, item: Mapping[str, Any]) -> list[dict[str, Any]]:
    added = {"type": "response.output_item.added", "output_index": index}
    done = {"type": "response.output_item.done", "output_index": index, "item": item}
    if item_type(item) == "function_call":
        where = {"item_id": item["id"], "output_index": index}
        return [
            {**added, "item": {**item, "arguments": "", "status": "in_progress"}},
            {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]},
            done,
        ]
    if item_type(item) != "message":
        return [{**added, "item": item}, done]
    text = item["content"][0]["text"]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    empty_part = {"type": "output_text", "text": "", "annotations": []}
    return [
        {**added, "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **where, "part": empty_part},
        *({"type": "response.output_text.delta", **where, "delta": piece} for piece in split_text(text)),
        {"type": "response.output_text.done", **where, "text": text},
        {"type": "response.content_part.done", **where, "part": item["content"][0]},
        done,
    ]


def events(
    identity: Identity, body: Mapping[str, Any], output: list[dict[str, Any]], usage: Usage
) -> list[bytes]:
    """A streamed answer: created, in_progress, each item's events, completed (named events, no [DONE])."""
    opening = response(identity, body, status="in_progress", output=[], usage=None)
    payloads: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    for index, item in enumerate(output):
        payloads += _item_events(index, item)
    payloads.append(
        {
            "type": "response.completed",
            "response": response(identity, body, status="completed", output=output, usage=usage),
        }
    )
    return [sse({**payload, "sequence_number": n}, payload["type"]) for n, payload in enumerate(payloads)]


def failed_events(identity: Identity, body: Mapping[str, Any]) -> list[bytes]:
    """An overflow found once the stream began: created, then response.failed with the error."""
    opening = response(identity, body, status="in_progress", output=[], usage=None)
    error = {"code": "context_length_exceeded", "message": OVERFLOW_MESSAGE}
    failed = response(identity, body, status="failed", output=[], usage=None, error=error)
    payloads = [
        {"type": "response.created", "response": opening},
        {"type": "response.failed", "response": failed},
    ]
    return [sse({**payload, "sequence_number": n}, payload["type"]) for n, payload in enumerate(payloads)]
