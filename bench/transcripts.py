"""Agent transcripts from files, as loops for bench/quality.py's loop table (`--loops-from`).

The generated loops of bench/conversations.py are one agent's shape; a team's
own transcripts (or public ones) show whether the same holds for theirs. A
file holds one request body of an agent at the end of its loop: a JSON object
with `messages` (chat completions, either wire format's tool blocks), or a
bare message list. Everything after the latest user message is the loop;
each assistant message that calls a tool starts a step.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from bench.conversations import AgentLoop
from gateway.compress.units import is_user_input


class TranscriptError(ValueError):
    """A file that is no agent loop: named, with what is wrong, for the command line."""


def call_ids(message: Mapping[str, Any]) -> list[str]:
    """The ids of an assistant message's tool calls, in either wire format."""
    ids = [call["id"] for call in message.get("tool_calls") or ()]
    content = message.get("content")
    if isinstance(content, list):
        ids += [part["id"] for part in content if part.get("type") == "tool_use"]
    return ids


def loop_from_messages(name: str, messages: list[dict[str, Any]]) -> AgentLoop:
    """The loop of a message list: its steps after the latest user message."""
    users = [i for i, m in enumerate(messages) if is_user_input(m)]
    if not users:
        raise TranscriptError(f"{name}: no user message (the task)")
    task = users[-1]
    starts = [
        i
        for i in range(task + 1, len(messages))
        if messages[i].get("role") == "assistant" and call_ids(messages[i])
    ]
    if not starts:
        raise TranscriptError(f"{name}: no tool call after the latest user message")
    ids = [call for i in starts for call in call_ids(messages[i])]
    content = messages[task].get("content")
    text = content if isinstance(content, str) else orjson.dumps(content).decode()
    return AgentLoop(name, messages, text, starts, ids)


def load(paths: list[Path]) -> Iterator[AgentLoop]:
    """Every `*.json` file of each path (a file, or a directory's files, sorted) as a loop."""
    for path in paths:
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        for file in files:
            try:
                data = orjson.loads(file.read_bytes())
            except (OSError, orjson.JSONDecodeError) as problem:
                raise TranscriptError(f"{file}: {problem}") from problem
            messages = data.get("messages") if isinstance(data, dict) else data
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise TranscriptError(f"{file}: no message list (`messages`, or the file itself)")
            yield loop_from_messages(file.stem, messages)
