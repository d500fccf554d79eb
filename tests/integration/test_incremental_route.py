"""A growing agent conversation through the real gateway and the real OpenAI SDK: each body's
repeated head is taken from the previous request (gateway/wire/incremental.py), and what the
upstream receives and the counts the gateway reports are what the client sent."""

from __future__ import annotations

import json
from typing import Any

import openai

from gateway.chat_request import PARSERS
from gateway.tokens.cache import CountCache
from gateway.tokens.calibration import Calibration
from gateway.tokens.counter import TokenCounter
from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream
from tests.integration.test_agent_loop_route import _loop

MODEL = "gpt-4o-mini"


def _send(url: str, messages: list[dict[str, Any]]) -> Any:
    client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,
        max_tokens=500,
    )
    assert raw.http_response.status_code == 200
    return raw


def _cold_count(messages: list[dict[str, Any]]) -> int:
    counter = TokenCounter(MODEL, calibration=Calibration(), cache=CountCache())
    return counter.request({"messages": messages, "max_tokens": 500})


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
