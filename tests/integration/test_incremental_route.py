"""A growing agent conversation through the real gateway and the real OpenAI SDK: each body's
repeated head (and the tool definitions after it) is taken from the previous request
(gateway/wire/incremental.py), a Responses loop's items are converted once
(gateway/wire/responses_memory.py), and what the upstream receives and the counts the gateway
reports are what the client sent."""

from __future__ import annotations

import json
from typing import Any

import openai

from gateway.chat_request import PARSERS
from gateway.tokens.cache import CountCache
from gateway.tokens.calibration import Calibration
from gateway.tokens.counter import TokenCounter
from gateway.wire.responses import RESPONSES, SERVED_RESPONSES
from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream
from tests.integration.test_agent_loop_route import _loop
from tests.unit.test_incremental_parse import TOOLS  # an agent's 12 definitions, ~9 KB

MODEL = "gpt-4o-mini"


def _send(url: str, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> Any:
    client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        max_tokens=500,
        **({"tools": tools} if tools else {}),
    )
    assert raw.http_response.status_code == 200
    return raw


def _cold_count(messages: list[dict[str, Any]], tools: list[Any] | None = None) -> int:
    counter = TokenCounter(MODEL, calibration=Calibration(), cache=CountCache())
    return counter.request({"messages": messages, "max_tokens": 500, **({"tools": tools} if tools else {})})


def test_a_growing_loop_is_parsed_incrementally_and_forwarded_and_counted_exactly(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway()
    for steps in (8, 9, 10, 11):
        messages = _loop(steps)
        raw = _send(url, messages)
        assert int(raw.headers["x-gateway-prompt-tokens-before"]) == _cold_count(messages)
        assert raw.headers["x-gateway-compression"] == "none"
        assert fake_upstream.received[-1].json["messages"] == messages
    # The SDK's bodies are laid out as orjson writes them: each grown body took the place of
    # the one it grew from (a body parsed whole would have been remembered beside it).
    assert len(PARSERS["chat"]) == 1


def test_compressing_a_loop_leaves_the_reused_messages_as_the_client_sent_them(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """Fits work on messages the next request takes again: had one changed a message in place,
    the next count and the next forwarded body would show it."""
    fake_upstream.window = 8_000
    url = start_gateway(GATEWAY_MODELS=json.dumps({MODEL: {"context_window": 8_000}}))
    for steps in (12, 13, 14):
        messages = _loop(steps)
        raw = _send(url, messages)
        assert int(raw.headers["x-gateway-prompt-tokens-before"]) == _cold_count(messages)
        assert raw.headers["x-gateway-compression"] != "none"
        sent = fake_upstream.received[-1].json["messages"]
        assert sent[:2] == messages[:2] and sent[-2:] == messages[-2:]
    assert len(PARSERS["chat"]) == 1


def test_tool_definitions_taken_from_the_last_body_are_forwarded_and_counted_as_sent(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway()
    for steps in (8, 9, 10):
        messages = _loop(steps)
        # The last request changes a definition: its own tools are read, not the remembered ones.
        renamed = {"type": "function", "function": {**TOOLS[-1]["function"], "name": "renamed"}}
        tools = TOOLS if steps < 10 else [*TOOLS[:-1], renamed]
        raw = _send(url, messages, tools)
        assert int(raw.headers["x-gateway-prompt-tokens-before"]) == _cold_count(messages, tools)
        forwarded = fake_upstream.received[-1].json
        assert forwarded["messages"] == messages and forwarded["tools"] == tools


def _items(steps: int) -> list[dict[str, Any]]:
    """A Responses agent loop: the task, then a function call and its output per step."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "Find why the build fails."}]
    for step in range(steps):
        call = f"call_{step}"
        items.append({"type": "function_call", "call_id": call, "name": "run", "arguments": "{}"})
        log = "\n".join(f"build step {step}.{n}: compiled module_{n}.c ok" for n in range(50))
        items.append({"type": "function_call_output", "call_id": call, "output": log})
    return items


def test_a_responses_loop_reuses_its_converted_items_and_counts_exactly(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway()
    tools = [{"type": "function", **tool["function"]} for tool in TOOLS]
    client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
    remembered = len(SERVED_RESPONSES.conversions or ())
    for steps in (10, 11, 12):
        items = _items(steps)
        raw = client.responses.with_raw_response.create(
            model=MODEL,
            input=items,
            tools=tools,
            instructions="Be terse.",
            max_output_tokens=500,  # type: ignore[arg-type]
        )
        assert raw.http_response.status_code == 200
        body = {
            "model": MODEL,
            "input": items,
            "tools": tools,
            "instructions": "Be terse.",
            "max_output_tokens": 500,
        }
        counter = TokenCounter(MODEL, calibration=Calibration(), cache=CountCache())
        assert int(raw.headers["x-gateway-prompt-tokens-before"]) == counter.request(
            RESPONSES.view(body).counted
        )
        forwarded = fake_upstream.requests_to("/v1/responses")[-1].json
        assert forwarded["input"] == items and forwarded["tools"] == tools
    # Each request's conversion replaced the one it grew from.
    assert len(SERVED_RESPONSES.conversions or ()) == remembered + 1
