"""Compression on the request path: only when over budget, valid for a strict upstream, controllable."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream
from tests.fakes.validation import alternates

WINDOW = 6_000
# An OpenAI model is counted exactly, so calibration from one answer cannot shift the next count.
MODEL = "gpt-4o-mini"
MODELS = json.dumps({MODEL: {"context_window": WINDOW}})
SYSTEM_RULE = "Always answer in French."
LATEST = "Now fix the failing test in parser.py."


def _agent_conversation(rounds: int) -> list[dict[str, object]]:
    """A coding agent: each round an assistant tool call and a long tool result."""
    messages: list[dict[str, object]] = [
        {"role": "system", "content": SYSTEM_RULE},
        {"role": "user", "content": "Investigate the parser bug."},
    ]
    for i in range(rounds):
        call_id = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": json.dumps({"path": f"src/mod{i}.py"}),
                        },
                    }
                ],
            }
        )
        lines = "\n".join(f"{n:04d}    value_{i}_{n} = compute({n}, cache=True)" for n in range(120))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": lines})
    messages.append({"role": "user", "content": LATEST})
    return messages


def _post(url: str, messages: list[dict[str, object]], **headers: str) -> httpx.Response:
    return httpx.post(
        f"{url}/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 500},
        headers=headers,
        timeout=30,
    )


def test_over_budget_conversation_is_fitted_and_accepted(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.window = WINDOW
    url = start_gateway(GATEWAY_MODELS=MODELS)
    answer = _post(url, _agent_conversation(12))
    assert answer.status_code == 200, answer.text
    before = int(answer.headers["x-gateway-prompt-tokens-before"])
    after = int(answer.headers["x-gateway-prompt-tokens-after"])
    assert before > WINDOW > after
    stages = answer.headers["x-gateway-compression"].split(",")
    assert "tool_results" in stages
    sent = fake_upstream.received[-1].json["messages"]
    # The strict fake accepted it (tool pairs intact); the system rule and latest turn survived.
    assert sent[0] == {"role": "system", "content": SYSTEM_RULE}
    assert sent[-1] == {"role": "user", "content": LATEST}
    assert answer.json()["usage"]["prompt_tokens"] + 500 <= WINDOW


def test_fitting_conversation_is_not_touched(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway(GATEWAY_MODELS=MODELS)
    messages = _agent_conversation(1)
    answer = _post(url, messages)
    assert answer.headers["x-gateway-compression"] == "none"
    assert fake_upstream.received[-1].json["messages"] == messages


def test_compression_off_forwards_as_is(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    fake_upstream.window = WINDOW
    url = start_gateway(GATEWAY_MODELS=MODELS)
    messages = _agent_conversation(12)
    answer = _post(url, messages, **{"x-gateway-compression": "off"})
    # The upstream's own overflow error reaches the client unchanged; no retry was attempted.
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 6000 tokens" in answer.json()["error"]["message"]
    assert fake_upstream.hits["/v1/chat/completions"] == 1
    assert fake_upstream.received[-1].json["messages"] == messages


def test_aggressive_leaves_more_headroom(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    url = start_gateway(GATEWAY_MODELS=MODELS)
    budget = WINDOW - 500 - 256  # window - max_tokens - safety margin
    messages = _agent_conversation(12)
    auto = _post(url, messages)
    aggressive = _post(url, messages, **{"x-gateway-compression": "aggressive"})
    assert aggressive.status_code == auto.status_code == 200
    aggressive_after = int(aggressive.headers["x-gateway-prompt-tokens-after"])
    assert aggressive_after <= int(auto.headers["x-gateway-prompt-tokens-after"]) <= budget
    assert aggressive_after <= 0.7 * budget  # compression.aggressive_ratio


def test_sdk_streaming_agent_through_compression(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.window = WINDOW
    url = start_gateway(GATEWAY_MODELS=MODELS)
    client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=_agent_conversation(12),  # type: ignore[arg-type]
        max_tokens=500,
        stream=True,
    )
    assert raw.headers["x-gateway-compression"] != "none"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    assert text == f"echo: {LATEST}"


def test_prompt_that_cannot_fit_is_refused_with_numbers(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway(GATEWAY_MODELS=json.dumps({"tiny-model": {"context_window": 1_000}}))
    # 1000 - 600 (max_tokens) - 256 (margin) leaves 144 tokens: less than the system prompt and
    # the latest message can be trimmed to without losing them.
    huge = {"role": "user", "content": " ".join(f"word{n}" for n in range(5_000))}
    answer = httpx.post(
        f"{url}/chat/completions",
        json={
            "model": "tiny-model",
            "max_tokens": 600,
            "messages": [{"role": "system", "content": "x " * 2_000}, huge],
        },
        timeout=30,
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "budget" in error["message"] and any(ch.isdigit() for ch in error["message"])
    assert "or lower max_tokens to at most " in error["message"]  # the other way to make room
    assert answer.headers["x-gateway-compression"] == "refused"
    assert fake_upstream.requests_to("/v1/chat/completions") == []


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (
            "/chat/completions",
            {"max_tokens": 5_000, "messages": [{"role": "user", "content": "hi"}]},
            "max_tokens",
        ),
        (
            "/chat/completions",
            {"max_completion_tokens": 900, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
            "max_completion_tokens",
        ),
        ("/responses", {"max_output_tokens": 5_000, "input": "hi"}, "max_output_tokens"),
    ],
    ids=["max_tokens", "the-larger-of-two", "responses"],
)
def test_an_answer_that_takes_the_whole_window_is_named(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, path: str, body: dict[str, object], field: str
) -> None:
    """A two-token prompt is not what to shorten when the answer asked for fills the window."""
    url = start_gateway(GATEWAY_MODELS=json.dumps({"tiny-model": {"context_window": 1_000}}))
    answer = httpx.post(f"{url}{path}", json={"model": "tiny-model", **body}, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", field)
    assert error["message"].endswith(f"Lower {field}.")
    assert fake_upstream.requests_to("/v1" + path) == []


@pytest.mark.parametrize("mode", ["auto", "aggressive"])
def test_unknown_model_is_forwarded_unfitted(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, mode: str
) -> None:
    """Without a known window the gateway cannot guess: it forwards and learns from the upstream."""
    url = start_gateway()
    messages = _agent_conversation(12)
    answer = httpx.post(
        f"{url}/chat/completions",
        json={"model": "never-heard-of-it", "messages": messages},
        headers={"x-gateway-compression": mode},
    )
    assert answer.status_code == 200
    assert answer.headers["x-gateway-compression"] == "none"
    assert fake_upstream.received[-1].json["messages"] == messages


def _big_tools(count: int) -> list[dict[str, object]]:
    """Tool definitions an agent sends on every request: they count, and are never cut."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"Tool number {i}. " + "It reads, filters and reports project data. " * 30,
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string", "description": "A path in the repository."}},
                },
            },
        }
        for i in range(count)
    ]


def test_tools_and_response_format_are_reserved_in_the_budget(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """The messages are fitted into what tools and the response schema leave: the strict upstream
    (which counts them too) accepts the first attempt, no overflow retry needed."""
    fake_upstream.window = WINDOW
    url = start_gateway(GATEWAY_MODELS=MODELS)
    tools = _big_tools(4)
    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "report",
            "schema": {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(60)}},
        },
    }
    body = {
        "model": MODEL,
        # Dropping turns lands close to the budget (coarser stages could hide a missing reserve).
        "messages": _chat_turns(40),
        "max_tokens": 500,
        "tools": tools,
        "response_format": schema,
    }
    answer = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert "x-gateway-retry" not in answer.headers
    assert fake_upstream.hits["/v1/chat/completions"] == 1
    sent = fake_upstream.received[-1].json
    assert sent["tools"] == tools and sent["response_format"] == schema
    # Tools and schema alone take a third of the budget: unreserved, the prompt would overflow.
    assert answer.json()["usage"]["prompt_tokens"] + 500 <= WINDOW


def _chat_turns(count: int) -> list[dict[str, object]]:
    """Plain chat turns, each too short to truncate: only dropping turns can make room."""
    messages: list[dict[str, object]] = [{"role": "system", "content": SYSTEM_RULE}]
    for i in range(count):
        messages.append({"role": "user", "content": f"Question {i}: " + "tell me about the port. " * 12})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "the port is busy today. " * 12})
    messages.append({"role": "user", "content": LATEST})
    return messages


def test_aggressive_keeps_less_than_auto_when_auto_uses_its_room(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway(GATEWAY_MODELS=MODELS)
    budget = WINDOW - 500 - 256
    messages = _chat_turns(40)
    auto = _post(url, messages)
    aggressive = _post(url, messages, **{"x-gateway-compression": "aggressive"})
    assert auto.status_code == aggressive.status_code == 200
    auto_after = int(auto.headers["x-gateway-prompt-tokens-after"])
    aggressive_after = int(aggressive.headers["x-gateway-prompt-tokens-after"])
    assert int(auto.headers["x-gateway-prompt-tokens-before"]) > budget
    # Auto keeps what fits; aggressive asks for headroom below compression.aggressive_ratio.
    assert 0.7 * budget < auto_after <= budget
    assert aggressive_after <= 0.7 * budget


def _forty_turns() -> list[dict[str, object]]:
    """A chat of 40 question-and-answer turns and the latest question: over WINDOW, so it drops turns."""
    chat: list[dict[str, object]] = [{"role": "system", "content": SYSTEM_RULE}]
    for turn in range(40):
        chat += [
            {"role": "user", "content": f"Question {turn}: " + "why is the build slow? " * 30},
            {"role": "assistant", "content": f"Answer {turn}: " + "the cache was cold. " * 30},
        ]
    return [*chat, {"role": "user", "content": LATEST}]


def test_merged_markers_serve_a_model_whose_template_needs_alternating_roles(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """vLLM applying a Gemma-style chat template refuses two user messages in a row, which a drop
    leaves (its marker beside a user message). `compression.markers: merged` joins them; without
    it, the refused request goes again merged and the model is remembered."""
    fake_upstream.window = WINDOW
    fake_upstream.alternating_roles = True
    chat = _forty_turns()
    body = {"model": MODEL, "messages": chat, "max_tokens": 200}
    url = start_gateway(GATEWAY_MODELS=MODELS) + "/chat/completions"
    chats = "/v1/chat/completions"
    calls = len(fake_upstream.requests_to(chats))
    retried = httpx.post(url, json=body)
    assert retried.status_code == 200 and retried.headers["x-gateway-retry"] == "merged_markers"
    assert len(fake_upstream.requests_to(chats)) == calls + 2, "refused once, then sent merged"
    assert alternates(fake_upstream.requests_to(chats)[-1].json["messages"])
    again = httpx.post(url, json={**body, "messages": [*chat[:-1], {"role": "user", "content": "And now?"}]})
    assert again.status_code == 200 and "x-gateway-retry" not in again.headers
    assert len(fake_upstream.requests_to(chats)) == calls + 3, "the model goes merged at once from then on"
    # A client's own two user messages in a row, nothing compressed: its refusal goes back as it is.
    own = [{"role": "user", "content": "Hello."}, {"role": "user", "content": "Are you there?"}]
    refused = httpx.post(url, json={"model": MODEL, "messages": own})
    assert refused.status_code == 400 and "alternate" in refused.json()["message"]
    assert len(fake_upstream.requests_to(chats)) == calls + 4
    merged_url = start_gateway(GATEWAY_MODELS=MODELS, GATEWAY_COMPRESSION_MARKERS="merged")
    merged = httpx.post(merged_url + "/chat/completions", json=body)
    assert merged.status_code == 200 and "drop_turns" in merged.headers["x-gateway-compression"]
    sent = fake_upstream.received[-1].json["messages"]
    assert sent[-1]["content"] == LATEST and "earlier messages omitted" in json.dumps(sent)


def test_a_merged_retry_that_overflows_is_retried_compressed(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """vLLM applies the chat template before it checks the length: a window configured larger than
    the served one had the first request refused for its markers, then, sent merged, for its
    length, and that overflow went to the client. Each send now gets the merged retry, then the
    overflow logic reads what came of it."""
    fake_upstream.window = 4_000
    fake_upstream.alternating_roles = True
    chat = _forty_turns()
    url = start_gateway(GATEWAY_MODELS=MODELS)  # 6,000 configured: more than the upstream serves
    answer = httpx.post(url + "/chat/completions", json={"model": MODEL, "messages": chat, "max_tokens": 200})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-gateway-retry"] == "overflow,merged_markers"
    assert len(fake_upstream.requests_to("/v1/chat/completions")) == 3, "refused, overflowed, answered"


def test_claude_through_chat_completions_keeps_its_thinking_rule(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """Claude with thinking on behind a chat-completions gateway (litellm: signed thinking as
    `thinking_blocks`) refuses a prompt whose last tool results answer an assistant message
    without its thinking. Compressing such a conversation dropped that older step's thinking;
    the step now goes on as text and the request is answered."""
    claude = "claude-sonnet-4-5"
    fake_upstream.window = WINDOW
    signed = [{"type": "thinking", "thinking": "plan " * 300, "signature": "sig"}]
    chat: list[dict[str, object]] = [{"role": "system", "content": SYSTEM_RULE}]
    for turn in range(12):
        chat += [
            {"role": "user", "content": f"Question {turn}: " + "why is the build slow? " * 30},
            {
                "role": "assistant",
                "content": f"Answer {turn}: " + "the cache was cold. " * 30,
                "thinking_blocks": signed,
            },
        ]
    call = {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "pytest"}'}}
    chat += [
        {"role": "user", "content": "Run the tests."},
        {"role": "assistant", "content": None, "thinking_blocks": signed, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 failed, 97 passed"},
        {"role": "user", "content": LATEST},
    ]
    url = start_gateway(GATEWAY_MODELS=json.dumps({claude: {"context_window": WINDOW}}))
    body = {
        "model": claude,
        "messages": chat,
        "max_tokens": 200,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    answer = httpx.post(url + "/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    assert "reasoning" in answer.headers["x-gateway-compression"]
    sent = fake_upstream.requests_to("/v1/chat/completions")[-1].json["messages"]
    assert sent[-1]["content"] == LATEST and '[called run with {"cmd": "pytest"}]' in sent[-3]["content"]
