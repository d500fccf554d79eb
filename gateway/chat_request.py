"""Reading and validating a chat-completions request before anything else looks at it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from starlette.requests import Request

from gateway.errors import GatewayError

VALID_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
CompressionMode = Literal["off", "auto", "aggressive"]
COMPRESSION_HEADER = "x-gateway-compression"


@dataclass(frozen=True)
class ChatRequest:
    raw: bytes
    payload: dict[str, Any]
    model: str
    stream: bool
    mode: CompressionMode

    @property
    def messages(self) -> list[Any]:
        messages: list[Any] = self.payload["messages"]
        return messages


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing with 413 as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def body_too_large(limit: int) -> GatewayError:
    return GatewayError(
        413, f"Request body is larger than the gateway's limit of {limit} bytes.", code="request_too_large"
    )


def parse_chat_request(raw: bytes, headers: Mapping[str, str]) -> ChatRequest:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(payload, dict):
        raise GatewayError(400, "The request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, "you must provide a model parameter", param="model")
    messages = payload.get("messages")
    if not isinstance(messages, list):
        raise GatewayError(
            400,
            "'messages' is a required property and must be an array of messages."
            if messages is None
            else f"Invalid type for 'messages': expected an array, but got {_json_type(messages)} instead.",
            param="messages",
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise GatewayError(
                400,
                f"Invalid type for 'messages[{index}]': expected an object, but got "
                f"{_json_type(message)} instead.",
                param=f"messages[{index}]",
            )
        role = message.get("role")
        if role not in VALID_ROLES:
            raise GatewayError(
                400,
                f"Invalid value for 'messages[{index}].role': {role!r}. Supported values are: "
                + ", ".join(f"'{r}'" for r in sorted(VALID_ROLES))
                + ".",
                param=f"messages[{index}].role",
            )
    return ChatRequest(
        raw=raw,
        payload=payload,
        model=model,
        stream=payload.get("stream") is True,
        mode=compression_mode(headers),
    )


def compression_mode(headers: Mapping[str, str]) -> CompressionMode:
    value = headers.get(COMPRESSION_HEADER, "auto").strip().lower()
    if value == "off":
        return "off"
    if value == "auto":
        return "auto"
    if value == "aggressive":
        return "aggressive"
    raise GatewayError(
        400,
        f"Invalid {COMPRESSION_HEADER} header {value[:40]!r}: use off, auto or aggressive.",
        param=COMPRESSION_HEADER,
    )


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
