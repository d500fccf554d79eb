"""What a team's policy changes in a chat-completions request before it is planned."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.chat_request import COMPRESSION_HEADER, ChatRequest, compression_mode
from gateway.policy.enforcer import Team
from gateway.policy.streams import ask_for_usage

# Choices (``n``) counted in an output allowance at most; the upstream validates the real bound.
MAX_CHOICES = 128


def team_chat(
    team: Team, chat: ChatRequest, headers: Mapping[str, str], *, ask_usage: bool = True
) -> tuple[ChatRequest, bool]:
    """The request under the team's compression mode, asking a stream for its usage.

    Returns it and whether the gateway added ``include_usage`` (so the extra chunk must be
    taken out of what the client receives). ``ask_usage`` False: the API streams its usage
    unasked (Anthropic Messages, Responses).
    """
    asked = compression_mode(headers) if COMPRESSION_HEADER in headers else None
    chat = dataclasses.replace(chat, mode=team.compression_mode(asked))
    if not chat.stream or not ask_usage:
        return chat, False
    payload = ask_for_usage(chat.payload)
    if payload is None:
        return chat, False
    return dataclasses.replace(chat, payload=payload, raw=orjson.dumps(payload)), True


def output_allowance(payload: Mapping[str, Any], default: int) -> int:
    """Output tokens to reserve: max_completion_tokens, else max_tokens, else ``default``; times n."""
    asked = default
    for name in ("max_completion_tokens", "max_tokens"):
        value = payload.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            asked = value
            break
    n = payload.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_CHOICES else 1
    return asked * choices
