"""Fault injection: real openai SDK → real gateway → a misbehaving fake upstream, all on loopback.

Each test states what the client sees for one upstream fault, and that the upstream received
exactly what the retry policy allows: no request lost, none duplicated. The SDK never retries
(max_retries=0): every retry counted here is the gateway's.

Policy under test (gateway/proxy/upstream.py, gateway/routes/chat.py):
- connection errors, 429 (Retry-After up to a cap), 500, 502, 503, 504 are retried with
  jittered exponential backoff, bounded in attempts and in total time;
- other 4xx are relayed at once; timeouts and bodies that break after the headers are not
  retried (the upstream may be generating, and billing) and become a 502/504, or an error event
  when the stream has begun;
- a context overflow is learned from and retried once, compressed.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import uvicorn
from starlette.types import ASGIApp

from tests.conftest import GatewayFactory
from tests.fakes.serve import free_port
from tests.fakes.tokens import count_prompt
from tests.fakes.upstream import FakeUpstream, create_app
from tests.metrics import metric

KEY = "sk-test-caller-0123456789abcdef"
CHAT = "/v1/chat/completions"
QUESTION: list[Any] = [{"role": "user", "content": "Name three rivers in Europe, please, one per line."}]
ANSWER = "echo: Name three rivers in Europe, please, one per line."
# Small timeouts and backoff so every fault resolves in about a second. The fake's hangs and
# stalls last longer (3 s) than these timeouts, and a healthy fake answers far faster, so which
# side gave up is told by the answer itself (the gateway's own 504 or error event, where the fake
# would have finished), never by a wall-clock bound: the machine is shared and noisy.
FAST = {
    "GATEWAY_UPSTREAM_TIMEOUTS_IDLE": "1",
    "GATEWAY_UPSTREAM_TIMEOUTS_FIRST_BYTE": "1",
    "GATEWAY_UPSTREAM_RETRIES_BACKOFF_INITIAL": "0.01",
    "GATEWAY_UPSTREAM_RETRIES_BACKOFF_MAX": "0.05",
}
# How long a caller thread may take before the test calls it stuck (a join bound, not a claim).
NO_HANG = 20.0
REPO = Path(__file__).resolve().parents[2]


def _sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=20)


def _hits(fake: FakeUpstream) -> int:
    return fake.hits[CHAT]


def _stream_text(base_url: str, **extra: Any) -> tuple[str, str | None]:
    """Read a whole stream through the SDK: (text, finish_reason)."""
    stream: Any = _sdk(base_url).chat.completions.create(
        model="gpt-4o", messages=QUESTION, stream=True, **extra
    )
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


def _partial_stream_error(base_url: str) -> tuple[str, openai.APIError]:
    """A stream expected to break: the text received before the SDK raised, and the error."""
    text = ""
    with pytest.raises(openai.APIError) as caught:
        stream: Any = _sdk(base_url).chat.completions.create(model="gpt-4o", messages=QUESTION, stream=True)
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
    return text, caught.value


def _wait_for(predicate: Any, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


# --- connection refused ---------------------------------------------------------------------


@contextmanager
def _serve_on(sock: socket.socket, app: ASGIApp) -> Iterator[None]:
    """Serve `app` on an already bound socket; asyncio calls listen() on it only now."""
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert _wait_for(lambda: server.started, 10)
        yield
    finally:
        server.should_exit = True
        thread.join(10)


def test_refused_connection_is_502_after_bounded_attempts(start_gateway: GatewayFactory) -> None:
    url = start_gateway(
        **FAST,
        GATEWAY_UPSTREAM_BASE_URL=f"http://127.0.0.1:{free_port()}/v1",
        GATEWAY_UPSTREAM_RETRIES_MAX_ATTEMPTS="4",
    )
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert caught.value.status_code == 502
    assert caught.value.code == "upstream_unreachable"


def test_refused_then_listening_is_retried_until_it_answers(start_gateway: GatewayFactory) -> None:
    # Bound but not listening: connections are refused until the server starts on it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    url = start_gateway(
        GATEWAY_UPSTREAM_BASE_URL=f"http://127.0.0.1:{port}/v1",
        GATEWAY_UPSTREAM_RETRIES_MAX_ATTEMPTS="50",
        GATEWAY_UPSTREAM_RETRIES_BACKOFF_INITIAL="0.05",
        GATEWAY_UPSTREAM_RETRIES_BACKOFF_MAX="0.1",
    )
    retries_before = metric(url, "gateway_upstream_retries_total")
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["answer"] = _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
        except Exception as exc:  # reported by the assertion below
            result["error"] = exc

    caller = threading.Thread(target=call)
    caller.start()
    # The gateway's first attempt is immediate once it holds the request; wait until it does,
    # however slow the machine, then long enough for several backed-off attempts to be refused.
    deadline = time.monotonic() + NO_HANG
    while metric(url, "gateway_requests_in_flight") < 1:  # scrapes are not counted
        assert time.monotonic() < deadline, "the request never reached the gateway"
        time.sleep(0.02)
    time.sleep(0.4)
    late = FakeUpstream()
    with _serve_on(sock, create_app(late)):
        caller.join(NO_HANG)
        assert not caller.is_alive(), "the gateway kept the client waiting"
    assert "error" not in result, result
    assert result["answer"].choices[0].message.content == "echo: " + QUESTION[0]["content"]
    assert late.hits[CHAT] == 1  # refused attempts never arrived; the one that did is not repeated
    assert metric(url, "gateway_upstream_retries_total") - retries_before >= 1


def test_connect_timeout_is_retried_then_504(start_gateway: GatewayFactory) -> None:
    # A listener whose accept queue is full: the kernel drops further SYNs, connect() hangs.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        while True:
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            fillers.append(filler)
            filler.settimeout(0.2)
            try:
                filler.connect(("127.0.0.1", port))
            except TimeoutError:
                break
        url = start_gateway(
            **FAST,
            GATEWAY_UPSTREAM_BASE_URL=f"http://127.0.0.1:{port}/v1",
            GATEWAY_UPSTREAM_TIMEOUTS_CONNECT="0.3",
            GATEWAY_UPSTREAM_RETRIES_MAX_ATTEMPTS="3",
        )
        started = time.monotonic()
        with pytest.raises(openai.InternalServerError) as caught:
            _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
        elapsed = time.monotonic() - started
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"
    assert "0.3 s" in caught.value.message
    # Three connect attempts of 0.3 s each (a connection never made is safe to retry), then 504.
    assert elapsed >= 0.85  # a lower bound: a loaded machine only makes it longer


# --- retryable statuses ---------------------------------------------------------------------


@pytest.mark.parametrize("status", ["500", "502", "503"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_server_error_once_then_success(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, status: str, stream: bool
) -> None:
    fake_upstream.faults = [status]
    url = start_gateway(**FAST)
    if stream:
        assert _stream_text(url) == (ANSWER, "stop")
    else:
        completion = _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
        assert completion.choices[0].message.content == ANSWER
    assert _hits(fake_upstream) == 2
    first, second = fake_upstream.requests_to(CHAT)
    assert first.body == second.body  # the same request, resent once


def test_server_error_every_time_relays_the_last_after_max_attempts(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.faults = ["503"] * 10
    url = start_gateway(**FAST, GATEWAY_UPSTREAM_RETRIES_MAX_ATTEMPTS="3")
    retries_before = metric(url, "gateway_upstream_retries_total")
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert caught.value.status_code == 503
    assert metric(url, "gateway_upstream_retries_total") - retries_before == 2
    assert caught.value.body == {  # the upstream's own error, relayed
        "message": "The server is overloaded or not ready yet.",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert _hits(fake_upstream) == 3


def test_retries_stop_at_the_total_time_bound(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.faults = ["503"] * 50
    url = start_gateway(
        GATEWAY_UPSTREAM_RETRIES_MAX_ATTEMPTS="50",
        GATEWAY_UPSTREAM_RETRIES_MAX_TOTAL_SECONDS="0.5",
        GATEWAY_UPSTREAM_RETRIES_BACKOFF_INITIAL="0.1",
        GATEWAY_UPSTREAM_RETRIES_BACKOFF_MAX="1",
    )
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert caught.value.status_code == 503
    # Exponential backoff with full jitter (means 0.05, 0.1, 0.2, 0.4 … s) runs out of the
    # 0.5 s well before 50 attempts; no sleep is started that would end past the bound.
    assert 2 <= _hits(fake_upstream) < 15


def test_429_waits_retry_after_then_succeeds(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.faults = ["429"]
    fake_upstream.retry_after = 0.3
    url = start_gateway(**FAST)
    completion = _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert completion.choices[0].message.content == ANSWER
    first, second = fake_upstream.requests_to(CHAT)
    assert second.time - first.time >= 0.25  # Retry-After honoured, not the 0.01 s backoff


def test_429_with_retry_after_beyond_the_cap_goes_to_the_client(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.faults = ["429"]
    fake_upstream.retry_after = 30
    url = start_gateway(**FAST, GATEWAY_UPSTREAM_RETRIES_RETRY_AFTER_CAP="1")
    retries_before = metric(url, "gateway_upstream_retries_total")
    with pytest.raises(openai.RateLimitError) as caught:
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.response.headers["retry-after"] == "30"  # the client can wait it out itself
    assert caught.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert _hits(fake_upstream) == 1
    assert metric(url, "gateway_upstream_retries_total") == retries_before  # none was made


def test_retry_after_counts_against_the_total_time_bound(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.faults = ["429"] * 10
    fake_upstream.retry_after = 0.2
    url = start_gateway(
        **FAST, GATEWAY_UPSTREAM_RETRIES_MAX_ATTEMPTS="10", GATEWAY_UPSTREAM_RETRIES_MAX_TOTAL_SECONDS="0.5"
    )
    with pytest.raises(openai.RateLimitError):
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    # Attempts at ~0, ~0.2, ~0.4 s; a third wait would end past 0.5 s.
    assert 2 <= _hits(fake_upstream) <= 4


# --- never retried --------------------------------------------------------------------------


def test_other_4xx_are_relayed_without_retry(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.required_api_key = "sk-the-right-one-0000"
    url = start_gateway(**FAST)
    with pytest.raises(openai.AuthenticationError):
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert _hits(fake_upstream) == 1
    fake_upstream.required_api_key = None
    missing = httpx.get(f"{url}/models/no-such-model")
    assert missing.status_code == 404
    assert fake_upstream.hits["/v1/models/no-such-model"] == 1


def test_overflow_with_compression_off_is_relayed_without_retry(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway(**FAST)
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(url).chat.completions.create(
            model="gpt-4o",
            messages=_conversation(4),
            extra_headers={"x-fake-fault": "overflow", "x-gateway-compression": "off"},
        )
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length" in caught.value.message  # the upstream's own words
    assert _hits(fake_upstream) == 1


# --- timeouts and broken bodies -------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_hang_before_first_byte_is_504_and_not_retried(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, stream: bool
) -> None:
    fake_upstream.faults = ["hang"]
    fake_upstream.hang_seconds = 3
    url = start_gateway(**FAST)
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION, stream=stream)
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"
    assert _hits(fake_upstream) == 1
    # The gateway hung up: the fake sees its client leave before the hang ends.
    assert _wait_for(lambda: fake_upstream.cancelled_requests + fake_upstream.cancelled_streams == 1)


def test_total_timeout_bounds_the_wait_for_headers(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.faults = ["hang"]
    fake_upstream.hang_seconds = 3
    url = start_gateway(GATEWAY_UPSTREAM_TIMEOUTS_TOTAL="0.5")  # first_byte stays at its 600 s default
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"
    assert _hits(fake_upstream) == 1


@pytest.mark.parametrize("fault", ["reset", "half_stream"])
def test_json_body_broken_midway_is_502_and_not_retried(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, fault: str
) -> None:
    fake_upstream.faults = [fault]
    url = start_gateway(**FAST)
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert caught.value.status_code == 502
    assert caught.value.code == "upstream_broken"
    assert _hits(fake_upstream) == 1  # the answer was generated once: not asked for twice
    assert "Traceback" not in caught.value.response.text


def test_json_body_stalled_midway_is_504(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    fake_upstream.faults = ["stall"]
    fake_upstream.hang_seconds = 3
    url = start_gateway(**FAST)
    with pytest.raises(openai.InternalServerError) as caught:
        _sdk(url).chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"
    assert _hits(fake_upstream) == 1


@pytest.mark.parametrize("fault", ["reset", "half_stream"])
def test_stream_broken_midway_ends_with_an_error_event(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, fault: str
) -> None:
    fake_upstream.faults = [fault]
    url = start_gateway(**FAST)
    text, error = _partial_stream_error(url)
    # The first half reached the client as it came; then an error, not a silent truncation.
    assert text and ANSWER.startswith(text) and text != ANSWER
    assert error.code == "upstream_broken"
    assert _hits(fake_upstream) == 1  # bytes were relayed: never retried


def test_stream_stalled_midway_ends_with_an_error_event_and_closes_upstream(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.faults = ["stall"]
    fake_upstream.hang_seconds = 3
    url = start_gateway(**FAST)
    text, error = _partial_stream_error(url)
    assert text and ANSWER.startswith(text) and text != ANSWER
    assert error.code == "upstream_idle_timeout"
    assert _hits(fake_upstream) == 1
    assert _wait_for(lambda: fake_upstream.cancelled_streams == 1 and fake_upstream.active_streams == 0)


@pytest.mark.parametrize(
    ("fault", "code"),
    [("reset", "upstream_broken"), ("half_stream", "upstream_broken"), ("stall", "upstream_idle_timeout")],
)
def test_broken_stream_is_closed_cleanly_on_the_wire(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, fault: str, code: str
) -> None:
    fake_upstream.faults = [fault]
    fake_upstream.hang_seconds = 3
    url = start_gateway(**FAST)
    # httpx raises on a chunked body cut short: reading to the end proves a clean close.
    answer = httpx.post(
        f"{url}/chat/completions", json={"model": "gpt-4o", "messages": QUESTION, "stream": True}, timeout=10
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [event for event in answer.text.split("\n\n") if event]
    assert events[0].startswith('data: {"id"') and b"[DONE]" not in answer.content
    last = orjson.loads(events[-1].removeprefix("data: "))
    assert set(last["error"]) == {"message", "type", "param", "code"}
    assert last["error"]["code"] == code and last["error"]["type"] == "server_error"


def test_stream_running_past_the_total_timeout_is_cut_with_an_error_event(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.chunk_delay = 0.2  # steady chunks, never idle for the 1 s idle timeout
    url = start_gateway(**FAST, GATEWAY_UPSTREAM_TIMEOUTS_TOTAL="1")
    text, error = _partial_stream_error(url)
    assert text and text != ANSWER
    assert error.code == "upstream_idle_timeout"
    assert "total time limit" in error.message
    assert _wait_for(lambda: fake_upstream.active_streams == 0)


# --- context overflow -----------------------------------------------------------------------

WINDOW = 1500
MAX_TOKENS = 100


def _conversation(turns: int, *, words: int = 60) -> list[Any]:
    """A system prompt, `turns` old exchanges (~250 tokens per message) and a new question."""
    messages = [{"role": "system", "content": "You are a careful assistant."}]
    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"Q{turn}: " + " ".join(f"q{turn}w{j}" for j in range(words))}
        )
        messages.append(
            {"role": "assistant", "content": f"A{turn}: " + " ".join(f"a{turn}w{j}" for j in range(words))}
        )
    messages.append({"role": "user", "content": f"After {turns} exchanges: what did I ask first?"})
    return messages


def _create_raw(
    url: str, model: str, messages: list[Any], *, stream: bool, **extra: Any
) -> tuple[httpx.Headers, str]:
    """Headers and answer text of a chat completion, through the SDK's raw-response API."""
    raw = _sdk(url).chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        max_tokens=MAX_TOKENS,
        stream=stream,
        **extra,
    )
    parsed: Any = raw.parse()
    if not stream:
        return raw.headers, parsed.choices[0].message.content or ""
    text = "".join(chunk.choices[0].delta.content or "" for chunk in parsed if chunk.choices)
    return raw.headers, text


@pytest.mark.parametrize("model", ["my-local-llm", "gpt-4o"], ids=["unknown-window", "known-window"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_overflow_is_learned_retried_compressed_and_not_repeated(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, model: str, stream: bool
) -> None:
    fake_upstream.window = WINDOW  # the fake enforces a real window, smaller than the gateway thinks
    url = start_gateway(**FAST)
    messages = _conversation(6)
    assert count_prompt({"messages": messages}) + MAX_TOKENS > WINDOW

    headers, text = _create_raw(url, model, messages, stream=stream)
    assert text == "echo: " + messages[-1]["content"]
    assert headers["x-gateway-retry"] == "overflow"
    assert headers["x-gateway-compression"] != "none"
    first, second = fake_upstream.requests_to(CHAT)
    assert first.json["messages"] == messages  # the first try was the client's request as sent
    assert count_prompt(second.json) < count_prompt(first.json)
    assert count_prompt(second.json) + MAX_TOKENS <= WINDOW
    assert second.json["messages"][0] == messages[0] and second.json["messages"][-1] == messages[-1]

    # The stated window was learned: the next, longer turn is compressed before it is sent.
    longer = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": "And then?"}]
    headers, text = _create_raw(url, model, longer, stream=stream)
    assert text == "echo: And then?"
    assert "x-gateway-retry" not in headers
    assert headers["x-gateway-compression"] != "none"
    assert _hits(fake_upstream) == 3  # first try, its retry, then one request only


def test_overflow_fault_once_then_success(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    # No window on the fake: the overflow states "prompt - 1 tokens" once, then anything fits.
    fake_upstream.faults = ["overflow"]
    url = start_gateway(**FAST)
    messages = _conversation(6)
    headers, text = _create_raw(url, "my-local-llm", messages, stream=False)
    assert headers["x-gateway-retry"] == "overflow"
    assert text == "echo: " + messages[-1]["content"]
    first, second = fake_upstream.requests_to(CHAT)
    assert len(second.body) < len(first.body)
    assert count_prompt(second.json) < count_prompt(first.json)


@pytest.mark.parametrize("model", ["my-local-llm", "gpt-4o"], ids=["unknown-window", "known-window"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_always_overflow_is_400_after_exactly_one_retry(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, model: str, stream: bool
) -> None:
    url = start_gateway(**FAST)
    with pytest.raises(openai.BadRequestError) as caught:
        _sdk(url).chat.completions.create(
            model=model,
            messages=_conversation(6),
            max_tokens=MAX_TOKENS,
            stream=stream,
            extra_headers={"x-fake-fault": "overflow"},  # every request, the retry included
        )
    error = caught.value
    assert error.status_code == 400
    assert error.code == "context_length_exceeded"
    assert error.param == "messages"
    # The message says what the gateway tried, with numbers.
    assert "twice" in error.message and "compressing" in error.message
    assert re.search(r"first with \d+ tokens .* then after compressing to \d+ tokens", error.message)
    assert error.response.headers["x-gateway-retry"] == "overflow"
    assert _hits(fake_upstream) == 2
    first, second = fake_upstream.requests_to(CHAT)
    assert count_prompt(second.json) < count_prompt(first.json)


# --- many clients, a third failing, gateway in its own process ------------------------------

CLIENTS = 100
# Faults for the failing third: retried statuses, broken and stalled streams, a hang.
FAULT_CYCLE = ("503", "reset", "500", "half_stream", "429", "stall", "502", "hang")
RETRIED = {"503", "500", "502", "429"}
MAX_ATTEMPTS = 3
BURST_FIRST_BYTE = 2.0
BURST_IDLE = 1.0
SETTLE = 0.5


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextmanager
def _gateway_process(upstream_base_url: str, tmp_path: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    env = {
        **os.environ,
        **FAST,
        # Looser than FAST: 100 streams share one fake whose thread competes with the clients' loop.
        "GATEWAY_UPSTREAM_TIMEOUTS_FIRST_BYTE": str(BURST_FIRST_BYTE),
        "GATEWAY_UPSTREAM_TIMEOUTS_IDLE": str(BURST_IDLE),
        "GATEWAY_UPSTREAM_BASE_URL": upstream_base_url,
        "GATEWAY_UPSTREAM_RETRIES_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        "GATEWAY_UPSTREAM_TIMEOUTS_TOTAL": "10",
        "GATEWAY_SERVER_LOG_LEVEL": "warning",
    }
    log = (tmp_path / "gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"gateway exited: {(tmp_path / 'gateway.log').read_text()}")
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert _wait_for(ready, 30), "gateway did not start"
        yield f"{url}/v1", process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


async def _burst(client: openai.AsyncOpenAI, tag: str) -> dict[str, str]:
    """CLIENTS concurrent streams, every third one asking the fake for a fault: outcome per client."""

    async def one(index: int) -> str:
        fault = FAULT_CYCLE[(index // 3) % len(FAULT_CYCLE)] if index % 3 == 0 else None
        headers = {"x-client": f"{tag}-{index}"}
        if fault:
            headers["x-fake-fault"] = fault
        question = f"Client {tag}-{index} asks for a short answer about rivers."
        text = ""
        try:
            stream = await client.chat.completions.create(
                model="gpt-4o",
                messages=[{"role": "user", "content": question}],
                stream=True,
                extra_headers=headers,
            )
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
        except openai.APIError as exc:
            assert fault is not None, f"client {index} failed without a fault: {exc!r}"
            return f"error:{fault}"
        assert fault is None, f"client {index} got an answer despite fault {fault}"
        assert text == "echo: " + question
        return "ok"

    async def bounded(index: int) -> str:
        try:
            return await asyncio.wait_for(one(index), 20)
        except TimeoutError:
            return "hung"

    outcomes = await asyncio.gather(*(bounded(i) for i in range(CLIENTS)))
    return {f"{tag}-{i}": outcome for i, outcome in enumerate(outcomes)}


def _check_upstream_counts(fake: FakeUpstream, tag: str, outcomes: dict[str, str]) -> None:
    seen = Counter(r.headers.get("x-client") for r in fake.requests_to(CHAT))
    for client, outcome in outcomes.items():
        fault = outcome.removeprefix("error:") if outcome != "ok" else None
        expected = MAX_ATTEMPTS if fault in RETRIED else 1
        assert seen[client] == expected, f"{client} ({outcome}) reached the upstream {seen[client]} times"


async def test_hundred_streams_with_a_third_failing_neither_hang_nor_leak(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    fake_upstream.hang_seconds = BURST_FIRST_BYTE + 1  # past the gateway's first-byte and idle timeouts
    fake_upstream.retry_after = 0.05
    fake_upstream.chunk_delay = 0.005
    with _gateway_process(fake_upstream.base_url, tmp_path) as (url, pid):
        client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=30)
        try:
            await _burst(client, "warm-up")  # allocator arenas, pools, caches: sized once
            await asyncio.sleep(SETTLE)
            baseline_rss, baseline_fds = _rss_kb(pid), _open_fds(pid)

            rss: list[int] = []
            fds: list[int] = []
            for tag in ("burst-1", "burst-2"):
                fake_upstream.received.clear()
                outcomes = await _burst(client, tag)
                counts = Counter(outcomes.values())
                assert counts["hung"] == 0, counts
                assert counts["ok"] == CLIENTS - (CLIENTS + 2) // 3
                _check_upstream_counts(fake_upstream, tag, outcomes)
                await asyncio.sleep(SETTLE)  # let closed connections and finished tasks settle
                assert fake_upstream.active_streams == 0  # every upstream stream ended or was closed
                rss.append(_rss_kb(pid))
                fds.append(_open_fds(pid))
        finally:
            await client.close()
    growth_mb = [(value - baseline_rss) / 1024 for value in rss]
    print(f"gateway RSS baseline {baseline_rss / 1024:.1f} MB, growth per burst (MB): {growth_mb}")
    print(f"gateway open fds baseline {baseline_fds}, after each burst: {fds}")
    assert max(growth_mb) < 30
    # A second identical burst does not grow it further: what the first allocated is reused.
    assert (rss[1] - rss[0]) / 1024 < 8
    # Sockets: pooled keep-alive connections come and go, but are bounded; none accumulate.
    assert max(fds) < baseline_fds + CLIENTS
    assert fds[1] <= fds[0] + 20
