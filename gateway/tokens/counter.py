"""Count chat-completions prompts the way OpenAI bills them.

Minimal first version: string content and text parts only. Extended by the
token-accounting work (images, tools, Anthropic blocks, calibration, cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import tiktoken

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3


class TokenCounter:
    def __init__(self, model: str, encoding: tiktoken.Encoding) -> None:
        self.model = model
        self.encoding = encoding

    def text(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))

    def message(self, message: Mapping[str, Any]) -> int:
        total = TOKENS_PER_MESSAGE + self.text(str(message.get("role", "")))
        content = message.get("content")
        if isinstance(content, str):
            total += self.text(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    total += self.text(part["text"])
        if isinstance(message.get("name"), str):
            total += TOKENS_PER_NAME + self.text(message["name"])
        return total

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(self.message(m) for m in messages) + REPLY_PRIMING


@lru_cache(maxsize=256)
def counter_for(model: str) -> TokenCounter:
    return TokenCounter(model, tiktoken.get_encoding("o200k_base"))
