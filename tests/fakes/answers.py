"""Success payloads of the fake upstream, shaped like OpenAI's.

The assistant's answer is deterministic and proves what arrived: "echo: "
followed by the start of the last user message as the upstream received it.
A request with tools whose last user message contains CALL_TOOL gets a tool
call instead, so SDK tool round trips can run against the fake.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

ECHO_PREFIX = "echo: "
ECHO_CHARS = 200
TOOL_TRIGGER = "CALL_TOOL"
SYSTEM_FINGERPRINT = "fp_fake"
DONE = b"data: [DONE]\n\n"
MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1", "o3-mini", "text-embedding-3-small")
MODELS_CREATED = 1_700_000_000
EMBEDDING_DIMENSIONS = 8


@dataclass(frozen=True)
class Identity:
    """What every object and chunk of one answer repeats."""

    id: str
    created: int
    model: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def chat(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        }

    def responses(self) -> dict[str, Any]:
        return {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str = "{}"

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Answer:
    """What the fake assistant says: text, or a single tool call."""

    text: str | None
    tool_call: ToolCall | None = None

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_call else "stop"

    @property
    def spoken(self) -> str:
        """The text whose tokens are billed as completion."""
        if self.tool_call:
            return self.tool_call.name + self.tool_call.arguments
        return self.text or ""


def sse(payload: Mapping[str, Any], event: str | None = None) -> bytes:
    data = b"data: " + orjson.dumps(payload) + b"\n\n"
    return b"event: " + event.encode() + b"\n" + data if event else data


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, Mapping)]
        return "\n".join(part for part in parts if isinstance(part, str))
    return ""


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def echo(user_text: str) -> str:
    return ECHO_PREFIX + user_text[:ECHO_CHARS]


def _first_tool_name(tools: object) -> str | None:
    # Tool definitions are not validated, so read them defensively.
    first = tools[0] if isinstance(tools, list) and tools else None
    function = first.get("function") if isinstance(first, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    return name if isinstance(name, str) else None


def chat_answer(body: Mapping[str, Any], call_id: str) -> Answer:
    messages = body["messages"]
    last = messages[-1]
    tool_name = _first_tool_name(body.get("tools"))
    if tool_name and last.get("role") == "user" and TOOL_TRIGGER in _text_of(last.get("content")):
        return Answer(text=None, tool_call=ToolCall(id=call_id, name=tool_name))
    return Answer(text=echo(last_user_text(messages)))


def _message(answer: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.text,
        "refusal": None,
        "annotations": [],
    }
    if answer.tool_call:
        message["tool_calls"] = [answer.tool_call.wire()]
    return message


def chat_completion(identity: Identity, *, answer: Answer, usage: Usage) -> dict[str, Any]:
    return {
        "id": identity.id,
        "object": "chat.completion",
        "created": identity.created,
        "model": identity.model,
        "choices": [
            {"index": 0, "message": _message(answer), "logprobs": None, "finish_reason": answer.finish_reason}
        ],
        "usage": usage.chat(),
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def split_text(text: str) -> list[str]:
    """Word-sized pieces, as a model streams them ("echo: hi there" -> "echo: ", "hi ", "there")."""
    return re.findall(r"\s*\S+\s*", text) or [text]


def _chunk(identity: Identity, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": identity.id,
        "object": "chat.completion.chunk",
        "created": identity.created,
        "model": identity.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": choices,
        "usage": usage,
    }


def _deltas(answer: Answer) -> list[dict[str, Any]]:
    if answer.tool_call is None:
        opening: dict[str, Any] = {"role": "assistant", "content": "", "refusal": None}
        return [opening] + [{"content": piece} for piece in split_text(answer.text or "")]
    call = answer.tool_call
    announced = {
        "index": 0,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [announced], "refusal": None},
        {"tool_calls": [{"index": 0, "function": {"arguments": call.arguments}}]},
    ]


def chat_events(identity: Identity, *, answer: Answer, usage: Usage, include_usage: bool) -> list[bytes]:
    """SSE events of a streamed chat completion: role, pieces, finish, [usage], [DONE]."""
    steps: list[tuple[dict[str, Any], str | None]] = [(delta, None) for delta in _deltas(answer)]
    steps.append(({}, answer.finish_reason))
    payloads = [
        _chunk(identity, [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], None)
        for delta, finish in steps
    ]
    if include_usage:
        payloads.append(_chunk(identity, [], usage.chat()))
    else:
        # OpenAI only sends the "usage" key (null until the last chunk) when usage was asked for.
        for payload in payloads:
            del payload["usage"]
    return [sse(payload) for payload in payloads] + [DONE]


def responses_input_text(items: object) -> str:
    """The last user text of a Responses API `input` (a string or a list of input items)."""
    if isinstance(items, str):
        return items
    if isinstance(items, list):
        return last_user_text([item for item in items if isinstance(item, Mapping)])
    return ""


def response_object(identity: Identity, *, text: str, usage: Usage | None) -> dict[str, Any]:
    """A Responses API object; without usage it is the "in_progress" snapshot that opens a stream."""
    output = []
    if usage is not None:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        message_id = f"msg_{identity.id}"
        output.append(
            {
                "type": "message",
                "id": message_id,
                "status": "completed",
                "role": "assistant",
                "content": content,
            }
        )
    return {
        "id": identity.id,
        "object": "response",
        "created_at": identity.created,
        "status": "completed" if usage else "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": identity.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage.responses() if usage else None,
    }


def response_events(identity: Identity, *, text: str, usage: Usage) -> list[bytes]:
    """SSE events of a streamed Responses API answer (named events, no [DONE])."""
    where = {"item_id": f"msg_{identity.id}", "output_index": 0, "content_index": 0}
    payloads: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_object(identity, text="", usage=None)},
        *({"type": "response.output_text.delta", **where, "delta": piece} for piece in split_text(text)),
        {"type": "response.output_text.done", **where, "text": text},
        {"type": "response.completed", "response": response_object(identity, text=text, usage=usage)},
    ]
    return [sse({**payload, "sequence_number": n}, payload["type"]) for n, payload in enumerate(payloads)]


def _vector(text: str, dimensions: int) -> list[float]:
    # Deterministic and unit-length, like real embeddings, so similarity maths in tests behaves.
    raw: list[float] = []
    counter = 0
    while len(raw) < dimensions:
        digest = hashlib.sha256(f"{counter}:{text}".encode()).digest()
        raw += [byte / 127.5 - 1.0 for byte in digest]
        counter += 1
    raw = raw[:dimensions]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def embedding_inputs(value: object) -> list[str] | None:
    """The texts to embed, or None if `input` is not one of the accepted forms."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, str) for item in value):
            return list(value)
        if all(isinstance(item, int) for item in value):
            return [repr(value)]  # a single pre-tokenized input
        if all(isinstance(item, list) for item in value):
            return [repr(item) for item in value]
    return None


def embeddings(
    *, texts: Sequence[str], model: str, dimensions: int, base64_floats: bool, tokens: int
) -> dict[str, Any]:
    data = []
    for index, text in enumerate(texts):
        vector = _vector(text, dimensions)
        # The openai SDK asks for base64 by default and decodes little-endian float32 itself.
        encoded: object = (
            base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode() if base64_floats else vector
        )
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": MODELS_CREATED, "owned_by": "system"}


def model_list(cards: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """OpenAI's list; ``cards`` adds served models with their servers' own fields
    (vLLM's `max_model_len`, OpenRouter's `context_length`, ...)."""
    served = [model_object(name) for name in MODELS]
    served += [{**model_object(name), **fields} for name, fields in (cards or {}).items()]
    return {"object": "list", "data": served}
