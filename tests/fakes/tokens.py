"""The fake upstream's own prompt-token count.

Written independently of `gateway.tokens` on purpose: the fake is the second
opinion that catches a wrong count in the gateway, so it must not share code
with it. Rules are OpenAI's documented ones for o200k_base models: 3 tokens
per message, 1 more per `name`, 3 to prime the reply; string content and text
parts; tool-call names and arguments; tool definitions approximated by
tokenizing their JSON. Anthropic-style blocks count their text, tool input
and tool results. Images are not counted (the fake is lenient there).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import orjson
import tiktoken

# Importing gateway points TIKTOKEN_CACHE_DIR at the local encodings; tiktoken
# reads it when an encoding is first loaded, so the fake never downloads one.
import gateway  # noqa: F401

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
# Bytes per token when the fake only estimates (the cheap path, see `estimate`).
BYTES_PER_TOKEN = 4


@cache
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding("o200k_base")


def warm_up() -> None:
    """Load the encoding now: the first load in a process takes ~0.4 s, too much for a request to absorb."""
    _encoding()


def count_text(text: object) -> int:
    # encode_ordinary: text that looks like a special token ("<|endoftext|>") is
    # counted as plain text, as the API does, instead of raising.
    return len(_encoding().encode_ordinary(text)) if isinstance(text, str) else 0


def _count_content(content: object) -> int:
    if not isinstance(content, list):
        return count_text(content)
    total = 0
    for part in content:
        if not isinstance(part, Mapping):
            continue
        total += count_text(part.get("text"))
        if part.get("type") == "tool_use":
            total += count_text(part.get("name")) + count_text(orjson.dumps(part.get("input")).decode())
        elif part.get("type") == "tool_result":
            total += _count_content(part.get("content"))
    return total


def count_message(message: Mapping[str, Any]) -> int:
    total = TOKENS_PER_MESSAGE + count_text(message.get("role")) + _count_content(message.get("content"))
    if isinstance(message.get("name"), str):
        total += TOKENS_PER_NAME + count_text(message["name"])
    for call in message.get("tool_calls") or []:
        function = call.get("function")
        if isinstance(function, Mapping):
            total += count_text(function.get("name")) + count_text(function.get("arguments"))
    return total


def count_prompt(body: Mapping[str, Any]) -> int:
    """Prompt tokens of a validated chat-completions body."""
    total = sum(count_message(message) for message in body["messages"]) + REPLY_PRIMING
    if body.get("tools"):
        total += count_text(orjson.dumps(body["tools"]).decode())
    return total


def estimate(data: bytes | str) -> int:
    """A cheap stand-in for a count, used when nothing depends on exactness (keeps the hot path fast)."""
    return max(1, len(data) // BYTES_PER_TOKEN)
