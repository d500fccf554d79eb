"""An agent loop through the real gateway: older steps compressed, the newest tool result whole."""

from __future__ import annotations

import json

import openai

from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream

WINDOW = 8_000
MODEL = "gpt-4o-mini"
MODELS = json.dumps({MODEL: {"context_window": WINDOW}})
TASK = "Task T-4471: make the parser tests pass."


def _loop(steps: int) -> list[dict[str, object]]:
    """One task, then `steps` tool calls each answered by a ~1k-token result; ends on the newest result."""
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": TASK},
    ]
    for step in range(steps):
        call = f"call_{step}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call, "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}
                ],
            }
        )
        log = "\n".join(f"tests/test_parser.py::test_case_{step}_{n} PASSED [{n:3d}%]" for n in range(60))
        messages.append({"role": "tool", "tool_call_id": call, "content": log})
    return messages


def _send(
    url: str, fake_upstream: FakeUpstream, messages: list[dict[str, object]]
) -> tuple[list[str], list[dict[str, object]]]:
    """Send through the gateway with the OpenAI SDK: the stages applied and what the upstream received."""
    client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=500,
    )
    assert raw.http_response.status_code == 200
    assert int(raw.headers["x-gateway-prompt-tokens-before"]) > WINDOW
    return raw.headers["x-gateway-compression"].split(","), fake_upstream.received[-1].json["messages"]


def test_agent_loop_keeps_task_and_newest_result_through_the_route(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.window = WINDOW
    url = start_gateway(GATEWAY_MODELS=MODELS)
    messages = _loop(30)
    stages, sent = _send(url, fake_upstream, messages)
    assert "tool_results" in stages
    # The strict fake accepted it; the task and the newest step arrive byte for byte,
    # the oldest result was compressed, and every call is still there.
    assert sent[1] == {"role": "user", "content": TASK}
    assert sent[-2:] == messages[-2:]
    assert sent[3]["content"] != messages[3]["content"]
    assert sum(1 for m in sent if m["role"] == "tool") == 30


def test_tight_loop_is_compressed_not_refused(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """The latest turn alone is larger than the budget: older steps go, the request is answered."""
    fake_upstream.window = WINDOW
    url = start_gateway(GATEWAY_MODELS=MODELS, GATEWAY_COMPRESSION_RECENT_STEPS_RATIO="0.3")
    messages = _loop(200)
    stages, sent = _send(url, fake_upstream, messages)
    assert "drop_turns" in stages
    assert sent[1] == {"role": "user", "content": TASK}
    assert "earlier messages omitted" in str(sent[2]["content"])
    assert sent[-2:] == messages[-2:]


def test_a_loop_of_custom_tool_calls_keeps_its_calls_through_the_route(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """GPT-5's custom tools: each call's free-form input (a patch) is cut as the calls age, so the
    older calls stay (as calls, in their shape, which the upstream checks) instead of dropping."""
    fake_upstream.window = WINDOW
    url = start_gateway(GATEWAY_MODELS=MODELS)
    messages = _loop(30)
    for message in messages:
        for call in message.get("tool_calls") or ():  # type: ignore[attr-defined]
            lines = "".join(f"+    assert parse({n}) == {n}\n" for n in range(80))
            patch = f"*** Begin Patch\n*** Update File: tests/test_parser.py\n{lines}*** End Patch"
            call.update(type="custom", custom={"name": "apply_patch", "input": patch})
            del call["function"]
    _, sent = _send(url, fake_upstream, messages)
    calls = [call for m in sent for call in m.get("tool_calls") or ()]  # type: ignore[attr-defined]
    assert len(calls) == 30 and all(call["type"] == "custom" for call in calls)
    assert sent[-2:] == messages[-2:]


def test_a_deepseek_thinking_loop_is_fitted_without_losing_its_reasoning_fields(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """DeepSeek in thinking mode answers 400 for an assistant message of the current turn without
    `reasoning_content` (the fake does as it does): aged steps keep the field, emptied."""
    fake_upstream.window = WINDOW
    model = "deepseek-reasoner"
    url = start_gateway(GATEWAY_MODELS=json.dumps({model: {"context_window": WINDOW}}))
    messages = _loop(30)
    for message in messages:
        if message["role"] == "assistant":
            message["reasoning_content"] = "The tests fail in the parser; I run them again. " * 20
    client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        max_tokens=500,  # type: ignore[arg-type]
    )
    assert raw.http_response.status_code == 200 and "reasoning" in raw.headers["x-gateway-compression"]
    sent = fake_upstream.received[-1].json["messages"]
    assert all(isinstance(m.get("reasoning_content"), str) for m in sent if m["role"] == "assistant")
