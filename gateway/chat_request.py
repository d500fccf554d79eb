"""Reading and validating a prompt request (chat completions, Anthropic Messages, Responses)
before anything else looks at it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import orjson
from starlette.datastructures import Headers
from starlette.requests import Request

from gateway.errors import GatewayError
from gateway.json_bytes import dumps_kept
from gateway.wire.base import CHAT, ChatView, WireFormat
from gateway.wire.chat import validate_chat_body
from gateway.wire.incremental import IncrementalParser, Validator

CompressionMode = Literal["off", "auto", "aggressive"]
COMPRESSION_HEADER = "x-gateway-compression"


@dataclass(frozen=True)
class ChatRequest:
    raw: bytes
    payload: dict[str, Any]
    model: str
    stream: bool
    mode: CompressionMode
    wire: WireFormat = field(default=CHAT)
    # Each prompt entry's compact JSON, when the parse wrote it (`wire/incremental.py`).
    encoded: tuple[bytes, ...] | None = field(default=None, compare=False)

    @cached_property
    def view(self) -> ChatView:
        """The prompt as compress/ and the counter see it (chat-shaped, whatever the wire format)."""
        return self.wire.view(self.payload)

    @cached_property
    def view_encoded(self) -> tuple[bytes, ...] | None:
        """Each of the view's messages as compact JSON, for the count's comparison: the parse's,
        where the view holds the very entries parsed (chat completions; Messages, after the
        system prompt it puts first), or the view's own (Responses: `wire/responses_memory.py`)."""
        if self.view.encoded is not None:
            return self.view.encoded
        encoded, entries = self.encoded, self.payload.get(self.wire.prompt_field)
        if encoded is None or not isinstance(entries, list) or len(entries) != len(encoded):
            return None
        messages = self.view.messages
        added = len(messages) - len(entries)
        if added < 0:
            return None
        # Compared from the newest: a view of new messages fails at once.
        newest_first = zip(reversed(messages), reversed(entries), strict=False)  # the view may have more
        if any(ours is not theirs for ours, theirs in newest_first):
            return None
        try:
            return tuple(dumps_kept(message) for message in messages[:added]) + encoded
        except TypeError:
            return None


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


# One per wire format: a head validated as one format's messages is not another's.
PARSERS: dict[str, IncrementalParser] = {}


def parse_chat_request(
    raw: bytes,
    headers: Headers,
    *,
    validate: Validator = validate_chat_body,
    wire: WireFormat = CHAT,
) -> ChatRequest:
    """Parse and validate a body of `wire`'s format (chat completions unless told otherwise),
    reusing the parsed head of its conversation's previous body (`wire/incremental.py`)."""
    check_codings(headers)
    parser = PARSERS.get(wire.name)
    if parser is None:
        parser = PARSERS[wire.name] = IncrementalParser(wire.prompt_field)
    try:
        parsed = parser.parse(raw, validate)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, f"The request body is not valid JSON: {exc}.") from None
    payload = parsed.payload
    # Only a Responses body that uses a stored prompt may name no model (the prompt names it): with
    # no model there is no window to fit to, nothing to learn from it, and nothing is compressed.
    model = payload.get("model") or ""
    return ChatRequest(
        raw=raw,
        payload=payload,
        model=model,
        stream=payload.get("stream") is True,
        mode=compression_mode(headers) if model else "off",
        wire=wire,
        encoded=parsed.encoded,
    )


def check_codings(headers: Headers) -> None:
    """The gateway reads, counts and may rewrite a prompt body: it must arrive as plain bytes. A
    compressed one would read as invalid JSON, and a body labelled compressed but sent plain
    would go upstream, rewritten, under a label that no longer holds. Every line of each header
    counts: an `identity` line before a `gzip` one once hid it."""
    codings = _header_tokens(headers, "content-encoding")
    if unread := [coding for coding in codings if coding not in ("", "identity")]:
        raise GatewayError(
            415,
            f"Content-Encoding {unread[0][:40]!r} is not supported on this route: "
            "send the body uncompressed.",
            param="content-encoding",
        )
    if any(part not in ("", "chunked", "identity") for part in _header_tokens(headers, "transfer-encoding")):
        raise GatewayError(501, "Only the chunked Transfer-Encoding is supported.", param="transfer-encoding")


def _header_tokens(headers: Headers, name: str) -> list[str]:
    return [part.strip().lower() for line in headers.getlist(name) for part in line.split(",")]


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
