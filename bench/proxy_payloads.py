"""Request bodies for bench/proxy_overhead.py: a small chat and a large agent conversation,
as chat completions, Anthropic Messages or Responses bodies (the same content).

Deterministic (seeded) English-like text, so every run sends the same bytes.
Each request differs from the previous one only in a fixed-width number at the
start of the latest user message: that is how a chat application talks to the
gateway (history repeated, one new message), so the gateway's per-message
count cache hits on the history and tokenizes only the new message, as it
would in production. Sending one identical body over and over would instead
measure a fully cached count; sending all-new bodies would measure a cold one.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

# Run as a script from bench/: the native converters live in the bench package and use tests.fakes.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.native_shapes import to_anthropic, to_responses

MODEL = "gpt-4o"
CLAUDE_MODEL = "claude-sonnet-4-5"
APIS = ("chat", "anthropic", "responses")
PATHS = {"chat": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}
# The last bytes of a complete streamed answer, per API.
STREAM_ENDS = {
    "chat": b"data: [DONE]\n\n",
    "anthropic": b'data: {"type":"message_stop"}\n\n',
    "responses": b"\n\n",
}
NONCE_WIDTH = 8
_SLOT = "@@NONCE@@"

# Common English words plus some of the trade: BPE splits them like ordinary prose.
_VOCABULARY = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have "
    "an they you were her she there been one all we their has would when if so no will more can out up "
    "about into than them only could new time some these two may first then do any like my now over such "
    "our man me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still own "
    "see men work long get here between both life being under never day same another know while last "
    "might us great old year off come since against go came right used take three request server cache "
    "token window budget message stream client upstream latency deploy config error retry queue worker "
    "thread process memory socket buffer header payload schema model prompt answer context summary"
)
_WORDS = tuple(_VOCABULARY.split())


def _text(rng: random.Random, words: int) -> str:
    """Sentences of 6–18 common words: tokenizes at about 1.2 tokens per word, like English prose."""
    out: list[str] = []
    while len(out) < words:
        sentence = rng.choices(_WORDS, k=rng.randint(6, 18))
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += rng.choice((".", ".", ".", "?", ","))
        out.extend(sentence)
    return " ".join(out[:words])


def _log(rng: random.Random, lines: int) -> str:
    """A tool result that looks like test or build output."""
    return "\n".join(
        f"2025-06-{1 + i % 28:02d}T12:{i % 60:02d}:{(i * 7) % 60:02d}Z "
        f"{rng.choice(('INFO', 'INFO', 'DEBUG', 'WARN'))} worker-{rng.randint(1, 16)} "
        f"{_text(rng, rng.randint(5, 12))}"
        for i in range(lines)
    )


def small_messages(rng: random.Random) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are a concise assistant. " + _text(rng, 40)},
        {"role": "user", "content": _SLOT + " " + _text(rng, 125)},
    ]


TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "file or test path"}},
                "required": ["path"],
            },
        },
    }
    for name, description in (("read_file", "Read a file of the repository."), ("run_tests", "Run tests."))
]


def agent_tools(count: int) -> list[dict[str, Any]]:
    """`count` more definitions of about 1 KB each, as coding agents send a dozen or more."""
    rng = random.Random("agent-tools")
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{number}",
                "description": _text(rng, 60),
                "parameters": {
                    "type": "object",
                    "properties": {
                        name: {"type": kind, "description": _text(rng, 15)}
                        for name, kind in (("path", "string"), ("line", "integer"), ("pattern", "string"))
                    },
                    "required": ["path"],
                },
            },
        }
        for number in range(count)
    ]


def large_messages(rng: random.Random) -> list[dict[str, Any]]:
    """An agent session: system prompt, five turns with a tool call each, then the new question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(rng, 400)}]
    for turn in range(5):
        call_id = f"call_{turn:04d}"
        name = "read_file" if turn % 2 == 0 else "run_tests"
        messages += [
            {"role": "user", "content": _text(rng, 250)},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": f'{{"path":"src/m{turn}.py"}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": _log(rng, 175)},
            {"role": "assistant", "content": _text(rng, 820)},
        ]
    messages.append({"role": "user", "content": _SLOT + " " + _text(rng, 200)})
    return messages


@dataclass(frozen=True)
class Payload:
    """One request body with a slot for the nonce; every body() has the same length."""

    size: str
    stream: bool
    head: bytes
    tail: bytes
    api: str = "chat"

    @property
    def path(self) -> str:
        return PATHS[self.api]

    @property
    def stream_end(self) -> bytes:
        return STREAM_ENDS[self.api]

    @property
    def headers(self) -> dict[str, str]:
        """What an SDK of this API sends with the body."""
        if self.api == "anthropic":
            return {
                "content-type": "application/json",
                "x-api-key": "sk-bench",
                "anthropic-version": "2023-06-01",
            }
        return {"content-type": "application/json", "authorization": "Bearer sk-bench"}

    def body(self, nonce: int) -> bytes:
        return self.head + str(nonce % 10**NONCE_WIDTH).zfill(NONCE_WIDTH).encode() + self.tail

    @property
    def length(self) -> int:
        return len(self.head) + NONCE_WIDTH + len(self.tail)


def build(size: str, stream: bool, api: str = "chat", extra_tools: int = 0) -> Payload:
    # The same seed whatever `stream` is: the two differ only in their stream fields.
    rng = random.Random(f"proxy-overhead-{size}")
    messages = small_messages(rng) if size == "small" else large_messages(rng)
    tools = (TOOLS if size == "large" else []) + agent_tools(extra_tools)
    body: dict[str, Any]
    if api == "anthropic":
        body = to_anthropic(messages, CLAUDE_MODEL)
        if tools:
            body["tools"] = [
                {
                    "name": t["function"]["name"],
                    "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"],
                }
                for t in tools
            ]
    elif api == "responses":
        body = to_responses(messages, MODEL)
        if tools:
            body["tools"] = [{"type": "function", **t["function"]} for t in tools]
    else:
        body = {"model": MODEL, "messages": messages}
        if tools:
            body["tools"] = tools
    if stream:
        body["stream"] = True
        if api == "chat":
            # Usage in the stream, as SDK users ask for it: the gateway reads it back.
            body["stream_options"] = {"include_usage": True}
    head, tail = orjson.dumps(body).split(_SLOT.encode())
    return Payload(size, stream, head, tail, api)
