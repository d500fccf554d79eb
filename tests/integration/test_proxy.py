"""The transparent proxy: real openai SDK → real gateway → real fake upstream, all on loopback."""

from __future__ import annotations

import asyncio
import logging

import httpx
import openai
import orjson
import pytest

from tests.conftest import GatewayFactory
from tests.fakes.serve import free_port
from tests.fakes.upstream import FakeUpstream

KEY = "sk-test-caller-0123456789abcdef"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the capital of France?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def _sync(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)


def _without_ids(completion: openai.BaseModel) -> dict[str, object]:
    data = completion.model_dump()
    data.pop("id", None)
    data.pop("created", None)
    return data


def test_sdk_non_streaming_answer_matches_direct(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    direct = _sync(fake_upstream.base_url).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    proxied = _sync(gateway_url).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert _without_ids(proxied) == _without_ids(direct)
    assert proxied.choices[0].message.content == "echo: What is the capital of France?"
    assert proxied.usage is not None and proxied.usage.prompt_tokens > 0


def test_sdk_streaming_chunks_match_direct(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    def collect(base_url: str) -> list[dict[str, object]]:
        stream = _sync(base_url).chat.completions.create(
            model="gpt-4o", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = []
        for chunk in stream:
            data = chunk.model_dump()
            data.pop("id")
            data.pop("created")
            chunks.append(data)
        return chunks

    direct, proxied = collect(fake_upstream.base_url), collect(gateway_url)
    assert proxied == direct
    deltas = [c["choices"][0]["delta"] for c in proxied if c["choices"]]  # type: ignore[index]
    text = "".join(delta["content"] or "" for delta in deltas)
    assert text == "echo: What is the capital of France?"
    assert proxied[-1]["usage"] is not None


async def test_async_sdk_streams_first_chunk_before_upstream_finishes(
    fake_upstream: FakeUpstream, gateway_url: str
) -> None:
    fake_upstream.chunk_delay = 0.3
    client = openai.AsyncOpenAI(base_url=gateway_url, api_key=KEY, max_retries=0)
    stream = await client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    first = await anext(aiter(stream))
    # The upstream is still generating when the client already holds the first chunk.
    assert fake_upstream.active_streams == 1
    assert first.choices[0].delta.role == "assistant"
    rest = [chunk async for chunk in stream]
    assert rest and rest[-1].choices[0].finish_reason == "stop"
    await client.close()


async def test_async_sdk_non_streaming(gateway_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=gateway_url, api_key=KEY, max_retries=0)
    completion = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert completion.choices[0].message.content == "echo: What is the capital of France?"
    await client.close()


def test_sdk_tool_round_trip(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    client = _sync(gateway_url)
    messages: list[dict[str, object]] = [{"role": "user", "content": "CALL_TOOL weather in Paris"}]
    first = client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    call = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and call
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call[0].id, "content": "18C and sunny"})
    messages.append({"role": "user", "content": "Thanks, summarise."})
    second = client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert second.choices[0].message.content == "echo: Thanks, summarise."
    # The strict fake accepted the paired history exactly as the SDK built it.
    assert fake_upstream.received[-1].json["messages"] == messages


def test_fitting_request_is_forwarded_byte_for_byte(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    raw = (
        b'{ "messages" : [ {"content": "caf\\u00e9  ok", "role":"user", "x-extra": [1, 2.50]} ],'
        b'\n "model":"gpt-4o"}'
    )
    answer = httpx.post(
        f"{gateway_url}/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 200
    assert fake_upstream.received[-1].body == raw
    assert answer.headers["x-gateway-compression"] == "none"
    before = int(answer.headers["x-gateway-prompt-tokens-before"])
    assert before == int(answer.headers["x-gateway-prompt-tokens-after"]) and before > 0
    assert int(answer.headers["content-length"]) == len(answer.content)


def test_headers_cross_both_ways_without_hop_by_hop(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    answer = httpx.post(
        f"{gateway_url}/chat/completions",
        json={"model": "gpt-4o", "messages": MESSAGES},
        headers={
            "Authorization": f"Bearer {KEY}",
            "OpenAI-Organization": "org-abc",
            "OpenAI-Project": "proj-xyz",
            "X-Custom-Trace": "trace-1",
            "X-Request-Id": "client-req-42",
            "Connection": "keep-alive, x-drop-me",
            "X-Drop-Me": "hop-by-hop by naming",
            "Proxy-Authorization": "Basic secret",
        },
    )
    assert answer.status_code == 200
    seen = fake_upstream.received[-1].headers
    assert seen["openai-organization"] == "org-abc"
    assert seen["openai-project"] == "proj-xyz"
    assert seen["x-custom-trace"] == "trace-1"
    assert seen["authorization"] == f"Bearer {KEY}"
    assert seen["x-request-id"] == "client-req-42"
    assert "x-drop-me" not in seen and "proxy-authorization" not in seen
    # The upstream's own ids and rate-limit headers reach the client, plus the gateway's id.
    assert answer.headers["x-request-id"].startswith("req_")
    assert "openai-processing-ms" in answer.headers
    assert "x-ratelimit-remaining-requests" in answer.headers
    assert answer.headers["x-gateway-request-id"] == "client-req-42"


def test_request_id_generated_when_absent(gateway_url: str) -> None:
    answer = httpx.post(f"{gateway_url}/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES})
    assert len(answer.headers["x-gateway-request-id"]) == 32


def test_configured_api_key_replaces_callers(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.required_api_key = "sk-upstream-real-key-9999"
    url = start_gateway(GATEWAY_UPSTREAM_API_KEY="sk-upstream-real-key-9999")
    completion = _sync(url).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert completion.choices[0].message.content
    assert fake_upstream.received[-1].headers["authorization"] == "Bearer sk-upstream-real-key-9999"


def test_upstream_auth_error_relayed_as_is(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    fake_upstream.required_api_key = "sk-the-right-one-0000"
    with pytest.raises(openai.AuthenticationError) as caught:
        _sync(gateway_url).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"


def test_passthrough_routes(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    client = _sync(gateway_url)
    direct = _sync(fake_upstream.base_url)
    assert [m.id for m in client.models.list()] == [m.id for m in direct.models.list()]
    embedded = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert (
        embedded.model_dump()
        == direct.embeddings.create(model="text-embedding-3-small", input=["a", "b"]).model_dump()
    )
    deleted = client.files.delete("file-123")
    assert deleted.deleted and deleted.id == "file-123"
    assert fake_upstream.received[-1].method == "DELETE"
    response = client.responses.create(model="gpt-4o", input="Say hi")
    assert response.output_text == direct.responses.create(model="gpt-4o", input="Say hi").output_text
    events = [event.type for event in client.responses.create(model="gpt-4o", input="Say hi", stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.completed"


def test_passthrough_query_string_and_unknown_route(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    answer = httpx.get(f"{gateway_url}/models?limit=2&after=x%20y")
    assert answer.status_code == 200
    assert fake_upstream.received[-1].query == "limit=2&after=x%20y"
    missing = httpx.get(f"{gateway_url}/no/such/route")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Invalid URL (GET /v1/no/such/route)"


def test_streamed_upload_passes_through(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    payload = orjson.dumps({"model": "text-embedding-3-small", "input": "x" * 2_000_000})

    def chunks():  # type: ignore[no-untyped-def]
        for start in range(0, len(payload), 65536):
            yield payload[start : start + 65536]

    answer = httpx.post(
        f"{gateway_url}/embeddings", content=chunks(), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 200
    assert fake_upstream.received[-1].body == payload


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "JSON object"),
        (b'{"messages": []}', "model", "model"),
        (b'{"model": "gpt-4o"}', "messages", "'messages' is a required property"),
        (b'{"model": "gpt-4o", "messages": "hi"}', "messages", "expected an array"),
        (b'{"model": "gpt-4o", "messages": [42]}', "messages[0]", "expected an object"),
        (
            b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "a"}, {"content": "b"}]}',
            "messages[1].role",
            "messages[1].role",
        ),
        (
            b'{"model": "gpt-4o", "messages": [{"role": "wizard", "content": "b"}]}',
            "messages[0].role",
            "wizard",
        ),
    ],
)
def test_bad_input_gets_openai_shaped_400(
    fake_upstream: FakeUpstream, gateway_url: str, body: bytes, param: str | None, fragment: str
) -> None:
    answer = httpx.post(
        f"{gateway_url}/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert fragment in error["message"]
    assert fake_upstream.received == []  # refused before reaching the upstream


def test_bad_compression_header_is_400(gateway_url: str) -> None:
    answer = httpx.post(
        f"{gateway_url}/chat/completions",
        json={"model": "gpt-4o", "messages": MESSAGES},
        headers={"x-gateway-compression": "extreme"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "x-gateway-compression"


def test_body_over_limit_is_413(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    url = start_gateway(GATEWAY_SERVER_MAX_BODY_BYTES="1000")
    big = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 2000}]}
    answer = httpx.post(f"{url}/chat/completions", json=big)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    chunked = httpx.post(f"{url}/chat/completions", content=iter([orjson.dumps(big)]))
    assert chunked.status_code == 413
    assert fake_upstream.received == []


def test_unreachable_upstream_is_502(start_gateway: GatewayFactory) -> None:
    url = start_gateway(
        GATEWAY_UPSTREAM_BASE_URL=f"http://127.0.0.1:{free_port()}/v1",
        GATEWAY_UPSTREAM_RETRIES_MAX_ATTEMPTS="1",
    )
    with pytest.raises(openai.InternalServerError) as caught:
        _sync(url).chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert caught.value.status_code == 502
    assert caught.value.code == "upstream_unreachable"


def test_upstream_timeout_is_504(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    fake_upstream.faults = ["hang"]
    fake_upstream.hang_seconds = 5
    url = start_gateway(GATEWAY_UPSTREAM_TIMEOUTS_FIRST_BYTE="0.5")
    answer = httpx.post(f"{url}/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES}, timeout=10)
    assert answer.status_code == 504
    assert answer.json()["error"]["code"] == "upstream_timeout"


async def test_client_disconnect_closes_upstream_stream(
    fake_upstream: FakeUpstream, gateway_url: str
) -> None:
    fake_upstream.chunk_delay = 0.5
    async with (
        httpx.AsyncClient(timeout=10) as client,
        client.stream(
            "POST",
            f"{gateway_url}/chat/completions",
            json={"model": "gpt-4o", "messages": MESSAGES, "stream": True},
        ) as answer,
    ):
        async for _ in answer.aiter_bytes():
            break  # got the first bytes; now hang up
    for _ in range(40):
        if fake_upstream.cancelled_streams:
            break
        await asyncio.sleep(0.05)
    assert fake_upstream.cancelled_streams == 1
    assert fake_upstream.active_streams == 0


def test_no_key_in_logs_or_error_bodies(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "sk-proj-SECRET-do-not-log-123456"
    url = start_gateway(GATEWAY_UPSTREAM_BASE_URL=f"http://127.0.0.1:{free_port()}/v1")
    for body in (b"{broken", orjson.dumps({"model": "gpt-4o", "messages": MESSAGES})):
        answer = httpx.post(
            f"{url}/chat/completions", content=body, headers={"Authorization": f"Bearer {secret}"}
        )
        assert answer.status_code in (400, 502)
        assert secret not in answer.text
        assert "Traceback" not in answer.text
    assert secret not in caplog.text


def test_healthz_and_metrics(gateway_url: str) -> None:
    root = gateway_url.removesuffix("/v1")
    health = httpx.get(f"{root}/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    ready = httpx.get(f"{root}/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "store": "memory"}
    httpx.post(f"{gateway_url}/chat/completions", json={"model": "gpt-4o", "messages": MESSAGES})
    metrics = httpx.get(f"{root}/metrics").text
    assert 'gateway_requests_total{route="chat_completions",status="2xx"}' in metrics


async def test_stream_is_relayed_while_the_upstream_is_still_generating(
    fake_upstream: FakeUpstream, gateway_url: str
) -> None:
    """Every chunk goes on as it comes, not only the first: the client has its second content
    chunk while the upstream still has seconds of answer left to send."""
    fake_upstream.chunk_delay = 0.5
    question = "one two three four five six seven eight"
    async with httpx.AsyncClient(timeout=30) as client:
        request = client.build_request(
            "POST",
            f"{gateway_url}/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": question}], "stream": True},
        )
        answer = await client.send(request, stream=True)
        events = 0
        async for line in answer.aiter_lines():
            if line.startswith("data: {"):
                events += 1
                if events == 3:  # the role chunk, then two content chunks
                    break
        assert fake_upstream.active_streams == 1, "the upstream had already finished"
        await answer.aclose()


def test_no_key_logged_on_successful_requests(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Not on the success path either, streamed or not, with the gateway's key or the caller's."""
    caplog.set_level(logging.DEBUG)
    upstream_key = "sk-upstream-org-key-never-logged-1"
    fake_upstream.required_api_key = upstream_key
    url = start_gateway(GATEWAY_UPSTREAM_API_KEY=upstream_key)
    for stream in (False, True):
        answer = httpx.post(
            f"{url}/chat/completions",
            json={"model": "gpt-4o", "messages": MESSAGES, "stream": stream},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert answer.status_code == 200
        assert upstream_key not in answer.text
    assert upstream_key not in caplog.text and KEY not in caplog.text
