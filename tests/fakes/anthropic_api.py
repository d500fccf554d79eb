"""The fake upstream's Anthropic Messages API: strict validation, answers, SSE events.

Validation follows the real API's rules where the gateway can break them:
consecutive turns of one role are merged (as the API does) and then every
`tool_use` must be answered by a `tool_result` in the very next user turn and
every `tool_result` must answer the turn before; `thinking` blocks carry a
signature the fake issued over their exact text, so an edited block is
refused ("Invalid `signature`"); with thinking enabled, the assistant turn
that the final tool results answer must start with a thinking block; at most
4 blocks may carry `cache_control`; a `system` message in the list holds text only (the SDK's
`SystemMessageParam`). Error texts are Anthropic's.

Overflow: prompt > window is "prompt is too long"; prompt + max_tokens >
window is the `max_tokens` wording, unless the request opts into the beta
`model-context-window-exceeded-2025-08-26`, in which case the API answers 200
and stops with `stop_reason: "model_context_window_exceeded"`.
Pure: no I/O, no state.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tests.fakes.answers import ECHO_CHARS, ECHO_PREFIX, TOOL_TRIGGER, Identity, split_text
from tests.fakes.tokens import count_text
from tests.fakes.validation import RESULT_WITHOUT_TOOL_USE, RESULTS_NOT_FIRST, TOOL_USE_WITHOUT_RESULT

Error = tuple[str, str]
"""(error type, message) of the first problem found."""

VERSION = "2023-06-01"
CONTEXT_WINDOW_BETA = "model-context-window-exceeded-2025-08-26"
MAX_CACHE_CONTROL = 4
MIN_THINKING_BUDGET = 1024
SIGNATURE_KEY = b"fake-upstream-thinking"
THINKING_TEXT = "Let me think about this step by step."
REDACT_TRIGGER = "REDACT"
USER_BLOCKS = frozenset({"text", "image", "document", "tool_result", "search_result"})
ASSISTANT_BLOCKS = frozenset(
    {"text", "tool_use", "thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result"}
)
TOOL_RESULT_BLOCKS = frozenset({"text", "image", "document", "search_result"})

THINKING_FIRST = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. "
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block "
    "(preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
    "thinking blocks from previous turns. To avoid this requirement, disable `thinking`. Please consult "
    "our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)
NON_EMPTY = (
    "messages.{index}: all messages must have non-empty content except for the optional final "
    "assistant message"
)
TOO_MANY_CACHE_CONTROL = "A maximum of 4 blocks with cache_control may be provided. Found {count}."


def error_body(kind: str, message: str, request_id: str = "req_fake") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}


def sign(thinking: str) -> str:
    """The fake's signature of a thinking text: any edit of the text invalidates it."""
    digest = hashlib.sha256(SIGNATURE_KEY + thinking.encode("utf-8", "surrogatepass")).digest()
    return base64.b64encode(digest).decode()


def redacted(text: str) -> str:
    payload = base64.b64encode(text.encode()).decode()
    return f"{payload}.{sign(payload)}"


def _redacted_valid(data: str) -> bool:
    payload, _, signature = data.partition(".")
    return signature == sign(payload)


# -- validation -----------------------------------------------------------


def validate(body: object, *, count_only: bool = False) -> Error | None:
    """The first error the real API would answer for this body, or None."""
    if not isinstance(body, Mapping):
        return "invalid_request_error", "Input should be a valid dictionary"
    if not isinstance(body.get("model"), str):
        return "invalid_request_error", "model: Field required"
    if not count_only:
        max_tokens = body.get("max_tokens")
        if "max_tokens" not in body:
            return "invalid_request_error", "max_tokens: Field required"
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return "invalid_request_error", "max_tokens: Input should be a valid integer greater than 0"
    error = _check_system(body.get("system")) or _check_thinking_config(body)
    if error:
        return error
    messages = body.get("messages")
    if not isinstance(messages, list):
        return "invalid_request_error", "messages: Field required" if messages is None else (
            "messages: Input should be a valid list"
        )
    if not messages:
        return "invalid_request_error", "messages: at least one message is required"
    for index, message in enumerate(messages):
        error = _check_message(index, message, last=index == len(messages) - 1)
        if error:
            return error
    return _check_pairs(messages) or _check_thinking(body, messages) or _check_cache_control(body, messages)


def _check_system(system: object) -> Error | None:
    if system is None or isinstance(system, str):
        return None
    if not isinstance(system, list):
        return "invalid_request_error", "system: Input should be a valid list"
    for index, block in enumerate(system):
        if (
            not isinstance(block, Mapping)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            return "invalid_request_error", f"system.{index}: Input should be a valid text block"
    return None


def thinking_enabled(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") == "enabled"


def _check_thinking_config(body: Mapping[str, Any]) -> Error | None:
    if not thinking_enabled(body):
        return None
    budget = body["thinking"].get("budget_tokens")
    if not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
        return (
            "invalid_request_error",
            f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}",
        )
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and budget >= max_tokens:
        return "invalid_request_error", "`max_tokens` must be greater than `thinking.budget_tokens`."
    return None


def _check_message(index: int, message: object, *, last: bool) -> Error | None:
    where = f"messages.{index}"
    if not isinstance(message, Mapping):
        return "invalid_request_error", f"{where}: Input should be a valid dictionary"
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        return "invalid_request_error", f"{where}.role: Input should be 'user', 'assistant' or 'system'"
    content = message.get("content")
    if role == "system":  # text only (the SDK's SystemMessageParam)
        blocks = [content] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            return "invalid_request_error", NON_EMPTY.format(index=index)
        for position, block in enumerate(blocks):
            text = isinstance(block, str) or (isinstance(block, Mapping) and block.get("type") == "text")
            if not text:
                return "invalid_request_error", f"{where}.content.{position}: Input should be a text block"
        return None
    if isinstance(content, str):
        if not content and not (last and role == "assistant"):
            return "invalid_request_error", NON_EMPTY.format(index=index)
        return None
    if not isinstance(content, list):
        return "invalid_request_error", f"{where}.content: Input should be a valid list"
    if not content and not (last and role == "assistant"):
        return "invalid_request_error", NON_EMPTY.format(index=index)
    allowed = USER_BLOCKS if role == "user" else ASSISTANT_BLOCKS
    for position, block in enumerate(content):
        error = _check_block(f"{where}.content.{position}", block, allowed)
        if error:
            return error
    return None


def _check_block(where: str, block: object, allowed: frozenset[str]) -> Error | None:
    if not isinstance(block, Mapping):
        return "invalid_request_error", f"{where}: Input should be a valid dictionary"
    kind = block.get("type")
    if kind not in allowed:
        expected = ", ".join(f"'{name}'" for name in sorted(allowed))
        return (
            "invalid_request_error",
            f"{where}: Input tag '{kind}' found using 'type' does not match any of the expected tags: "
            + expected,
        )
    if kind == "text":
        if not isinstance(block.get("text"), str):
            return "invalid_request_error", f"{where}.text: Field required"
        if not block["text"]:
            return "invalid_request_error", "messages: text content blocks must be non-empty"
        if not block["text"].strip():
            return "invalid_request_error", "messages: text content blocks must contain non-whitespace text"
    elif kind == "tool_use":
        if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
            return "invalid_request_error", f"{where}.id: Field required"
        if not isinstance(block.get("input"), Mapping):
            return "invalid_request_error", f"{where}.input: Input should be a valid dictionary"
    elif kind == "tool_result":
        if not isinstance(block.get("tool_use_id"), str):
            return "invalid_request_error", f"{where}.tool_use_id: Field required"
        inner = block.get("content")
        if isinstance(inner, list):
            for position, part in enumerate(inner):
                error = _check_block(f"{where}.content.{position}", part, TOOL_RESULT_BLOCKS)
                if error:
                    return error
        elif inner is not None and not isinstance(inner, str):
            return "invalid_request_error", f"{where}.content: Input should be a valid list"
    elif kind == "thinking":
        if "cache_control" in block:
            return "invalid_request_error", f"{where}.thinking.cache_control: Extra inputs are not permitted"
        text, signature = block.get("thinking"), block.get("signature")
        if not isinstance(text, str) or not isinstance(signature, str):
            return "invalid_request_error", f"{where}.thinking.signature: Field required"
        if signature != sign(text):
            return "invalid_request_error", f"{where}: Invalid `signature` in `thinking` block"
    elif kind == "redacted_thinking":
        data = block.get("data")
        if not isinstance(data, str) or not _redacted_valid(data):
            return "invalid_request_error", f"{where}: Invalid `data` in `redacted_thinking` block"
    elif kind in ("image", "document") and not isinstance(block.get("source"), Mapping):
        return "invalid_request_error", f"{where}.source: Field required"
    return None


@dataclass(frozen=True)
class _Turn:
    role: str
    indices: tuple[int, ...]  # the messages merged into it


def _turns(messages: Sequence[Mapping[str, Any]]) -> list[_Turn]:
    """Consecutive messages of one role, merged as the API merges them."""
    turns: list[_Turn] = []
    for index, message in enumerate(messages):
        if turns and turns[-1].role == message["role"]:
            turns[-1] = _Turn(message["role"], (*turns[-1].indices, index))
        else:
            turns.append(_Turn(message["role"], (index,)))
    return turns


def _blocks(messages: Sequence[Mapping[str, Any]], turn: _Turn) -> list[tuple[int, int, Mapping[str, Any]]]:
    found = []
    for index in turn.indices:
        content = messages[index]["content"]
        if isinstance(content, list):
            found += [(index, position, block) for position, block in enumerate(content)]
    return found


def _check_pairs(messages: Sequence[Mapping[str, Any]]) -> Error | None:
    turns = _turns(messages)
    for number, turn in enumerate(turns):
        if turn.role == "user":
            previous = turns[number - 1] if number else None
            offered = (
                {b.get("id") for _, _, b in _blocks(messages, previous) if b.get("type") == "tool_use"}
                if previous
                else set()
            )
            for index, position, block in _blocks(messages, turn):
                if block.get("type") == "tool_result" and block.get("tool_use_id") not in offered:
                    text = RESULT_WITHOUT_TOOL_USE.format(
                        index=index, block=position, id=block.get("tool_use_id")
                    )
                    return "invalid_request_error", text
            continue
        used = [b.get("id") for _, _, b in _blocks(messages, turn) if b.get("type") == "tool_use"]
        if not used:
            continue
        following = turns[number + 1] if number + 1 < len(turns) else None
        answered = (
            {
                b.get("tool_use_id")
                for _, _, b in _blocks(messages, following)
                if b.get("type") == "tool_result"
            }
            if following
            else set()
        )
        missing = [tool_use_id for tool_use_id in used if tool_use_id not in answered]
        if missing:
            text = TOOL_USE_WITHOUT_RESULT.format(index=turn.indices[-1], ids=", ".join(map(str, missing)))
            return "invalid_request_error", text
        assert following is not None  # every id answered: the next turn holds the results
        kinds = [kind for index in following.indices for kind in _block_kinds(messages[index]["content"])]
        if any(kind != "tool_result" for kind in kinds[: len(used)]):
            return "invalid_request_error", RESULTS_NOT_FIRST.format(
                index=following.indices[0], count=len(used)
            )
    return None


def _block_kinds(content: object) -> list[object]:
    """The types of a message's blocks, as the API reads them: text content is one text block."""
    if isinstance(content, str):
        return ["text"]
    return (
        [block.get("type") for block in content if isinstance(block, Mapping)]
        if isinstance(content, list)
        else []
    )


def _check_thinking(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> Error | None:
    """With thinking on, the assistant turn answered by the final tool results starts with thinking."""
    return final_thinking_error(messages) if thinking_enabled(body) else None


def final_thinking_error(messages: Sequence[Mapping[str, Any]]) -> Error | None:
    """The thinking rule as it applies with thinking on (user and assistant messages only)."""
    turns = _turns(messages)
    if len(turns) < 2:
        return None
    last = turns[-1]
    if last.role != "user":
        return None
    if not any(b.get("type") == "tool_result" for _, _, b in _blocks(messages, last)):
        return None
    assistant = turns[-2]
    first_index = assistant.indices[0]
    content = messages[first_index]["content"]
    first = content[0] if isinstance(content, list) and content else {"type": "text"}
    if first.get("type") not in ("thinking", "redacted_thinking"):
        return "invalid_request_error", THINKING_FIRST.format(index=first_index, found=first.get("type"))
    return None


def cache_control_count(body: Mapping[str, Any]) -> int:
    def marked(blocks: object) -> int:
        if not isinstance(blocks, list):
            return 0
        total = 0
        for block in blocks:
            if isinstance(block, Mapping):
                total += "cache_control" in block
                if block.get("type") == "tool_result":
                    total += marked(block.get("content"))
        return total

    total = marked(body.get("tools")) + marked(body.get("system"))
    for message in body.get("messages") or ():
        if isinstance(message, Mapping):
            total += marked(message.get("content"))
    return total


def _check_cache_control(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> Error | None:
    count = cache_control_count(body)
    if count > MAX_CACHE_CONTROL:
        return "invalid_request_error", TOO_MANY_CACHE_CONTROL.format(count=count)
    return None


# -- counting (the fake's own rules) ------------------------------------------

TOKENS_PER_MESSAGE = 4
TOKENS_PER_BLOCK = 2
IMAGE_TOKENS = 1_000
DOCUMENT_TOKENS = 1_500


def _count_blocks(content: object) -> int:
    if isinstance(content, str):
        return count_text(content)
    if not isinstance(content, list):
        return 0
    total = 0
    for block in content:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        total += TOKENS_PER_BLOCK
        if kind == "text":
            total += count_text(block.get("text"))
        elif kind == "thinking":
            total += count_text(block.get("thinking"))
        elif kind == "redacted_thinking":
            total += len(str(block.get("data"))) // 8
        elif kind == "tool_use":
            total += count_text(block.get("name")) + count_text(orjson.dumps(block.get("input")).decode())
        elif kind == "tool_result":
            total += _count_blocks(block.get("content"))
        elif kind == "image":
            total += IMAGE_TOKENS
        elif kind == "document":
            total += DOCUMENT_TOKENS
        else:
            total += count_text(orjson.dumps(block).decode())
    return total


def count_input(body: Mapping[str, Any]) -> int:
    """Input tokens of a validated body: system, messages, tools."""
    total = _count_blocks(body.get("system"))
    for message in body["messages"]:
        total += TOKENS_PER_MESSAGE + _count_blocks(message["content"])
    if body.get("tools"):
        total += count_text(orjson.dumps(body["tools"]).decode())
    return total


# -- answers ----------------------------------------------------------------


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, Mapping) and b.get("type") == "text"]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message["role"] == "user":
            text = _text_of(message["content"])
            if text:
                return text
    return ""


def answer_blocks(body: Mapping[str, Any], serial: int) -> tuple[list[dict[str, Any]], str]:
    """The content blocks of the fake's answer and its stop reason."""
    messages = body["messages"]
    text = _last_user_text(messages)
    blocks: list[dict[str, Any]] = []
    if thinking_enabled(body):
        if REDACT_TRIGGER in text:
            blocks.append({"type": "redacted_thinking", "data": redacted(f"{THINKING_TEXT} {serial}")})
        else:
            thought = f"{THINKING_TEXT} ({serial})"
            blocks.append({"type": "thinking", "thinking": thought, "signature": sign(thought)})
    tools = body.get("tools")
    name = (
        tools[0].get("name") if isinstance(tools, list) and tools and isinstance(tools[0], Mapping) else None
    )
    last = messages[-1]
    if isinstance(name, str) and last["role"] == "user" and TOOL_TRIGGER in _text_of(last["content"]):
        blocks.append({"type": "tool_use", "id": f"toolu_fake_{serial}", "name": name, "input": {}})
        return blocks, "tool_use"
    blocks.append({"type": "text", "text": ECHO_PREFIX + text[:ECHO_CHARS]})
    return blocks, "end_turn"


def spoken(blocks: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for block in blocks:
        parts.append(str(block.get("text") or block.get("thinking") or block.get("name") or ""))
    return " ".join(parts)


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": output_tokens,
    }


def message(
    identity: Identity, blocks: list[dict[str, Any]], stop_reason: str | None, tokens: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": identity.id,
        "type": "message",
        "role": "assistant",
        "model": identity.model,
        "content": blocks,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": tokens,
    }


def _event(name: str, payload: Mapping[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _block_events(index: int, block: Mapping[str, Any]) -> list[bytes]:
    kind = block["type"]
    if kind == "text":
        opening: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in split_text(block["text"])]
    elif kind == "thinking":
        opening = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": piece} for piece in split_text(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "tool_use":
        opening = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}]
    else:  # redacted_thinking arrives whole
        opening, deltas = dict(block), []
    events = [
        _event(
            "content_block_start", {"type": "content_block_start", "index": index, "content_block": opening}
        )
    ]
    events += [
        _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        for delta in deltas
    ]
    events.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def events(
    identity: Identity, blocks: list[dict[str, Any]], stop_reason: str, tokens: dict[str, Any]
) -> list[bytes]:
    """A streamed answer: message_start (input usage), ping, each block, message_delta, message_stop."""
    opening_usage = {**tokens, "output_tokens": 1}
    out = [
        _event(
            "message_start", {"type": "message_start", "message": message(identity, [], None, opening_usage)}
        ),
        _event("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(blocks):
        out += _block_events(index, block)
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": tokens["output_tokens"]},
    }
    out += [_event("message_delta", delta), _event("message_stop", {"type": "message_stop"})]
    return out
