"""Counting accuracy for OpenAI models, against references computed here.

Each case states its expected count as an explicit sum of tiktoken counts and
the documented constants (cookbook "How to count tokens with tiktoken": 3 per
message, 1 per name, 3 reply priming; tool definitions by
num_tokens_for_tools), written independently of gateway/tokens/formats.py.
The cookbook's own API-verified totals anchor the rules to real billing.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Callable
from typing import Any

import pytest
import tiktoken

import gateway  # noqa: F401  (offline tiktoken cache)
from gateway.tokens import counter_for
from gateway.tokens.cache import CountCache
from gateway.tokens.calibration import Calibration
from gateway.tokens.counter import TokenCounter
from gateway.wire.anthropic import ANTHROPIC
from gateway.wire.responses import RESPONSES
from tests.fakes.images import png_data_url

Count = Callable[[str], int]
Case = tuple[str, dict[str, Any], Callable[[Count], int]]


def gif_base64(width: int, height: int) -> str:
    return base64.b64encode(b"GIF89a" + struct.pack("<HH", width, height) + b"\0" * 20).decode()


def wav_base64(seconds: float, rate: int = 16_000) -> str:
    data = b"\0" * int(seconds * rate * 2)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return base64.b64encode(b"RIFF" + struct.pack("<I", len(body)) + body).decode()


PDF_TWO_PAGES = base64.b64encode(
    b"%PDF-1.4\n1 0 obj <</Type /Catalog /Pages 2 0 R>> endobj\n"
    b"2 0 obj <</Type /Pages /Kids [3 0 R 4 0 R] /Count 2>> endobj\n"
    b"3 0 obj <</Type /Page /Parent 2 0 R>> endobj\n4 0 obj <</Type/Page /Parent 2 0 R>> endobj\n%%EOF"
).decode()


def tile_tokens(width: float, height: float, base: int = 85, tile: int = 170) -> int:
    """OpenAI vision guide, high detail: fit 2048², shortest side 768, 512px tiles."""
    if max(width, height) > 2048:
        width, height = (round(side * 2048 / max(width, height)) for side in (width, height))
    if min(width, height) > 768:
        width, height = (round(side * 768 / min(width, height)) for side in (width, height))
    return base + tile * math.ceil(width / 512) * math.ceil(height / 512)


PDF_PAGE = 1445 + 1000  # unknown-size image figure + text allowance, per page
TOOL_CALL = 3  # framing per tool call / tool_use / tool_result (our convention)


def compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


CASES: list[Case] = [
    (
        "system string",
        {"role": "system", "content": "You are terse."},
        lambda n: 3 + n("system") + n("You are terse."),
    ),
    (
        "developer",
        {"role": "developer", "content": "Be exact."},
        lambda n: 3 + n("developer") + n("Be exact."),
    ),
    (
        "user with name",
        {"role": "user", "name": "alice", "content": "hi there"},
        lambda n: 3 + n("user") + 1 + n("alice") + n("hi there"),
    ),
    ("empty content", {"role": "user", "content": ""}, lambda n: 3 + n("user")),
    (
        "special tokens are text",
        {"role": "user", "content": "<|endoftext|> and <|im_start|>"},
        lambda n: 3 + n("user") + n("<|endoftext|> and <|im_start|>"),
    ),
    (
        "text parts",
        {
            "role": "user",
            "content": [{"type": "text", "text": "first part"}, {"type": "text", "text": "second"}],
        },
        lambda n: 3 + n("user") + n("first part") + n("second"),
    ),
    (
        "image data url high",
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": png_data_url(1024, 1024), "detail": "high"}},
            ],
        },
        lambda n: 3 + n("user") + n("what is this?") + 765,
    ),
    (
        "image data url auto, wide",
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_data_url(3000, 1000)}}]},
        lambda n: 3 + n("user") + tile_tokens(3000, 1000),
    ),
    (
        "image remote low",
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}],
        },
        lambda n: 3 + n("user") + 85,
    ),
    (
        "image remote unknown size",
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
        lambda n: 3 + n("user") + 85 + 8 * 170,
    ),
    (
        "input audio wav",
        {
            "role": "user",
            "content": [{"type": "input_audio", "input_audio": {"data": wav_base64(2.0), "format": "wav"}}],
        },
        lambda n: 3 + n("user") + 20,
    ),
    (
        "file pdf data",
        {
            "role": "user",
            "content": [
                {
                    "type": "file",
                    "file": {
                        "filename": "report.pdf",
                        "file_data": "data:application/pdf;base64," + PDF_TWO_PAGES,
                    },
                }
            ],
        },
        lambda n: 3 + n("user") + n("report.pdf") + 2 * PDF_PAGE,
    ),
    (
        "file by id",
        {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-abc"}}]},
        lambda n: 3 + n("user") + PDF_PAGE,
    ),
    (
        "assistant tool calls",
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        lambda n: (
            3
            + n("assistant")
            + (TOOL_CALL + n("call_1") + n("function") + n("get_weather") + n('{"city": "Paris"}'))
            + (TOOL_CALL + n("call_2") + n("function") + n("get_time") + n("{}"))
        ),
    ),
    (
        "tool result",
        {"role": "tool", "tool_call_id": "call_1", "content": "18°C, cloudy"},
        lambda n: 3 + n("tool") + n("call_1") + n("18°C, cloudy"),
    ),
    (
        "legacy function call",
        {"role": "assistant", "content": None, "function_call": {"name": "lookup", "arguments": '{"q":1}'}},
        lambda n: 3 + n("assistant") + TOOL_CALL + n("lookup") + n('{"q":1}'),
    ),
    (
        "legacy function result",
        {"role": "function", "name": "lookup", "content": "42"},
        lambda n: 3 + n("function") + 1 + n("lookup") + n("42"),
    ),
    (
        "reasoning content",
        {"role": "assistant", "content": "Paris.", "reasoning_content": "The user asks for a capital."},
        lambda n: 3 + n("assistant") + n("Paris.") + n("The user asks for a capital."),
    ),
    (
        "refusal part",
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]},
        lambda n: 3 + n("assistant") + n("I can't help with that."),
    ),
    (
        "flags are not text",
        {"role": "assistant", "content": "def f():", "prefix": True},
        lambda n: 3 + n("assistant") + n("def f():"),
    ),
    (
        "anthropic text and tool_use",
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Need the weather.", "signature": "c2ln"},
                {"type": "text", "text": "Let me check.", "cache_control": {"type": "ephemeral"}},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris", "days": 3},
                },
            ],
        },
        lambda n: (
            3
            + n("assistant")
            + n("Need the weather.")
            + n("Let me check.")
            + TOOL_CALL
            + n("toolu_1")
            + n("get_weather")
            + n(compact({"city": "Paris", "days": 3}))
        ),
    ),
    (
        "anthropic tool_result string",
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        lambda n: 3 + n("user") + TOOL_CALL + n("toolu_1") + n("sunny"),
    ),
    (
        "anthropic tool_result list with image",
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [
                        {"type": "text", "text": "chart attached"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/gif",
                                "data": gif_base64(512, 512),
                            },
                        },
                    ],
                }
            ],
        },
        lambda n: 3 + n("user") + TOOL_CALL + n("toolu_2") + n("chart attached") + tile_tokens(512, 512),
    ),
    (
        "anthropic image url",
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.jpg"}}]},
        lambda n: 3 + n("user") + 1445,
    ),
    (
        "anthropic document text",
        {
            "role": "user",
            "content": [
                {"type": "document", "title": "Notes", "source": {"type": "text", "data": "alpha beta"}}
            ],
        },
        lambda n: 3 + n("user") + n("Notes") + n("alpha beta"),
    ),
    (
        "unknown part type counted as json",
        {"role": "user", "content": [{"type": "mystery", "payload": {"k": "v"}}]},
        lambda n: 3 + n("user") + n(compact({"type": "mystery", "payload": {"k": "v"}})),
    ),
]

MODELS = [("gpt-4o", "o200k_base"), ("openai/gpt-4.1", "o200k_base"), ("gpt-4", "cl100k_base")]


def text_counter(encoding_name: str) -> Count:
    encoding = tiktoken.get_encoding(encoding_name)
    return lambda text: len(encoding.encode(text, disallowed_special=()))


@pytest.fixture
def fresh() -> Callable[[str], TokenCounter]:
    return lambda model: TokenCounter(model, calibration=Calibration(), cache=CountCache())


@pytest.mark.parametrize(("model", "encoding_name"), MODELS)
@pytest.mark.parametrize(("label", "message", "expected"), CASES, ids=[case[0] for case in CASES])
def test_each_message_shape_matches_reference(
    fresh: Callable[[str], TokenCounter],
    model: str,
    encoding_name: str,
    label: str,
    message: dict[str, Any],
    expected: Callable[[Count], int],
) -> None:
    assert fresh(model).message(message) == expected(text_counter(encoding_name))


@pytest.mark.parametrize(("model", "encoding_name"), MODELS)
def test_whole_corpus_is_sum_plus_priming(
    fresh: Callable[[str], TokenCounter], model: str, encoding_name: str
) -> None:
    n = text_counter(encoding_name)
    counter = fresh(model)
    messages = [message for _, message, _ in CASES]
    expected = sum(reference(n) for _, _, reference in CASES) + 3
    assert counter.messages(messages) == expected
    assert counter.request({"model": model, "messages": messages}) == expected
    # Warm (cached) counts are identical.
    assert counter.messages(messages) == expected


def test_exact_for_openai_models() -> None:
    assert counter_for("gpt-4o").exact
    assert counter_for("azure/gpt-4o-mini").exact
    assert counter_for("openrouter/openai/o3-mini").exact
    assert not counter_for("claude-sonnet-4-5").exact
    assert not counter_for("llama-3.1-70b").exact


# --- anchors: totals the OpenAI API reported in the cookbook -----------------

COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": (
            "You are a helpful, pattern-following assistant "
            "that translates corporate jargon into plain English."
        ),
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": (
            "Let's circle back when we have more bandwidth "
            "to touch base on opportunities for increased leverage."
        ),
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {
                    "type": "string",
                    "description": "The unit of temperature to return",
                    "enum": ["celsius", "fahrenheit"],
                },
            },
            "required": ["location"],
        },
    },
}
WEATHER_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful assistant that can answer to questions about the weather.",
    },
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


@pytest.mark.parametrize(("model", "api_count"), [("gpt-4o", 124), ("gpt-4o-mini", 124), ("gpt-4", 129)])
def test_cookbook_messages_match_api_usage(model: str, api_count: int) -> None:
    assert counter_for(model).messages(COOKBOOK_MESSAGES) == api_count


@pytest.mark.parametrize(
    ("model", "api_count"), [("gpt-4o", 101), ("gpt-4o-mini", 101), ("gpt-3.5-turbo", 105)]
)
def test_cookbook_tools_match_api_usage(model: str, api_count: int) -> None:
    body = {"model": model, "messages": WEATHER_MESSAGES, "tools": [WEATHER_TOOL]}
    assert counter_for(model).request(body) == api_count


# --- tool definitions and response_format -----------------------------------


def cookbook_function_tokens(function: dict[str, Any], n: Count, func_init: int) -> int:
    """num_tokens_for_tools' per-function arithmetic (flat properties only)."""
    total = func_init + n(f"{function['name']}:{function.get('description', '').removesuffix('.')}")
    properties = function.get("parameters", {}).get("properties", {})
    if properties:
        total += 3
        for key, schema in properties.items():
            total += 3
            if "enum" in schema:
                total += -3 + sum(3 + n(item) for item in schema["enum"])
            total += n(f"{key}:{schema.get('type', '')}:{schema.get('description', '').removesuffix('.')}")
    return total


NESTED_FUNCTION = {
    "name": "create_event",
    "description": "Create a calendar event.",
    "parameters": {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "attendees": {"type": "array", "description": "Emails.", "items": {"type": "string"}},
            "priority": {"type": "integer", "enum": [1, 2, 3]},
        },
        "required": ["title"],
        "additionalProperties": False,
        "$defs": {"when": {"type": "string", "format": "date-time"}},
    },
}


@pytest.mark.parametrize(
    ("model", "encoding_name", "func_init"), [("gpt-4o", "o200k_base", 7), ("gpt-4", "cl100k_base", 10)]
)
def test_tools_and_functions(model: str, encoding_name: str, func_init: int) -> None:
    n = text_counter(encoding_name)
    counter = counter_for(model)
    weather = cookbook_function_tokens(WEATHER_TOOL["function"], n, func_init)
    assert counter.tools([WEATHER_TOOL]) == weather + 12
    # Legacy `functions` use the same rendering; the closing 12 is paid once.
    assert counter.tools([WEATHER_TOOL], [WEATHER_TOOL["function"]]) == 2 * weather + 12
    assert counter.tools(None) == 0
    assert counter.tools([], []) == 0

    nested = (
        func_init
        + n("create_event:Create a calendar event")
        + 3
        + (3 + n("title:string:"))
        + (3 + n("attendees:array:Emails") + n(compact({"items": {"type": "string"}})))
        + (3 - 3 + 3 * (1 + 1) + n("priority:integer:"))  # unquoted enum items: 1 framing + the digit
        + n(compact({"$defs": {"when": {"type": "string", "format": "date-time"}}}))
    )
    assert counter.tools(None, [NESTED_FUNCTION]) == nested + 12

    custom = {"type": "custom", "custom": {"name": "grep", "description": "Search files"}}
    assert counter.tools([custom]) == func_init + n(compact(custom)) + 12


def test_request_adds_tools_and_response_schema() -> None:
    n = text_counter("o200k_base")
    schema = {
        "name": "answer",
        "strict": True,
        "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
    counter = counter_for("gpt-4o")
    messages = [{"role": "user", "content": "Capital of France?"}]
    body = {
        "model": "gpt-4o",
        "messages": messages,
        "tools": [WEATHER_TOOL],
        "response_format": {"type": "json_schema", "json_schema": schema},
        "max_tokens": 100,
    }
    expected = counter.messages(messages) + counter.tools([WEATHER_TOOL]) + n(compact(schema))
    assert counter.request(body) == expected
    assert counter.request({**body, "response_format": {"type": "json_object"}}) == expected - n(
        compact(schema)
    )


def test_a_repeated_schema_is_counted_from_the_cache_and_a_changed_one_anew() -> None:
    counter = TokenCounter("gpt-4o", cache=CountCache())
    schema = {"name": "answer", "schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "response_format": {"type": "json_schema", "json_schema": schema},
    }
    first = counter.request(body)
    assert counter.request(body) == first
    # Same length, other content: not confused with the cached one.
    other = {**schema, "schema": {"type": "object", "properties": {"town": {"type": "string"}}}}
    changed = {**body, "response_format": {"type": "json_schema", "json_schema": other}}
    assert counter.request(changed) == TokenCounter("gpt-4o", cache=CountCache()).request(changed)
    # The same keys in another order are other JSON text, so other tokens: not the cached count.
    properties = {"zeta_ok": {"type": "string"}, "a": {"type": "integer", "description": "x1 2b"}, "1": {}}
    for order in (list(properties), list(reversed(properties))):
        ordered = {key: properties[key] for key in order}
        reordered = {"name": "s", "schema": {"type": "object", "properties": ordered}}
        swapped = {**body, "response_format": {"type": "json_schema", "json_schema": reordered}}
        assert counter.request(swapped) == TokenCounter("gpt-4o", cache=CountCache()).request(swapped)
    longer = {**schema, "description": "The capital city, as its people spell it."}
    assert (
        counter.request({**body, "response_format": {"type": "json_schema", "json_schema": longer}}) > first
    )


def test_native_structured_output_schemas_count_as_a_response_format_does() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    question = [{"role": "user", "content": "Capital of France?"}]
    gpt = counter_for("gpt-4o")
    chat = {
        "messages": question,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }
    responses = {
        "model": "gpt-4o",
        "input": question,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}},
    }
    assert gpt.request(RESPONSES.view(responses).counted) == gpt.request(chat)
    plain = {"model": "gpt-4o", "input": question, "text": {"format": {"type": "text"}}}
    assert gpt.request(RESPONSES.view(plain).counted) < gpt.request(chat)

    claude = counter_for("claude-sonnet-4-5")
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": question}
    structured = {**body, "output_config": {"format": {"type": "json_schema", "schema": schema}}}
    with_schema = claude.request(ANTHROPIC.view(structured).counted)
    assert with_schema > claude.request(ANTHROPIC.view(body).counted)
    assert with_schema == claude.request(
        {
            "messages": question,
            "max_tokens": 64,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
        }
    )


def test_malformed_bodies_do_not_raise() -> None:
    counter = counter_for("gpt-4o")
    assert counter.request({}) == 0
    assert counter.request({"messages": "nope", "tools": "nope"}) == 0
    assert counter.request({"messages": [42, None, {"content": {"type": "text", "text": "x"}}]}) > 3
    odd: dict[str, Any] = {"role": "user", "content": [None, 7, {"type": "image_url"}, {"type": "file"}]}
    assert counter.message(odd) > 0
    # Lone surrogates: not JSON-serializable by orjson, still counted (uncached).
    assert counter.message({"role": "user", "content": "\ud800 broken"}) > 3
