"""The fake upstream: strict validation, OpenAI-shaped answers, and what each fault mode does on the wire."""

from __future__ import annotations

import base64
import itertools
import math
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam

from tests.fakes.errors import BAD_JSON, NO_API_KEY, mask_key
from tests.fakes.serve import free_port, serve_in_thread
from tests.fakes.upstream import FakeUpstream, create_app
from tests.fakes.validation import (
    CALL_WITHOUT_TOOL,
    RESULT_WITHOUT_TOOL_USE,
    RESULTS_NOT_FIRST,
    TOOL_USE_WITHOUT_RESULT,
    TOOL_WITHOUT_CALL,
    validate_chat_messages,
)

REPO = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"
TOOLS: list[ChatCompletionFunctionToolParam] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]


# --- message builders -------------------------------------------------------------------------------


def user(text: str | list[Any] = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


def calls(*ids: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}} for i in ids
        ],
    }


def tool(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


def uses(*ids: str) -> dict[str, Any]:
    blocks = [{"type": "tool_use", "id": i, "name": "get_weather", "input": {"city": "Paris"}} for i in ids]
    return {"role": "assistant", "content": [{"type": "text", "text": "checking"}, *blocks]}


def results(*ids: str) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": i, "content": "sunny"} for i in ids],
    }


# --- validation: valid conversations ------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param([user()], id="single-user"),
        pytest.param(
            [{"role": "developer", "content": "be brief"}, user(), {"role": "assistant", "content": "ok"}]
        ),
        pytest.param([user(), calls("call_a"), tool("call_a"), user("thanks")], id="tool-round-trip"),
        pytest.param(
            [user(), calls("call_a", "call_b"), tool("call_b"), tool("call_a")], id="parallel-any-order"
        ),
        pytest.param(
            [user(), calls("call_a"), tool("call_a"), calls("call_b"), tool("call_b")], id="two-rounds"
        ),
        pytest.param([user(), uses("toolu_a"), results("toolu_a")], id="anthropic-round-trip"),
        pytest.param(
            [user(), uses("toolu_a", "toolu_b"), results("toolu_b", "toolu_a")], id="anthropic-parallel"
        ),
        pytest.param([user([{"type": "text", "text": "hi"}])], id="content-parts"),
    ],
)
def test_valid_conversations_pass(messages: list[Any]) -> None:
    assert validate_chat_messages(messages) is None


# --- validation: shape errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (
            "hello",
            ("Invalid type for 'messages': expected an array, but got a string instead.", "messages"),
        ),
        (
            [],
            (
                "Invalid 'messages': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead.",
                "messages",
            ),
        ),
        (
            [user(), 3],
            (
                "Invalid type for 'messages[1]': expected an object, but got an integer instead.",
                "messages[1]",
            ),
        ),
        ([{"content": "x"}], ("Missing required parameter: 'messages[0].role'.", "messages[0].role")),
        (
            [{"role": "bot", "content": "x"}],
            (
                "Invalid value: 'bot'. Supported values are: 'system', 'assistant', 'user', 'function', "
                "'tool', and 'developer'.",
                "messages[0].role",
            ),
        ),
        ([{"role": "user"}], ("Missing required parameter: 'messages[0].content'.", "messages[0].content")),
        (
            [user(), {"role": "assistant", "content": None}],
            ("Invalid value for 'content': expected a string, got null.", "messages.[1].content"),
        ),
        (
            [user(), calls("call_a"), {"role": "tool", "content": "x"}],
            ("Missing required parameter: 'messages[2].tool_call_id'.", "messages[2].tool_call_id"),
        ),
        (
            [user(), {"role": "assistant", "content": "x", "tool_calls": []}],
            (
                "Invalid 'messages[1].tool_calls': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead.",
                "messages[1].tool_calls",
            ),
        ),
        (
            [user(), {"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}],
            ("Missing required parameter: 'messages[1].tool_calls[0].id'.", "messages[1].tool_calls[0].id"),
        ),
    ],
)
def test_shape_errors_use_the_api_wording(messages: object, expected: tuple[str, str]) -> None:
    assert validate_chat_messages(messages) == expected


# --- validation: OpenAI tool pairing ------------------------------------------------------------------


def unanswered(ids: str) -> str:
    return CALL_WITHOUT_TOOL.format(ids=ids)


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        pytest.param(
            [user(), tool("call_a")], (TOOL_WITHOUT_CALL, "messages.[1].role"), id="tool-after-user"
        ),
        pytest.param([tool("call_a"), user()], (TOOL_WITHOUT_CALL, "messages.[0].role"), id="tool-first"),
        pytest.param(
            [user(), calls("call_a"), tool("call_x")], (TOOL_WITHOUT_CALL, "messages.[2].role"), id="wrong-id"
        ),
        pytest.param(
            [user(), calls("call_a"), tool("call_a"), tool("call_a")],
            (TOOL_WITHOUT_CALL, "messages.[3].role"),
            id="answered-twice",
        ),
        pytest.param(
            [user(), calls("call_a"), tool("call_a"), user(), tool("call_a")],
            (TOOL_WITHOUT_CALL, "messages.[4].role"),
            id="tool-after-the-run-ended",
        ),
        pytest.param(
            [user(), calls("call_a"), user("interrupt"), tool("call_a")],
            (unanswered("call_a"), "messages.[1].role"),
            id="user-between-call-and-answer",
        ),
        pytest.param(
            [user(), calls("call_a")], (unanswered("call_a"), "messages.[1].role"), id="calls-as-last-message"
        ),
        pytest.param(
            [user(), calls("call_a", "call_b", "call_c"), tool("call_b"), user()],
            (unanswered("call_a, call_c"), "messages.[1].role"),
            id="parallel-partly-answered",
        ),
        pytest.param(
            [user(), calls("call_a"), tool("call_a"), calls("call_b"), {"role": "assistant", "content": "x"}],
            (unanswered("call_b"), "messages.[3].role"),
            id="second-round-unanswered",
        ),
    ],
)
def test_openai_tool_pairing_errors(messages: list[Any], expected: tuple[str, str]) -> None:
    assert validate_chat_messages(messages) == expected


def test_openai_pairing_error_text_is_the_real_one() -> None:
    message, param = validate_chat_messages([user(), calls("call_x")]) or ("", "")
    assert message == (
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: call_x"
    )
    assert param == "messages.[1].role"


# --- validation: Anthropic block pairing --------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "text"),
    [
        pytest.param(
            [user(), uses("toolu_a")],
            TOOL_USE_WITHOUT_RESULT.format(index=1, ids="toolu_a"),
            id="tool-use-last",
        ),
        pytest.param(
            [user(), uses("toolu_a"), user("no results")],
            TOOL_USE_WITHOUT_RESULT.format(index=1, ids="toolu_a"),
            id="next-message-has-no-result",
        ),
        pytest.param(
            [user(), uses("toolu_a", "toolu_b", "toolu_c"), results("toolu_b")],
            TOOL_USE_WITHOUT_RESULT.format(index=1, ids="toolu_a, toolu_c"),
            id="parallel-partly-answered",
        ),
        pytest.param(
            [results("toolu_a")],
            RESULT_WITHOUT_TOOL_USE.format(index=0, block=0, id="toolu_a"),
            id="result-first",
        ),
        pytest.param(
            [user(), uses("toolu_a"), results("toolu_a", "toolu_x")],
            RESULT_WITHOUT_TOOL_USE.format(index=2, block=1, id="toolu_x"),
            id="unknown-id",
        ),
        pytest.param(
            [user(), uses("toolu_a"), results("toolu_a"), user("more"), results("toolu_a")],
            RESULT_WITHOUT_TOOL_USE.format(index=4, block=0, id="toolu_a"),
            id="result-not-right-after-its-use",
        ),
        pytest.param(
            [
                user(),
                uses("toolu_a"),
                user([{"type": "text", "text": "note"}, *results("toolu_a")["content"]]),
            ],
            RESULTS_NOT_FIRST.format(index=2, count=1),
            id="text-before-the-results",
        ),
    ],
)
def test_anthropic_block_pairing_errors(messages: list[Any], text: str) -> None:
    error = validate_chat_messages(messages)
    assert error is not None
    assert error[0] == text


def test_anthropic_error_texts_are_the_real_ones() -> None:
    missing = validate_chat_messages([user(), uses("toolu_x")])
    assert missing is not None
    assert missing[0] == (
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_x. "
        "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
    )
    orphan = validate_chat_messages([user(), results("toolu_x")])
    assert orphan is not None
    assert orphan[0] == (
        "messages.1.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_x. "
        "Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
    )


def test_mask_key_keeps_first_eight_and_last_four() -> None:
    key = "sk-WRQsP" + "x" * 39 + "xQBt"
    assert mask_key(key) == "sk-WRQsP" + "*" * 39 + "xQBt"
    assert mask_key("sk-short") == "sk-short"


# --- served fake: helpers -----------------------------------------------------------------------------


@pytest.fixture
def http(fake_upstream: FakeUpstream) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake_upstream.base_url.removesuffix("/v1"), timeout=5) as client:
        yield client


@pytest.fixture
def sdk(fake_upstream: FakeUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake_upstream.base_url, api_key="sk-test", max_retries=0) as client:
        yield client


def chat_body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [user(text)], **extra}


def sse_payloads(raw: bytes) -> list[Any]:
    events = raw.split(b"\n\n")
    assert events[-1] == b"", "every event ends with a blank line"
    data = [event.removeprefix(b"data: ") for event in events[:-1]]
    assert data[-1] == b"[DONE]"
    return [orjson.loads(item) for item in data[:-1]]


def wait_until(condition: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


# --- served fake: chat completions --------------------------------------------------------------------


def test_non_stream_answer_echoes_and_counts_like_openai(
    fake_upstream: FakeUpstream, http: httpx.Client
) -> None:
    fake_upstream.window = 1000
    response = http.post(CHAT, json=chat_body("hello"))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["id"] == "chatcmpl-fake-1"
    assert body["object"] == "chat.completion"
    assert body["model"] == "gpt-4o-mini"
    assert body["choices"][0]["message"]["content"] == "echo: hello"
    assert body["choices"][0]["finish_reason"] == "stop"
    # OpenAI bills [{"role": "user", "content": "hello"}] as 8 prompt tokens: 3 + "user" + "hello" + 3.
    assert body["usage"]["prompt_tokens"] == 8
    assert body["usage"]["total_tokens"] == 8 + body["usage"]["completion_tokens"]


def test_echo_is_capped_at_200_characters(http: httpx.Client) -> None:
    text = "x" * 500
    answer = http.post(CHAT, json=chat_body(text)).json()["choices"][0]["message"]["content"]
    assert answer == "echo: " + "x" * 200


def test_openai_response_headers(http: httpx.Client) -> None:
    first = http.post(CHAT, json=chat_body())
    second = http.post(CHAT, json=chat_body())
    assert first.headers["x-request-id"].startswith("req_")
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    assert int(first.headers["openai-processing-ms"]) >= 0
    assert int(first.headers["x-ratelimit-remaining-requests"]) > 0
    assert int(first.headers["x-ratelimit-limit-tokens"]) > 0


def test_received_log_keeps_what_arrived(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    raw = b'{"model": "gpt-4o-mini",   "messages": [{"role": "user", "content": "hi"}]}'
    headers = {"Content-Type": "application/json", "OpenAI-Organization": "org-1", "X-Custom": "kept"}
    http.post(CHAT, content=raw, headers=headers, params={"api-version": "1"})
    http.get("/v1/models")
    first, second = fake_upstream.received
    assert (first.method, first.path, first.query) == ("POST", CHAT, "api-version=1")
    assert first.body == raw
    assert first.json == {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    assert first.headers["openai-organization"] == "org-1"
    assert first.headers["x-custom"] == "kept"
    assert (second.method, second.body, second.json) == ("GET", b"", None)
    assert first.time <= second.time
    assert fake_upstream.hits == {CHAT: 1, "/v1/models": 1}
    assert fake_upstream.requests_to("/v1/models") == [second]


def test_raw_stream_is_framed_like_openai(http: httpx.Client) -> None:
    response = http.post(CHAT, json=chat_body("one two three", stream=True))
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    chunks = sse_payloads(response.content)
    assert all(chunk["object"] == "chat.completion.chunk" and "usage" not in chunk for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    pieces = [chunk["choices"][0]["delta"].get("content") for chunk in chunks[1:-1]]
    assert len(pieces) > 2, "content arrives in several chunks"
    assert "".join(pieces) == "echo: one two three"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks[:-1])


def test_sdk_stream_with_include_usage(fake_upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    fake_upstream.window = 1000
    stream = sdk.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "echo: hello"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])


def test_sdk_non_stream_and_headers(sdk: openai.OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "ping"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "echo: ping"
    assert raw.headers["x-request-id"].startswith("req_")


def test_sdk_tool_round_trip(sdk: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "weather? CALL_TOOL"}]
    first = sdk.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert call.function.name == "get_weather"
    messages += [choice.message.model_dump(exclude_none=True), tool(call.id)]
    second = sdk.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "echo: weather? CALL_TOOL"


def test_sdk_streamed_tool_call(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "CALL_TOOL"}], tools=TOOLS, stream=True
    )
    choices = [chunk.choices[0] for chunk in stream]
    opening = choices[0].delta.tool_calls
    assert opening is not None
    assert opening[0].id is not None and opening[0].id.startswith("call_fake_")
    assert opening[0].function is not None and opening[0].function.name == "get_weather"
    pieces = [call.function for choice in choices for call in choice.delta.tool_calls or [] if call.function]
    assert orjson.loads("".join(piece.arguments or "" for piece in pieces)) == {}
    assert choices[-1].finish_reason == "tool_calls"


def test_no_tool_call_without_tools(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "CALL_TOOL"}]
    )
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].message.content == "echo: CALL_TOOL"


def test_malformed_tool_definitions_degrade_to_an_echo(http: httpx.Client) -> None:
    messages = [user(), calls("call_a"), tool("call_a"), user("CALL_TOOL")]
    body = {"model": "m", "messages": messages, "tools": ["x"]}
    response = http.post(CHAT, json=body)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "echo: CALL_TOOL"
    # A call in the history is held to its shape, as the API does: a function's, or a custom tool's.
    patch = {"id": "call_a", "type": "custom", "custom": {"name": "patch"}}
    for call, param in (
        ({"id": "call_a", "function": "not-an-object"}, "messages[1].tool_calls[0].function"),
        (patch, "messages[1].tool_calls[0].custom.input"),
    ):
        messages[1] = {**calls("call_a"), "tool_calls": [call]}
        refused = http.post(CHAT, json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    messages[1] = {**calls("call_a"), "tool_calls": [{**patch, "custom": {"name": "patch", "input": "+x"}}]}
    assert http.post(CHAT, json=body).status_code == 200


# --- served fake: request errors ----------------------------------------------------------------------


def test_overflow_body_is_openais(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.window = 5
    response = http.post(CHAT, json=chat_body("hello"))
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "This model's maximum context length is 5 tokens. However, your messages resulted in "
            "8 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def test_max_tokens_counts_against_the_window(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.window = 100
    assert http.post(CHAT, json=chat_body("hello", max_tokens=92)).status_code == 200
    over = http.post(CHAT, json=chat_body("hello", max_completion_tokens=93))
    assert over.status_code == 400
    assert over.json()["error"]["message"] == (
        "This model's maximum context length is 100 tokens. However, you requested 101 tokens "
        "(8 in the messages, 93 in the completion). Please reduce the length of the messages or completion."
    )


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        (
            "openai_new",
            {
                "error": {
                    "message": "Your input exceeds the context window of this model. "
                    "Please adjust your input and try again.",
                    "type": "invalid_request_error",
                    "param": "input",
                    "code": "context_length_exceeded",
                }
            },
        ),
        (
            "anthropic",
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 8 tokens > 5 maximum",
                },
            },
        ),
        (
            "vllm",
            {
                "object": "error",
                "message": "This model's maximum context length is 5 tokens. However, you requested 8 tokens "
                "(8 in the messages, 0 in the completion). "
                "Please reduce the length of the messages or completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
        ),
        (
            "llamacpp",
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 8,
                    "n_ctx": 5,
                }
            },
        ),
    ],
)
def test_overflow_styles(fake_upstream: FakeUpstream, http: httpx.Client, style: Any, expected: Any) -> None:
    fake_upstream.window = 5
    fake_upstream.overflow_style = style
    response = http.post(CHAT, json=chat_body("hello"))
    assert response.status_code == 400
    assert response.json() == expected


def test_anthropic_style_names_max_tokens_when_only_the_sum_overflows(
    fake_upstream: FakeUpstream, http: httpx.Client
) -> None:
    fake_upstream.window, fake_upstream.overflow_style = 10, "anthropic"
    message = http.post(CHAT, json=chat_body("hello", max_tokens=5)).json()["error"]["message"]
    assert message == (
        "input length and `max_tokens` exceed context limit: 8 + 5 > 10, "
        "decrease input length or `max_tokens` and try again"
    )


def test_sdk_sees_overflow_as_bad_request(fake_upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    fake_upstream.window = 5
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}])
    assert caught.value.status_code == 400
    assert caught.value.code == "context_length_exceeded"


def test_unpaired_tool_message_is_rejected_over_http(http: httpx.Client) -> None:
    response = http.post(CHAT, json={"model": "gpt-4o-mini", "messages": [user(), tool("call_a")]})
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": TOOL_WITHOUT_CALL,
            "type": "invalid_request_error",
            "param": "messages.[1].role",
            "code": None,
        }
    }


@pytest.mark.parametrize(
    ("content", "message", "param"),
    [
        (b"{not json", BAD_JSON, None),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "you must provide a model parameter", None),
        (b'{"model": "gpt-4o-mini"}', "Missing required parameter: 'messages'.", "messages"),
    ],
)
def test_malformed_requests(http: httpx.Client, content: bytes, message: str, param: str | None) -> None:
    response = http.post(CHAT, content=content, headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }


def test_api_key_checks(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.required_api_key = "sk-right-key-0000"
    missing = http.post(CHAT, json=chat_body())
    assert missing.status_code == 401
    assert missing.json()["error"] == {
        "message": NO_API_KEY,
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    wrong_key = "sk-proj-abcdefghijklmnop1234"
    wrong = http.post(CHAT, json=chat_body(), headers={"authorization": f"Bearer {wrong_key}"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert wrong.json()["error"]["message"] == (
        "Incorrect API key provided: sk-proj-****************1234. "
        "You can find your API key at https://platform.openai.com/account/api-keys."
    )
    right = http.post(CHAT, json=chat_body(), headers={"authorization": "Bearer sk-right-key-0000"})
    assert right.status_code == 200
    assert len(fake_upstream.received) == 3, "refused requests are logged too"


def test_sdk_sees_wrong_key_as_authentication_error(fake_upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    fake_upstream.required_api_key = "sk-other"
    with pytest.raises(openai.AuthenticationError):
        sdk.models.list()


def test_unknown_url_and_wrong_method(http: httpx.Client) -> None:
    nope = http.get("/v1/nope")
    assert nope.status_code == 404
    assert nope.json() == {
        "error": {
            "message": "Invalid URL (GET /v1/nope)",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    assert http.post("/v2/anything").json()["error"]["message"] == "Invalid URL (POST /v2/anything)"
    wrong = http.get(CHAT)
    assert wrong.status_code == 405
    assert wrong.json()["error"]["message"] == "Invalid method for URL (GET /v1/chat/completions)"


# --- served fake: other routes ------------------------------------------------------------------------


def test_models(sdk: openai.OpenAI) -> None:
    names = [model.id for model in sdk.models.list()]
    assert "gpt-4o-mini" in names
    assert sdk.models.retrieve("gpt-4o").id == "gpt-4o"
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.models.retrieve("no-such-model")
    assert caught.value.code == "model_not_found"


def test_embeddings_base64_through_sdk_and_floats_raw(sdk: openai.OpenAI, http: httpx.Client) -> None:
    result = sdk.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"])  # SDK asks base64
    alpha, beta = (item.embedding for item in result.data)
    assert len(alpha) == 8
    assert math.isclose(sum(x * x for x in alpha), 1.0, rel_tol=1e-5)
    assert alpha != beta
    assert result.usage.prompt_tokens > 0
    raw = http.post("/v1/embeddings", json={"model": "m", "input": "alpha", "dimensions": 8}).json()
    assert raw["data"][0]["embedding"] == pytest.approx(alpha, rel=1e-6)
    b64 = http.post(
        "/v1/embeddings", json={"model": "m", "input": "alpha", "encoding_format": "base64"}
    ).json()
    decoded = struct.unpack("<8f", base64.b64decode(b64["data"][0]["embedding"]))
    assert list(decoded) == pytest.approx(alpha, rel=1e-6)
    invalid = http.post("/v1/embeddings", json={"model": "m", "input": {"x": 1}})
    assert invalid.status_code == 400


def test_responses_api(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model="gpt-4o-mini", input="hello there")
    assert response.status == "completed"
    assert response.output_text == "echo: hello there"
    events = list(
        sdk.responses.create(
            model="gpt-4o-mini", input=[{"role": "user", "content": "streamed"}], stream=True
        )
    )
    assert events[0].type == "response.created"
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == "echo: streamed"
    assert events[-1].type == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_file_delete(sdk: openai.OpenAI) -> None:
    deleted = sdk.files.delete("file-abc123")
    assert (deleted.id, deleted.deleted) == ("file-abc123", True)


# --- served fake: faults ------------------------------------------------------------------------------


def test_fault_queue_is_consumed_one_per_chat_request(
    fake_upstream: FakeUpstream, http: httpx.Client
) -> None:
    fake_upstream.faults = ["503", None, "500"]
    assert http.get("/v1/models").status_code == 200, "other routes do not consume the queue"
    statuses = [http.post(CHAT, json=chat_body()).status_code for _ in range(4)]
    assert statuses == [503, 200, 500, 200]
    assert fake_upstream.faults == []


def test_error_status_bodies(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.faults = ["503", "500", "502"]
    overloaded, server_error, bad_gateway = (http.post(CHAT, json=chat_body()) for _ in range(3))
    assert overloaded.json()["error"] == {
        "message": "The server is overloaded or not ready yet.",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert server_error.json()["error"]["type"] == "server_error"
    assert bad_gateway.status_code == 502
    assert bad_gateway.headers["content-type"] == "text/html"
    assert "502 Bad Gateway" in bad_gateway.text


def test_header_fault_wins_and_leaves_the_queue(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.faults = ["500"]
    forced = http.get("/v1/models", headers={"x-fake-fault": "503"})
    assert forced.status_code == 503, "the header works on any route"
    assert http.post(CHAT, json=chat_body(), headers={"x-fake-fault": "429"}).status_code == 429
    assert fake_upstream.faults == ["500"]


def test_rate_limit_fault(fake_upstream: FakeUpstream, http: httpx.Client, sdk: openai.OpenAI) -> None:
    fake_upstream.retry_after = 2.5
    fake_upstream.faults = ["429", "429"]
    response = http.post(CHAT, json=chat_body())
    assert response.status_code == 429
    assert response.headers["retry-after"] == "2.5"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert "gpt-4o-mini" in response.json()["error"]["message"]
    with pytest.raises(openai.RateLimitError):
        sdk.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])


def test_unknown_fault_mode_is_refused(http: httpx.Client) -> None:
    response = http.post(CHAT, json=chat_body(), headers={"x-fake-fault": "explode"})
    assert response.status_code == 400
    assert "explode" in response.json()["error"]["message"]


def test_overflow_fault_ignores_size(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.faults = ["overflow"]
    error = http.post(CHAT, json=chat_body("hello")).json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "maximum context length is 7 tokens" in error["message"], "no window: one token below the prompt"
    assert http.post(CHAT, json=chat_body("hello")).status_code == 200


def test_truncate_fault_accepts_and_caps_usage(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.window = 10
    fake_upstream.truncate_to = 20
    fake_upstream.faults = ["truncate"]
    long_prompt = "word " * 100
    response = http.post(CHAT, json=chat_body(long_prompt))
    assert response.status_code == 200, "Ollama-like: no overflow error"
    assert response.json()["usage"]["prompt_tokens"] == 20
    assert http.post(CHAT, json=chat_body(long_prompt)).status_code == 400


def test_hang_delays_the_answer(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.hang_seconds = 0.3
    fake_upstream.faults = ["hang"]
    started = time.monotonic()
    response = http.post(CHAT, json=chat_body())
    assert response.status_code == 200
    assert time.monotonic() - started >= 0.3


def test_hang_notices_a_client_that_gives_up(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.faults = ["hang"]  # 60 s by default
    with pytest.raises(httpx.ReadTimeout):
        http.post(CHAT, json=chat_body(), timeout=0.2)
    assert wait_until(lambda: fake_upstream.cancelled_requests == 1)


def test_stall_pauses_mid_stream_then_finishes(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.hang_seconds = 0.3
    fake_upstream.faults = ["stall"]
    arrivals: list[tuple[float, bytes]] = []
    with http.stream("POST", CHAT, json=chat_body("a b c d e f", stream=True)) as response:
        for line in response.iter_lines():
            if line:
                arrivals.append((time.monotonic(), line.encode()))
    gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(arrivals)]
    assert max(gaps) >= 0.25
    assert arrivals[-1][1] == b"data: [DONE]"


def test_half_stream_ends_without_done(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.faults = ["half_stream", "half_stream"]
    received = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),
        http.stream("POST", CHAT, json=chat_body("a b c d e f", stream=True)) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_raw():
            received += chunk
    assert received.startswith(b"data: {")
    assert b"[DONE]" not in received
    with pytest.raises(httpx.RemoteProtocolError):
        http.post(CHAT, json=chat_body())
    assert fake_upstream.cancelled_streams == 0, "a drop by the server is not a client cancel"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_reset_sends_part_of_the_body_then_rst(loop: str) -> None:
    fake = FakeUpstream(faults=["reset", "reset"])
    with serve_in_thread(create_app(fake), loop=loop) as url, httpx.Client(base_url=url, timeout=5) as client:
        received = b""
        with (
            pytest.raises(httpx.ReadError, match="reset"),
            client.stream("POST", CHAT, json=chat_body("a b c d e f", stream=True)) as response,
        ):
            assert response.status_code == 200
            for chunk in response.iter_raw():
                received += chunk
        assert received.startswith(b"data: {")
        with pytest.raises(httpx.ReadError, match="reset"):
            client.post(CHAT, json=chat_body())


def test_first_chunk_arrives_before_the_stream_ends(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.chunk_delay = 0.05
    started = time.monotonic()
    with http.stream("POST", CHAT, json=chat_body("a b c d e f", stream=True)) as response:
        lines = response.iter_lines()
        first = next(lines)
        first_at = time.monotonic() - started
        assert first.startswith("data: {")
        assert fake_upstream.active_streams == 1
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    assert time.monotonic() - started - first_at >= 0.05 * len(rest) * 0.8
    assert wait_until(lambda: fake_upstream.active_streams == 0)
    assert fake_upstream.cancelled_streams == 0


def test_client_that_leaves_mid_stream_is_counted(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.chunk_delay = 0.2
    with http.stream("POST", CHAT, json=chat_body("a b c d e f", stream=True)) as response:
        next(response.iter_lines())
    # Closing the response mid-body closes the connection: the fake must notice and stop generating.
    assert wait_until(lambda: fake_upstream.cancelled_streams == 1)
    assert wait_until(lambda: fake_upstream.active_streams == 0)


# --- fake state and serving ---------------------------------------------------------------------------


def test_reset_restores_defaults_but_keeps_the_url(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    url = fake_upstream.base_url
    knobs = {"window": 5, "faults": ["500"], "chunk_delay": 1.0}
    for name, value in knobs.items():
        setattr(fake_upstream, name, value)
    http.post(CHAT, json=chat_body())
    fake_upstream.reset()
    assert {name: getattr(fake_upstream, name) for name in knobs} == {
        "window": None,
        "faults": [],
        "chunk_delay": 0.0,
    }
    assert (fake_upstream.received, fake_upstream.hits, fake_upstream.serial) == ([], {}, 0)
    assert fake_upstream.base_url == url


def test_request_log_can_be_switched_off(fake_upstream: FakeUpstream, http: httpx.Client) -> None:
    fake_upstream.log_requests = False
    assert http.post(CHAT, json=chat_body()).status_code == 200
    assert fake_upstream.received == []
    assert fake_upstream.hits[CHAT] == 1


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_serve_in_thread_stops_and_free_port_is_closed() -> None:
    with serve_in_thread(create_app(FakeUpstream())) as url:
        port = int(url.rsplit(":", 1)[1])
        assert httpx.get(f"{url}/v1/models").status_code == 200
    assert refused(port)
    assert refused(free_port())


def test_runs_alone_from_the_command_line() -> None:
    port = free_port()
    command = [sys.executable, "-m", "tests.fakes.upstream", "--port", str(port), "--window", "5"]
    with subprocess.Popen(command, cwd=REPO) as process:
        try:
            assert wait_until(lambda: not refused(port), timeout=20), "the fake did not start"
            response = httpx.post(f"http://127.0.0.1:{port}{CHAT}", json=chat_body("hello"))
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "context_length_exceeded"
        finally:
            process.terminate()
            process.wait(timeout=10)
