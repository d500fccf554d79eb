"""Hostile and malformed chat bodies through the real server: a 400 naming the field, never a 5xx,
never an upstream call for a body the gateway refuses, never a traceback or a reset connection."""

from __future__ import annotations

import gzip
import logging
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream

OK_MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]


def _body(**fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": OK_MESSAGES, **fields}


# Deeper than any JSON encoder here writes: spliced into the body's bytes in place of a marker.
DEEP = {
    "@tool_result_500": b'{"type":"tool_result","tool_use_id":"t1","content":[' * 500
    + b'{"type":"text","text":"x"}'
    + b"]}" * 500,
    "@list_600": b"[" * 600 + b"1" + b"]" * 600,
}


def _raw(body: dict[str, Any]) -> bytes:
    raw = orjson.dumps(body)
    for marker, value in DEEP.items():
        raw = raw.replace(orjson.dumps(marker), value)
    return raw


MALFORMED: list[tuple[str, Any, str | None]] = [
    ("role as a list", {"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
    ("role as an object", {"messages": [{"role": {"r": 1}, "content": "x"}]}, "messages[0].role"),
    ("content as an object", {"messages": [{"role": "user", "content": {"a": 1}}]}, "messages[0].content"),
    ("content as a number", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("part not an object", {"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]"),
    (
        "part type missing",
        {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
        "messages[0].content[0].type",
    ),
    (
        "text part with a list",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": ["x"]}]}]},
        "messages[0].content[0].text",
    ),
    (
        "image_url as a number",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": 3}]}]},
        "messages[0].content[0].image_url",
    ),
    (
        "tool_use input as a string",
        {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": "x"}]}]},
        "messages[0].content[0].input",
    ),
    (
        "tool_calls as an object",
        {"messages": [{"role": "assistant", "content": None, "tool_calls": {"id": "c"}}]},
        "messages[0].tool_calls",
    ),
    (
        "tool call without id",
        {"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}]},
        "messages[0].tool_calls[0].id",
    ),
    (
        "arguments as a number",
        {
            "messages": [
                {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 1}}]}
            ]
        },
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        "tool without tool_call_id",
        {"messages": [{"role": "tool", "content": "x"}]},
        "messages[0].tool_call_id",
    ),
    ("name as a number", {"messages": [{"role": "user", "content": "x", "name": 7}]}, "messages[0].name"),
    ("max_tokens negative", {"max_tokens": -1}, "max_tokens"),
    ("max_tokens as a string", {"max_tokens": "100"}, "max_tokens"),
    ("max_completion_tokens as a boolean", {"max_completion_tokens": True}, "max_completion_tokens"),
    ("stream as a string", {"stream": "yes"}, "stream"),
    ("stream_options as a list", {"stream_options": [1]}, "stream_options"),
    ("tools as an object", {"tools": {"type": "function"}}, "tools"),
    ("tool not an object", {"tools": ["get_weather"]}, "tools[0]"),
    ("response_format as a string", {"response_format": "json"}, "response_format"),
    ("model too long", {"model": "a/" * 10_000}, "model"),
    ("model with CR/LF", {"model": "gpt-4o\r\nINFO forged log line"}, "model"),
    ("model as a number", {"model": 4}, "model"),
    (
        "tool_result nested 500 levels",
        {"messages": [{"role": "user", "content": ["@tool_result_500"]}]},
        "messages[0].content[0].content[0].content[0].content[0].content[0].content",
    ),
    ("a value nested 600 levels", {"metadata": {"deep": "@list_600"}}, None),
]


@pytest.mark.parametrize(("case", "fields", "param"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_field_answers_400_naming_it_before_any_upstream_call(
    fake_upstream: FakeUpstream, gateway_url: str, case: str, fields: Any, param: str | None
) -> None:
    answer = httpx.post(f"{gateway_url}/chat/completions", content=_raw(_body(**fields)))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "Traceback" not in answer.text
    assert answer.headers["x-gateway-request-id"]
    assert fake_upstream.received == []  # refused before anything was sent (or billed)


def test_connection_stays_usable_after_an_error(gateway_url: str) -> None:
    """A refused request must not leave the keep-alive connection broken for the next one."""
    with httpx.Client() as client:
        bad = client.post(f"{gateway_url}/chat/completions", json=_body(messages=[{"role": ["x"]}]))
        good = client.post(f"{gateway_url}/chat/completions", json=_body())
    assert (bad.status_code, good.status_code) == (400, 200)


def test_unexpected_failure_is_a_clean_500_with_one_log_line(
    gateway_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug on the request path (simulated: the planner raises) answers an OpenAI-shaped 500,
    closes the connection, and logs one line with the request id — no traceback, no secret."""
    secret = "sk-secret-in-the-exception-0000"

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"bug while holding {secret}")

    monkeypatch.setattr("gateway.routes.prompt.plan_request", broken)
    caplog.set_level(logging.DEBUG)
    with httpx.Client() as client:
        answer = client.post(
            f"{gateway_url}/chat/completions",
            json=_body(),
            headers={"Authorization": f"Bearer {secret}", "x-request-id": "req-bug-1"},
        )
        assert answer.status_code == 500
        assert answer.json()["error"]["type"] == "server_error"
        assert answer.headers["connection"] == "close"
        assert answer.headers["x-gateway-request-id"] == "req-bug-1"
        monkeypatch.undo()
        # The client's next request opens a new connection and is served.
        assert client.post(f"{gateway_url}/chat/completions", json=_body()).status_code == 200
    records = [r for r in caplog.records if r.name == "gateway" and r.levelno >= logging.ERROR]
    assert len(records) == 1 and "req-bug-1" in records[0].getMessage()
    assert records[0].exc_info is None and "Traceback" not in caplog.text
    assert secret not in caplog.text and secret not in answer.text


def test_an_unexpected_failure_on_the_messages_route_answers_in_anthropics_shape(
    gateway_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anthropic's SDKs read Anthropic's error shape; the last-resort 500 was OpenAI's on every route."""

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("gateway.routes.prompt.plan_request", broken)
    body = {"model": "claude-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(f"{gateway_url}/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert answer.status_code == 500
    assert answer.json() == {
        "type": "error",
        "error": {"type": "api_error", "message": "The gateway failed to handle this request."},
    }


# --- fuzzing the JSON surface ---------------------------------------------------------------

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=16,
)


def maybe(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a well-formed value, sometimes any JSON value in its place."""
    return st.one_of(good, good, good, json_values)


texts = st.text(max_size=300) | st.sampled_from(["", "日本語のテキスト" * 40, "line\n" * 200, "\x00\x1b[31m"])
ids = st.sampled_from(["call_1", "call_2", "toolu_1"]) | st.text(max_size=8)
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": maybe(texts)}),
    st.fixed_dictionaries(
        {
            "type": st.just("image_url"),
            "image_url": maybe(
                st.fixed_dictionaries({"url": maybe(st.just("data:image/png;base64,iVBORw0K"))})
            ),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": maybe(ids), "name": maybe(texts), "input": json_values}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_result"),
            "tool_use_id": maybe(ids),
            "content": maybe(
                texts | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}))
            ),
        }
    ),
    st.fixed_dictionaries(
        {"type": maybe(st.sampled_from(["thinking", "input_audio", "file", "document", "x"]))}
    ),
    json_values,
)
tool_calls = st.fixed_dictionaries(
    {
        "id": maybe(ids),
        "type": st.just("function"),
        "function": maybe(st.fixed_dictionaries({"name": maybe(texts), "arguments": maybe(texts)})),
    }
)
messages = st.fixed_dictionaries(
    {
        "role": maybe(st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])),
        "content": maybe(texts | st.none() | st.lists(parts, max_size=3)),
    },
    optional={
        "tool_calls": maybe(st.lists(tool_calls, max_size=2)),
        "tool_call_id": maybe(ids),
        "name": maybe(texts),
        "reasoning_content": maybe(texts),
    },
)
tools = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": maybe(
            st.fixed_dictionaries(
                {"name": maybe(texts), "description": maybe(texts), "parameters": maybe(json_values)}
            )
        ),
    }
)
bodies = st.fixed_dictionaries(
    {
        # Small windows (see the fixture) so most bodies also go through the compression engine.
        "model": maybe(st.sampled_from(["gpt-4o", "claude-3-5-sonnet-20241022", "tiny-local", "unknown-x"])),
        "messages": maybe(st.lists(messages, max_size=8)),
    },
    optional={
        "stream": maybe(st.booleans()),
        "max_tokens": maybe(st.integers(0, 5000)),
        "tools": maybe(st.lists(tools, max_size=2)),
        "response_format": maybe(
            st.just({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}})
        ),
        "stream_options": maybe(st.just({"include_usage": True})),
    },
)
compression_headers = st.sampled_from(["auto", "off", "aggressive"]) | st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=12
)


@pytest.fixture
def fuzz_client(start_gateway: GatewayFactory) -> Iterator[tuple[httpx.Client, str]]:
    url = start_gateway(
        GATEWAY_MODELS='{"gpt-4o": {"context_window": 700}, "tiny-local": {"context_window": 400}, '
        '"claude-3-5-sonnet-20241022": {"context_window": 900}}'
    )
    with httpx.Client(timeout=30) as client:
        yield client, url


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies, mode=compression_headers)
def test_no_body_makes_the_gateway_fail(
    fuzz_client: tuple[httpx.Client, str], body: dict[str, Any], mode: str
) -> None:
    client, url = fuzz_client
    answer = client.post(
        f"{url}/chat/completions", content=orjson.dumps(body), headers={"x-gateway-compression": mode}
    )
    assert answer.status_code < 500, answer.text
    assert "Traceback" not in answer.text
    assert answer.headers["x-gateway-request-id"]
    if answer.status_code >= 400:
        error = answer.json()["error"]
        assert error["message"] and error["type"]


def test_invented_model_names_share_one_metric_label(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    """Label values are forever: names nobody configured are one bucket, known ones keep theirs."""
    root = gateway_url.removesuffix("/v1")
    long_prompt = [{"role": "user", "content": "word " * 8000}]
    invented = [f"invented-model-{i}-{'x' * 200}" for i in range(20)]
    for model in [*invented, "gpt-4o"]:
        answer = httpx.post(
            f"{gateway_url}/chat/completions",
            json={"model": model, "messages": long_prompt},
            headers={"x-fake-fault": "truncate"},
        )
        assert answer.status_code == 200 and "x-gateway-upstream-truncated" in answer.headers
    metrics = httpx.get(f"{root}/metrics").text
    assert 'gateway_upstream_silent_truncations_total{model="other"}' in metrics
    assert 'gateway_upstream_silent_truncations_total{model="gpt-4o"}' in metrics
    assert "invented-model" not in metrics


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/chat/completions", gzip.compress(_raw(_body())), [("content-encoding", "gzip")]),
        ("/chat/completions", _raw(_body()), [("content-encoding", "gzip")]),
        ("/responses", _raw({"model": "gpt-4o", "input": "hi"}), [("content-encoding", "br")]),
        # Only the first line was read: the second went upstream, which failed to unzip plain JSON.
        (
            "/chat/completions",
            _raw(_body()),
            [("content-encoding", "identity"), ("content-encoding", "gzip")],
        ),
    ],
    ids=["gzip-body", "plain-body-labelled-gzip", "responses-br", "gzip-on-a-second-line"],
)
def test_prompt_bodies_must_arrive_uncompressed(
    fake_upstream: FakeUpstream, gateway_url: str, path: str, body: bytes, headers: list[tuple[str, str]]
) -> None:
    """The gateway reads and may rewrite a prompt body: a compressed one is refused naming the
    header, never misread as bad JSON nor forwarded under a label that no longer holds."""
    sent = [("content-type", "application/json"), *headers]
    answer = httpx.post(gateway_url + path, content=body, headers=sent, timeout=30)
    assert answer.status_code == 415
    assert answer.json()["error"]["param"] == "content-encoding"
    assert fake_upstream.received == []
    plain = httpx.post(
        gateway_url + "/chat/completions", content=_raw(_body()), headers={"content-encoding": "identity"}
    )
    assert plain.status_code == 200


def test_a_transfer_coding_other_than_chunked_is_refused(
    fake_upstream: FakeUpstream, gateway_url: str
) -> None:
    body = gzip.compress(_raw(_body()))
    host, port = gateway_url.removeprefix("http://").removesuffix("/v1").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: gzip, chunked\r\nconnection: close\r\n\r\n"
            + b"%x\r\n" % len(body)
            + body
            + b"\r\n0\r\n\r\n"
        )
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    head, _, answer = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 501 ")
    assert orjson.loads(answer)["error"]["param"] == "transfer-encoding"
    assert fake_upstream.received == []


def test_json_text_deeper_than_orjson_writes_is_compressed_not_a_500(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """A tool output holding JSON nested 300 deep: orjson reads it, cannot write it back."""
    url = start_gateway(GATEWAY_MODELS=orjson.dumps({"gpt-4o": {"context_window": 3_000}}).decode())
    deep = "[" * 300 + ",".join(['"word"'] * 3000) + "]" * 300
    call = {"id": "c1", "type": "function", "function": {"name": "q", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": deep},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "next question"},
    ]
    answer = httpx.post(url + "/chat/completions", json={"model": "gpt-4o", "messages": messages}, timeout=30)
    assert answer.status_code == 200
    assert answer.headers["x-gateway-compression"] != "none"
