"""The fake upstream's Anthropic Messages and OpenAI Responses APIs: strictness, state, SSE, overflow.

Driven with the real `anthropic` and `openai` SDKs, so the shapes are the ones those SDKs parse.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.fakes import anthropic_api, responses_api
from tests.fakes.responses_api import ResponsesState
from tests.fakes.upstream import FakeUpstream

TOOL = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
FUNCTION_TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


@pytest.fixture
def claude(fake_upstream: FakeUpstream) -> Iterator[anthropic.Anthropic]:
    base = fake_upstream.base_url.removesuffix("/v1")
    with anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0) as client:
        yield client


@pytest.fixture
def sdk(fake_upstream: FakeUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake_upstream.base_url, api_key="sk-test", max_retries=0) as client:
        yield client


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": anthropic_api.sign(text)}


def tool_use(tool_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "get_weather", "input": {}}


def tool_result(tool_id: str, text: str = "sunny") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": text}


def body(messages: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-haiku-4-5", "max_tokens": 2048, "messages": messages, **extra}


# --- Anthropic validation (pure) -----------------------------------------------------------------


def test_valid_anthropic_bodies_pass() -> None:
    messages = [
        user("hi"),
        assistant([thinking("plan"), {"type": "text", "text": "calling"}, tool_use("t1")]),
        user([tool_result("t1"), {"type": "text", "text": "and now?"}]),
        user("consecutive user turns are merged, as the API does"),
    ]
    thinking_on = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    assert anthropic_api.validate(body(messages, system="be brief", **thinking_on)) is None
    system_blocks = [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]
    assert anthropic_api.validate(body([user("x")], system=system_blocks)) is None


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"model": "m", "messages": [user("x")]}, "max_tokens: Field required"),
        (body([]), "at least one message"),
        (body([{"role": "tool", "content": "x"}]), "messages.0.role"),
        (
            body([{"role": "system", "content": [{"type": "image", "source": {}}]}, user("x")]),
            "messages.0.content.0",
        ),
        (body([user("")]), "messages.0: all messages must have non-empty content"),
        (body([user([{"type": "text", "text": ""}])]), "text content blocks must be non-empty"),
        (
            body([user([{"type": "text", "text": " \n"}])]),
            "text content blocks must contain non-whitespace text",
        ),
        (body([user([{"type": "tool_use", "id": "x", "name": "n", "input": {}}])]), "Input tag 'tool_use'"),
        (body([user("q"), assistant([tool_use("t1")]), user("no result")]), "`tool_use` ids were found"),
        (body([user([tool_result("t9")])]), "unexpected `tool_use_id`"),
        (
            body([user("q"), assistant([tool_use("t1")]), user("note"), user([tool_result("t1")])]),
            "messages.2: Did not find 1 `tool_result` block(s) at the beginning",
        ),
        (
            body([user("q"), assistant([{**thinking("plan"), "thinking": "edited"}]), user("go")]),
            "Invalid `signature`",
        ),
        (body([user("x")], system=[{"type": "image"}]), "system.0"),
        (
            body([user("q")], thinking={"type": "enabled", "budget_tokens": 10}),
            "greater than or equal to 1024",
        ),
    ],
)
def test_anthropic_validation_errors(payload: dict[str, Any], fragment: str) -> None:
    error = anthropic_api.validate(payload)
    assert error is not None and fragment in error[1], error


def test_thinking_must_open_the_turn_the_final_tool_results_answer() -> None:
    messages = [user("q"), assistant([tool_use("t1")]), user([tool_result("t1")])]
    on = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    error = anthropic_api.validate(body(messages, **on))
    assert error is not None and "must start with a thinking block" in error[1]
    assert anthropic_api.validate(body(messages)) is None  # without thinking: fine
    messages[1] = assistant([thinking("plan"), tool_use("t1")])
    assert anthropic_api.validate(body(messages, **on)) is None


def test_at_most_four_cache_control_blocks() -> None:
    marked = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    four = body([user([marked, marked]), assistant("a"), user([marked, marked])])
    assert anthropic_api.validate(four) is None
    error = anthropic_api.validate({**four, "system": [marked]})
    assert error == ("invalid_request_error", anthropic_api.TOO_MANY_CACHE_CONTROL.format(count=5))


def test_redacted_thinking_must_be_issued_by_the_fake() -> None:
    good = {"type": "redacted_thinking", "data": anthropic_api.redacted("secret")}
    assert (
        anthropic_api.validate(body([user("q"), assistant([good, {"type": "text", "text": "a"}]), user("x")]))
        is None
    )
    bad = {"type": "redacted_thinking", "data": good["data"] + "x"}
    error = anthropic_api.validate(body([user("q"), assistant([bad]), user("x")]))
    assert error is not None and "redacted_thinking" in error[1]


# --- Anthropic over HTTP, with the SDK -----------------------------------------------------------


def test_sdk_message_counts_and_echoes(fake_upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    fake_upstream.window = 10_000
    reply = claude.messages.create(model="claude-haiku-4-5", max_tokens=100, messages=[user("hello there")])
    assert reply.content[0].type == "text" and reply.content[0].text == "echo: hello there"
    assert reply.usage.input_tokens == anthropic_api.count_input(body([user("hello there")]))
    assert reply.stop_reason == "end_turn"
    counted = claude.messages.count_tokens(model="claude-haiku-4-5", messages=[user("hello there")])
    assert counted.input_tokens == reply.usage.input_tokens


def test_sdk_stream_with_thinking_and_tools(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model="claude-haiku-4-5",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[TOOL],  # type: ignore[list-item]
        messages=[user("CALL_TOOL please")],
    ) as stream:
        final = stream.get_final_message()
    kinds = [block.type for block in final.content]
    assert kinds == ["thinking", "tool_use"] and final.stop_reason == "tool_use"
    # The streamed thinking block, sent back unchanged, passes the signature check.
    history = [
        user("CALL_TOOL please"),
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
    ]
    tool_id = final.content[1].id  # type: ignore[union-attr]
    history.append(user([tool_result(tool_id)]))
    again = claude.messages.create(
        model="claude-haiku-4-5",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=[TOOL],  # type: ignore[list-item]
        messages=history,  # type: ignore[arg-type]
    )
    assert again.content[-1].type == "text"


def test_anthropic_overflow_wordings(fake_upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    fake_upstream.window = 50
    with pytest.raises(anthropic.BadRequestError) as prompt_too_long:
        claude.messages.create(model="claude-haiku-4-5", max_tokens=10, messages=[user("word " * 100)])
    assert "prompt is too long" in str(prompt_too_long.value)
    with pytest.raises(anthropic.BadRequestError) as max_tokens:
        claude.messages.create(model="claude-haiku-4-5", max_tokens=49, messages=[user("hi")])
    assert "input length and `max_tokens` exceed context limit" in str(max_tokens.value)
    beta = {"anthropic-beta": anthropic_api.CONTEXT_WINDOW_BETA}
    reply = claude.messages.create(
        model="claude-haiku-4-5", max_tokens=49, messages=[user("hi")], extra_headers=beta
    )
    assert reply.stop_reason == "model_context_window_exceeded"


def test_anthropic_auth_and_version(fake_upstream: FakeUpstream) -> None:
    fake_upstream.required_api_key = "sk-ant-right"
    url = fake_upstream.base_url + "/messages"
    payload = body([user("x")])
    no_version = httpx.post(url, json=payload, headers={"x-api-key": "sk-ant-right"})
    assert no_version.status_code == 400 and no_version.json()["type"] == "error"
    wrong = httpx.post(url, json=payload, headers={"x-api-key": "nope", "anthropic-version": "2023-06-01"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    bearer = httpx.post(
        url, json=payload, headers={"authorization": "Bearer sk-ant-right", "anthropic-version": "2023-06-01"}
    )
    assert bearer.status_code == 401  # the Messages API reads x-api-key only
    assert "request-id" in wrong.headers


# --- Responses (pure) -------------------------------------------------------------------------


def call(call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": "{}"}


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny"}


@pytest.mark.parametrize(
    ("items", "fragment"),
    [
        ([{"role": "user", "content": "x"}, call("c1")], "No tool output found for function call c1."),
        ([output("c2")], "No tool call found for function call output with call_id c2."),
        ([{"type": "reasoning", "id": "rs_1", "summary": []}], "without its required following item"),
        ([{"role": "tool", "content": "x"}], "Invalid value: 'tool'"),
        ([{"type": "nonsense"}], "Invalid value: 'nonsense'"),
        ([{"type": "function_call", "name": "x", "arguments": "{}"}], "'input[0].call_id'"),
        (
            [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}],
            "Invalid value: 'input_text'",
        ),
    ],
)
def test_responses_validation_errors(items: list[Any], fragment: str) -> None:
    error = responses_api.validate({"model": "gpt-4o", "input": items}, ResponsesState())
    assert error is not None and fragment in error[1], error


def test_responses_pairs_and_reasoning_pass() -> None:
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        call("c1"),
        output("c1"),
        {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ]
    assert responses_api.validate({"model": "gpt-4o", "input": items}, ResponsesState()) is None


# --- Responses over HTTP, with the SDK ---------------------------------------------------------


def test_previous_response_id_keeps_history(fake_upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(model="gpt-4o", input="CALL_TOOL now", tools=[FUNCTION_TOOL])  # type: ignore[list-item]
    assert first.output[0].type == "function_call"
    call_id = first.output[0].call_id  # type: ignore[union-attr]
    second = sdk.responses.create(
        model="gpt-4o",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call_id, "output": "sunny"}],
    )
    assert second.output_text == "echo: CALL_TOOL now"
    assert len(fake_upstream.responses_inputs[-1]) == 3  # user, call (stored), output
    with pytest.raises(openai.BadRequestError, match="Previous response with id 'resp_nope' not found"):
        sdk.responses.create(model="gpt-4o", previous_response_id="resp_nope", input="x")


def test_responses_stream_events(sdk: openai.OpenAI) -> None:
    events = list(sdk.responses.create(model="gpt-4o", input="hello there", stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "echo: hello there"


def test_responses_overflow_truncation_and_input_tokens(
    fake_upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    first = sdk.responses.create(model="gpt-4o", input="word " * 60)
    fake_upstream.window = 80
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model="gpt-4o", previous_response_id=first.id, input="more")
    assert refused.value.code == "context_length_exceeded"
    streamed = list(
        sdk.responses.create(model="gpt-4o", previous_response_id=first.id, input="more", stream=True)
    )
    assert streamed[-1].type == "response.failed"
    assert (
        streamed[-1].response.error is not None
        and streamed[-1].response.error.code == "context_length_exceeded"
    )
    truncated = sdk.responses.create(
        model="gpt-4o", previous_response_id=first.id, input="more", truncation="auto"
    )
    assert truncated.output_text == "echo: more"
    assert truncated.usage is not None and truncated.usage.input_tokens <= 80
    measured = httpx.post(
        fake_upstream.base_url + "/responses/input_tokens",
        json={"model": "gpt-4o", "previous_response_id": first.id, "input": "more"},
    ).json()
    assert measured["object"] == "response.input_tokens" and measured["input_tokens"] > 80
