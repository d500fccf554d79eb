"""POST /v1/messages through the gateway with the real `anthropic` SDK, against the fake Messages API.

The fake validates like the real API (alternation, tool pairs, signed thinking, cache_control
limit) and has a small window, so every long conversation here only succeeds if the gateway
fitted it into something the API accepts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from tests.conftest import GatewayFactory
from tests.fakes import anthropic_api
from tests.fakes.upstream import FakeUpstream
from tests.metrics import metric

MODEL = "claude-haiku-4-5"
WINDOW = 3_000
TOOL: Any = {"name": "run", "description": "Run a shell command", "input_schema": {"type": "object"}}
THINKING: Any = {"type": "enabled", "budget_tokens": 1024}
TOOL_USE: Any = {"type": "tool_use", "id": "toolu_1", "name": "run", "input": {}}


def windowed(start_gateway: GatewayFactory, window: int = WINDOW, **environ: str) -> str:
    models = orjson.dumps({MODEL: {"context_window": window}}).decode()
    return start_gateway(GATEWAY_MODELS=models, **environ).removesuffix("/v1")


@pytest.fixture
def gateway_root(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> str:
    fake_upstream.window = WINDOW
    return windowed(start_gateway)


@pytest.fixture
def claude(gateway_root: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gateway_root, api_key="sk-ant-caller", max_retries=0) as client:
        yield client


def log_line(turn: int) -> str:
    return "\n".join(f"line {k} of step {turn}: value={turn * k} status=ok" for k in range(60))


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def test_long_tool_conversation_with_thinking_stays_valid(
    fake_upstream: FakeUpstream, claude: anthropic.Anthropic
) -> None:
    """A growing agent loop (thinking, tool_use, big tool_results) far past the window: every turn answers."""
    history: list[Any] = [user("Investigate the failing build. CALL_TOOL")]
    compressed = 0
    for turn in range(12):
        asked = history[-1]
        raw = claude.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=2048,
            thinking=THINKING,
            tools=[TOOL],
            system="You are terse.",
            messages=history,
        )
        reply = raw.parse()
        compressed += raw.headers["x-gateway-compression"] != "none"
        assert [block.type for block in reply.content] == ["thinking", "tool_use"]
        history.append({"role": "assistant", "content": [block.model_dump() for block in reply.content]})
        tool_id = reply.content[1].id  # type: ignore[union-attr]
        history.append(user([{"type": "tool_result", "tool_use_id": tool_id, "content": log_line(turn)}]))
        history.append({"role": "assistant", "content": "Noted."})
        history.append(user(f"Next step {turn}. CALL_TOOL"))
    assert compressed >= 6, "the conversation outgrew the window and was compressed"
    sent = fake_upstream.anthropic_inputs[-1]
    assert anthropic_api.count_input(sent) + 2048 <= WINDOW
    # The newest turn reached the upstream unchanged, its signed thinking included.
    assert sent["messages"][-1] == asked and sent["system"] == "You are terse."


def test_async_and_stream(fake_upstream: FakeUpstream, gateway_root: str) -> None:
    history = [user(log_line(n)) if n % 2 == 0 else {"role": "assistant", "content": "ok"} for n in range(15)]

    async def run() -> tuple[str, str]:
        async with anthropic.AsyncAnthropic(base_url=gateway_root, api_key="k", max_retries=0) as client:
            plain = await client.messages.create(model=MODEL, max_tokens=256, messages=history)
            async with client.messages.stream(model=MODEL, max_tokens=256, messages=history) as stream:
                streamed = await stream.get_final_message()
        return plain.content[0].text, streamed.content[0].text  # type: ignore[union-attr]

    plain, streamed = asyncio.run(run())
    assert plain == streamed and plain.startswith("echo: line 0 of step 14")
    assert all(anthropic_api.count_input(body) + 256 <= WINDOW for body in fake_upstream.anthropic_inputs)


def test_stream_headers_and_usage(claude: anthropic.Anthropic) -> None:
    with claude.messages.with_streaming_response.create(
        model=MODEL, max_tokens=64, stream=True, messages=[user("hello")]
    ) as raw:
        assert raw.headers["x-gateway-compression"] == "none"
        events = [line for line in raw.iter_lines() if line.startswith("event: ")]
    assert events[0] == "event: message_start" and events[-1] == "event: message_stop"


def test_unchanged_request_is_relayed_byte_for_byte(fake_upstream: FakeUpstream, gateway_root: str) -> None:
    body = orjson.dumps(
        {"model": MODEL, "max_tokens": 50, "messages": [user("hi")], "metadata": {"user_id": "u"}}
    )
    headers = {
        "x-api-key": "sk-ant-caller",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "prompt-caching-2024-07-31",
        "content-type": "application/json",
    }
    answer = httpx.post(f"{gateway_root}/v1/messages", content=body, headers=headers)
    assert answer.status_code == 200
    received = fake_upstream.requests_to("/v1/messages")[-1]
    assert received.body == body
    assert received.headers["x-api-key"] == "sk-ant-caller"
    assert received.headers["anthropic-beta"] == "prompt-caching-2024-07-31"
    assert answer.headers["x-gateway-prompt-tokens-before"] == answer.headers["x-gateway-prompt-tokens-after"]
    assert answer.json()["usage"]["input_tokens"] > 0


def test_configured_key_replaces_every_client_credential(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.required_api_key = "sk-ant-org"
    root = windowed(start_gateway, GATEWAY_UPSTREAM_ANTHROPIC_API_KEY="sk-ant-org")
    with anthropic.Anthropic(base_url=root, api_key="sk-ant-caller", max_retries=0) as client:
        reply = client.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=[user("x")],
            extra_headers={"authorization": "Bearer sk-other"},
        )
    assert reply.content[0].type == "text"
    received = fake_upstream.requests_to("/v1/messages")[-1].headers
    assert received["x-api-key"] == "sk-ant-org" and "authorization" not in received


@pytest.mark.parametrize(
    ("turns", "max_tokens", "wording"),
    [(9, 200, "prompt is too long"), (3, 1_500, "input length and `max_tokens` exceed context limit")],
)
def test_overflow_recovery(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, turns: int, max_tokens: int, wording: str
) -> None:
    """Gateway believes 20k, the upstream has 3k: either of its 400s teaches, a fitted retry answers."""
    fake_upstream.window = WINDOW
    root = windowed(start_gateway, window=20_000)
    history = [
        user(log_line(n)) if n % 2 == 0 else {"role": "assistant", "content": "ok"} for n in range(turns)
    ]
    probe = httpx.post(
        fake_upstream.base_url + "/messages",
        json={"model": MODEL, "max_tokens": max_tokens, "messages": history},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert wording in probe.json()["error"]["message"]  # the answer the gateway will meet
    with anthropic.Anthropic(base_url=root, api_key="k", max_retries=0) as client:
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=max_tokens, messages=history)
    assert raw.headers["x-gateway-retry"] == "overflow"
    assert raw.parse().content[0].text.startswith(f"echo: line 0 of step {turns - 1}")  # type: ignore[union-attr]
    first, retried = fake_upstream.requests_to("/v1/messages")[-2:]
    assert len(retried.body) < len(first.body)


def test_context_window_stop_is_reported_not_retried(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """Under the beta, prompt + max_tokens over the window is a 200 that stops early: relayed as is."""
    fake_upstream.window = WINDOW
    root = windowed(start_gateway, window=20_000)  # the gateway does not know the real window
    beta = {"anthropic-beta": anthropic_api.CONTEXT_WINDOW_BETA}
    with anthropic.Anthropic(base_url=root, api_key="k", max_retries=0) as client:
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=2_999, messages=[user("hello")], extra_headers=beta
        )
    assert raw.parse().stop_reason == "model_context_window_exceeded"
    assert raw.headers["x-gateway-context-window-exceeded"] == "true"
    assert "x-gateway-retry" not in raw.headers
    assert len(fake_upstream.requests_to("/v1/messages")) == 1


def test_context_window_stop_in_a_stream_is_counted(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """A stream's stop reason comes after its headers went out: only the metric can tell."""
    fake_upstream.window = WINDOW
    root = windowed(start_gateway, window=20_000)
    beta = {"anthropic-beta": anthropic_api.CONTEXT_WINDOW_BETA}
    with anthropic.Anthropic(base_url=root, api_key="k", max_retries=0) as client:
        for max_tokens, stops in ((2_999, 1), (16, 0)):
            before = metric(root, "gateway_context_window_stops_total")
            with client.messages.stream(
                model=MODEL, max_tokens=max_tokens, messages=[user("hello")], extra_headers=beta
            ) as stream:
                stopped = stream.get_final_message().stop_reason
            assert (stopped == "model_context_window_exceeded") == bool(stops)
            assert metric(root, "gateway_context_window_stops_total") - before == stops


def test_gateway_errors_are_anthropic_shaped(claude: anthropic.Anthropic, gateway_root: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "tool", "content": "x"}])  # type: ignore[misc,list-item]
    assert "messages[0].role" in str(bad.value)
    use = {"type": "tool_use", "id": "toolu_1", "name": "write", "input": "a file written as one string"}
    answer = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
    steps = [user("go"), {"role": "assistant", "content": [use]}, {"role": "user", "content": [answer]}]
    with pytest.raises(anthropic.BadRequestError) as not_an_object:  # the API takes objects only
        claude.messages.create(model=MODEL, max_tokens=10, messages=steps)  # type: ignore[arg-type]
    assert "messages[1].content[0].input" in str(not_an_object.value)
    # A chat completions field on a message: the compression (this one needs it) took it for calls
    # and failed with a 500. The Messages API has no such field.
    foreign = {"role": "user", "content": "hi", "tool_calls": 1}
    with pytest.raises(anthropic.BadRequestError) as chat_field:
        claude.messages.create(model=MODEL, max_tokens=2_990, messages=[foreign])  # type: ignore[list-item]
    assert "messages[0].tool_calls" in str(chat_field.value)
    huge = "word " * 20_000
    with pytest.raises(anthropic.BadRequestError) as refused:  # the answer alone nearly fills the window
        claude.messages.create(model=MODEL, max_tokens=2_700, system=huge, messages=[user(huge)])
    assert "even after compression" in str(refused.value)
    not_json = httpx.post(
        f"{gateway_root}/v1/messages", content=b"{", headers={"anthropic-version": "2023-06-01"}
    )
    assert not_json.status_code == 400
    assert not_json.json()["type"] == "error" and not_json.json()["error"]["type"] == "invalid_request_error"


def test_count_tokens_is_relayed(claude: anthropic.Anthropic, fake_upstream: FakeUpstream) -> None:
    counted = claude.messages.count_tokens(model=MODEL, messages=[user("hello there")])
    assert counted.input_tokens == anthropic_api.count_input({"messages": [user("hello there")]})
    assert fake_upstream.requests_to("/v1/messages/count_tokens")


def test_every_other_messages_endpoint_goes_to_anthropic(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """Message Batches and any other method on /v1/messages are Anthropic's: they go to its base
    URL with its key, never to the OpenAI base URL with the OpenAI key."""
    root = windowed(
        start_gateway,
        GATEWAY_UPSTREAM_API_KEY="sk-openai-org",
        GATEWAY_UPSTREAM_ANTHROPIC_API_KEY="sk-ant-org",
    )
    headers = {"x-api-key": "sk-ant-caller", "anthropic-version": "2023-06-01"}
    batch = {
        "requests": [
            {"custom_id": "a", "params": {"model": MODEL, "max_tokens": 5, "messages": [user("hi")]}}
        ]
    }
    answers = [
        httpx.post(f"{root}/v1/messages/batches", json=batch, headers=headers),
        httpx.get(f"{root}/v1/messages/batches/msgbatch_1/results?limit=2", headers=headers),
        httpx.get(f"{root}/v1/messages", headers=headers),
    ]
    # The fake serves none of them: its answer, in Anthropic's shape, is relayed.
    assert all(answer.json()["type"] == "error" for answer in answers)
    received = fake_upstream.received
    assert [(r.method, r.path) for r in received] == [
        ("POST", "/v1/messages/batches"),
        ("GET", "/v1/messages/batches/msgbatch_1/results"),
        ("GET", "/v1/messages"),
    ]
    assert received[1].query == "limit=2"
    assert all(
        r.headers.get("x-api-key") == "sk-ant-org" and "authorization" not in r.headers for r in received
    )


@pytest.mark.parametrize("stream", [False, True])
def test_claude_counts_calibrate_on_input_tokens(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, stream: bool
) -> None:
    """Claude is estimated, then corrected by every answer's usage.input_tokens (message_start when
    streamed): the estimate converges on the upstream's own count."""
    fake_upstream.window = 10_000_000
    model = f"claude-test-{stream}"  # a fresh name: calibration is per model and process-wide
    root = windowed(start_gateway)
    errors = []
    for turn in range(1, 26):
        history: list[Any] = []
        for n in range(turn):
            history += [user(f"Question {n}: " + "revenue churn hiring, compared with last year. " * 4)]
            history += [{"role": "assistant", "content": f"Answer {n}: figures went up."}]
        history.append(user("Summarise."))
        body = {
            "model": model,
            "max_tokens": 100,
            "messages": history,
            "system": "Be careful.",
            "stream": stream,
        }
        answer = httpx.post(
            f"{root}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}, timeout=30
        )
        assert answer.status_code == 200
        estimate = int(answer.headers["x-gateway-prompt-tokens-before"])
        reported = anthropic_api.count_input(body)
        errors.append(abs(estimate - reported) / reported)
    assert errors[0] > 0.05  # the family factor alone starts off
    assert max(errors[20:]) < 0.05


def test_broken_stream_ends_with_an_anthropic_error_event(
    claude: anthropic.Anthropic, gateway_root: str
) -> None:
    """An upstream that drops the stream midway: Anthropic's error event ends it, and the SDK raises."""
    body = {"model": MODEL, "max_tokens": 64, "stream": True, "messages": [user("hello there, how are you")]}
    headers = {"anthropic-version": "2023-06-01", "x-fake-fault": "half_stream"}
    answer = httpx.post(f"{gateway_root}/v1/messages", json=body, headers=headers, timeout=30)
    last = answer.text.rstrip("\n").split("\n\n")[-1]
    assert last.startswith("event: error\ndata: ")
    assert orjson.loads(last.split("data: ", 1)[1])["error"]["type"] == "api_error"
    with (
        pytest.raises(anthropic.APIStatusError),
        claude.messages.stream(
            model=MODEL,
            max_tokens=64,
            messages=[user("hello")],
            extra_headers={"x-fake-fault": "half_stream"},
        ) as stream,
    ):
        stream.get_final_message()


def test_teams_hold_the_native_routes(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    """With teams, /v1/messages and /v1/responses need a gateway key, keep to the model allow-list,
    and never pass the gateway key upstream."""
    from gateway.policy.keys import hash_key

    key = "cg-team-key-0123456789abcdef"
    teams = {"research": {"keys": [hash_key(key)], "models": ["claude-*"]}}
    root = windowed(start_gateway, GATEWAY_TEAMS=orjson.dumps(teams).decode())
    with anthropic.Anthropic(base_url=root, api_key=key, max_retries=0) as client:
        reply = client.messages.create(model=MODEL, max_tokens=10, messages=[user("hello")])
        assert reply.content[0].type == "text"
        assert key not in str(fake_upstream.requests_to("/v1/messages")[-1].headers)
    stranger = anthropic.Anthropic(base_url=root, api_key="not-a-team-key", max_retries=0)
    with stranger, pytest.raises(anthropic.AuthenticationError):
        stranger.messages.create(model=MODEL, max_tokens=10, messages=[user("hello")])
    refused = httpx.post(
        f"{root}/v1/responses",
        json={"model": "gpt-4o", "input": "hi"},
        headers={"authorization": f"Bearer {key}"},
    )
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    assert fake_upstream.requests_to("/v1/responses") == []


def test_tool_results_sent_apart_from_the_question_keep_the_thinking_they_answer(
    fake_upstream: FakeUpstream, claude: anthropic.Anthropic
) -> None:
    """A client may send the tool results and its next question as two user messages (the API
    merges them): the assistant turn they answer still starts with its thinking after a fit."""
    thought = "I should look it up."
    messages: Any = [
        user("Look this up."),
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": thought, "signature": anthropic_api.sign(thought)},
                {"type": "tool_use", "id": "toolu_1", "name": "run", "input": {}},
            ],
        },
        user([{"type": "tool_result", "tool_use_id": "toolu_1", "content": log_line(1)}]),
        user("Thanks, now answer."),
    ]
    early: Any = [
        user("An earlier question. " + log_line(0) * 2),
        {"role": "assistant", "content": "An answer."},
    ]
    answer = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=1100, thinking=THINKING, tools=[TOOL], messages=[*early, *messages]
    )
    assert answer.headers["x-gateway-compression"] != "none"
    sent = fake_upstream.requests_to("/v1/messages")[-1].json["messages"]
    assert sent[-3]["content"][0]["type"] == "thinking"
    assert sent[-2:] == messages[-2:]


def test_system_messages_in_the_list_are_accepted_and_kept_through_a_fit(
    fake_upstream: FakeUpstream, claude: anthropic.Anthropic
) -> None:
    """`role: "system"` messages among the turns (text only, the SDK's SystemMessageParam) go through,
    and a fit keeps them as it keeps the system prompt."""
    rule: Any = {"role": "system", "content": [{"type": "text", "text": "From now on, answer in French."}]}
    history: list[Any] = [user("Summarize the build logs.")]
    for turn in range(6):
        history += [{"role": "assistant", "content": log_line(turn)}, user(f"And step {turn}?")]
    history[3:3] = [rule]
    reply = claude.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=history)
    assert reply.http_response.status_code == 200
    assert reply.headers["x-gateway-compression"] != "none"  # over the window: fitted
    sent = fake_upstream.requests_to("/v1/messages")[-1].json["messages"]
    assert rule in sent and sent[-1] == history[-1]
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model=MODEL, max_tokens=64, messages=[{"role": "system", "content": [TOOL_USE]}, user("hi")]
        )
    assert "messages[0].content[0]" in refused.value.message
    # The system prompt itself takes text blocks only too: an image there went to the upstream.
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    sent_before = len(fake_upstream.requests_to("/v1/messages"))
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=MODEL, max_tokens=64, system=[image], messages=[user("hi")])  # type: ignore[list-item]
    assert "system[0]" in refused.value.message
    assert len(fake_upstream.requests_to("/v1/messages")) == sent_before
