"""Teams through real gateways, a real Redis and the real openai SDK: keys, limits shared by two
replicas, the 429 shapes and headers, exact stream accounting, the team cap, usage records."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.cli import main
from gateway.policy.keys import hash_key
from gateway.policy.limits import DAY_SECONDS, RedisLimits, Usage, usage_key
from tests.conftest import GatewayFactory
from tests.fakes.serve import serve_in_thread
from tests.fakes.upstream import FakeUpstream
from tests.metrics import metric

KEY = "cgw-research-key-0001"
OTHER_KEY = "cgw-other-team-key-0002"
UPSTREAM_KEY = "sk-team-upstream-9999"
HELLO = [{"role": "user", "content": "hello"}]


def team_name() -> str:
    # A fresh team per test: its Redis keys (hash tag {team:NAME}) never meet another test's.
    return "t" + uuid.uuid4().hex[:10]


def start_team_gateway(
    start_gateway: GatewayFactory,
    redis_url: str | None,
    team: str,
    discovery: bool = False,
    **team_settings: Any,
) -> str:
    teams = {
        team: {"keys": [hash_key(KEY)], "upstream_api_key": UPSTREAM_KEY, **team_settings},
        team + "-other": {"keys": [hash_key(OTHER_KEY)]},
    }
    # A generous bound: these tests are about shared limits, not a loaded machine's Redis latency
    # (the failure tests below set their own).
    env = {"GATEWAY_TEAMS": json.dumps(teams), "GATEWAY_POLICY_STORE_TIMEOUT": "2"}
    # Window discovery (GET /v1/models upstream) is off unless asked: tests count upstream requests.
    env["GATEWAY_WINDOWS_DISCOVERY"] = str(discovery).lower()
    if redis_url:
        env["GATEWAY_REDIS_URL"] = redis_url
    return start_gateway(**env)


def client(url: str, key: str = KEY, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=retries)


def redis_day(redis_url: str) -> int:
    seconds, _ = redis.Redis.from_url(redis_url).time()
    return int(seconds) // 86400


def recorded_usage(redis_url: str, team: str) -> dict[str, Usage]:
    async def read() -> dict[str, Usage]:
        limits = RedisLimits(redis_url, timeout=2.0)
        try:
            return await limits.usage(team, redis_day(redis_url))
        finally:
            await limits.close()

    return asyncio.run(read())


def wait_for(predicate: Any, timeout: float = 15.0) -> None:
    """Settlement runs after the answer: poll for it instead of sleeping a guessed time."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


# --- keys --------------------------------------------------------------------------------------


def test_unknown_or_missing_key_is_401_and_never_quoted(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_team_gateway(start_gateway, None, team_name())
    with pytest.raises(openai.AuthenticationError) as failure:
        client(url, key="cgw-wrong-key-abcdef").chat.completions.create(model="gpt-4o", messages=HELLO)
    assert failure.value.code == "invalid_api_key"
    assert "abcdef" not in failure.value.response.text
    for path, method in (("/models", "GET"), ("/embeddings", "POST"), ("/chat/completions", "POST")):
        answer = httpx.request(method, url + path, json={"model": "m", "input": "x"})
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
    assert fake_upstream.received == []  # nothing unauthenticated reached the upstream


@pytest.mark.parametrize(
    "value",
    [
        b"Bearer " + b"k" * 60_000,
        b"Bearer \x01\x02\x1b[31mred",
        b"Bearer \xff\xfe\xc3\x28",
        b"Basic " + KEY.encode(),
        b"Bearer",
        b"Bearer " + KEY.encode() + b"\t",
        KEY.encode(),
    ],
)
def test_hostile_authorization_headers_are_refused_cleanly(
    start_gateway: GatewayFactory, value: bytes
) -> None:
    url = start_team_gateway(start_gateway, None, team_name())
    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    body = b'{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: " + value + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n"
        b"Connection: close\r\n\r\n" + body
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    # A trailing tab is stripped by the HTTP parser: that key is the real one.
    expected = 200 if value.endswith(b"\t") else 401
    assert status in (expected, 400, 431), reply[:300]
    assert b"Traceback" not in reply and b"k" * 100 not in reply and b"\x1b" not in reply


def test_upstream_never_receives_the_gateway_key(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    team = team_name()
    url = start_team_gateway(start_gateway, None, team, discovery=True)
    client(url).chat.completions.create(model="gpt-4o", messages=HELLO)
    httpx.post(
        f"{url}/embeddings?api-key={KEY}&api-version=1",
        json={"model": "text-embedding-3-small", "input": "x"},
        headers={"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "Cookie": f"s={KEY}"},
    ).raise_for_status()
    # A team without its own upstream key, and no upstream.api_key: no credential goes at all.
    httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {OTHER_KEY}"}).raise_for_status()
    # The gateway's own requests (window discovery) included.
    assert any(seen.path == "/v1/models" and seen.method == "GET" for seen in fake_upstream.received[:-1])
    for seen in fake_upstream.received:
        assert KEY not in repr(seen.headers) + seen.query and OTHER_KEY not in repr(seen.headers)
    relayed = [
        fake_upstream.requests_to("/v1/chat/completions")[-1],
        fake_upstream.requests_to("/v1/embeddings")[-1],
        fake_upstream.received[-1],
    ]
    assert [seen.headers.get("authorization") for seen in relayed] == [
        f"Bearer {UPSTREAM_KEY}",
        f"Bearer {UPSTREAM_KEY}",
        None,
    ]
    assert relayed[1].query == "api-version=1"


def test_model_outside_the_team_list_is_model_not_found(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_team_gateway(start_gateway, None, team_name(), models=["gpt-4o-mini", "claude-*"])
    with pytest.raises(openai.NotFoundError) as failure:
        client(url).chat.completions.create(model="gpt-4o", messages=HELLO)
    assert failure.value.code == "model_not_found" and "'gpt-4o'" in failure.value.message
    assert client(url).chat.completions.create(model="claude-3-5-haiku", messages=HELLO).choices
    assert len(fake_upstream.received) == 1


# --- limits ------------------------------------------------------------------------------------


def test_sdk_sees_openai_rate_limit_headers_and_the_429(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, redis_url: str
) -> None:
    url = start_team_gateway(
        start_gateway, redis_url, team_name(), limits={"tokens_per_minute": 1000, "requests_per_minute": 100}
    )
    fake_upstream.hang_seconds = 1.0
    held: dict[str, Any] = {}

    def in_flight() -> None:
        held["raw"] = client(url).chat.completions.with_raw_response.create(
            model="gpt-4o", messages=HELLO, max_tokens=500, extra_headers={"x-fake-fault": "hang"}
        )

    thread = threading.Thread(target=in_flight)
    thread.start()
    wait_for(lambda: len(fake_upstream.received) == 1)
    # The first request holds its prompt + 500 tokens until it settles: 600 more cannot fit.
    with pytest.raises(openai.RateLimitError) as failure:
        client(url).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=600)
    thread.join()
    raw = held["raw"]
    sent_prompt = int(raw.headers["x-gateway-prompt-tokens-after"])
    assert raw.headers["x-ratelimit-limit-tokens"] == "1000"
    assert raw.headers["x-ratelimit-remaining-tokens"] == str(1000 - sent_prompt - 500)
    assert raw.headers["x-ratelimit-limit-requests"] == "100"
    assert raw.headers["x-ratelimit-remaining-requests"] == "99"
    assert re.fullmatch(r"\d+(\.\d+)?s|\d+ms", raw.headers["x-ratelimit-reset-tokens"])
    error = failure.value
    headers = error.response.headers
    assert error.code == "rate_limit_exceeded" and error.body["type"] == "tokens"  # type: ignore[index]
    # Used: what the first request holds, less the few tokens that flowed back since (16 a second).
    used = re.search(r"Limit 1000, Used (\d+), Requested (\d+)\.", error.body["message"])  # type: ignore[index]
    assert used is not None and int(used[2]) == sent_prompt + 600
    assert sent_prompt + 500 - 40 <= int(used[1]) <= sent_prompt + 500
    assert float(headers["retry-after"]) >= 1 and int(headers["retry-after-ms"]) > 0
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    assert "x-should-retry" not in headers


def test_insufficient_quota_is_not_retried_by_the_sdk(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, redis_url: str
) -> None:
    team = team_name()
    url = start_team_gateway(start_gateway, redis_url, team, limits={"tokens_per_day": 300})
    client(url).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=250)
    wait_for(lambda: metric(url, "gateway_team_tokens_total", team=team, kind="prompt") > 0)
    before = metric(url, "gateway_team_requests_total", team=team)
    with pytest.raises(openai.RateLimitError) as failure:
        client(url, retries=3).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=290)
    assert failure.value.code == "insufficient_quota"
    assert failure.value.response.headers["x-should-retry"] == "false"
    assert "It resets at 00:00 UTC" in failure.value.message
    # One attempt only: the SDK honoured x-should-retry.
    assert metric(url, "gateway_team_requests_total", team=team) == before + 1
    assert len(fake_upstream.received) == 1


def test_a_request_larger_than_the_minute_limit_is_told_at_once(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, redis_url: str
) -> None:
    team = team_name()
    url = start_team_gateway(start_gateway, redis_url, team, limits={"tokens_per_minute": 1000})
    with pytest.raises(openai.RateLimitError) as failure:
        client(url, retries=3).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=2000)
    assert failure.value.body["message"].startswith(
        f"Request too large for team {team} on tokens per min (TPM)"
    )
    assert "Limit 1000, Requested 20" in failure.value.message
    assert failure.value.response.headers["x-should-retry"] == "false"
    assert metric(url, "gateway_team_requests_total", team=team, outcome="too_large") == 1
    assert fake_upstream.received == []


def test_two_replicas_on_one_redis_enforce_one_budget(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, redis_url: str
) -> None:
    team = team_name()
    replicas = [
        start_team_gateway(start_gateway, redis_url, team, limits={"tokens_per_minute": 2000})
        for _ in range(2)
    ]
    # Every admitted request stays in flight, unsettled, until all 20 have been answered or held.
    fake_upstream.hang_seconds = 6.0
    statuses: list[int] = []
    reserved: list[int] = []
    refused_at: list[float] = []
    lock = threading.Lock()

    def call(index: int) -> None:
        answer = httpx.post(
            replicas[index % 2] + "/chat/completions",
            json={"model": "gpt-4o", "messages": HELLO, "max_tokens": 192},
            headers={"Authorization": f"Bearer {KEY}", "x-fake-fault": "hang"},
            timeout=30,
        )
        with lock:
            statuses.append(answer.status_code)
            if answer.status_code == 200:
                reserved.append(int(answer.headers["x-gateway-prompt-tokens-after"]) + 192)
            else:
                refused_at.append(time.monotonic())

    started = time.monotonic()
    threads = [threading.Thread(target=call, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    per_request = reserved[0]
    # The limit flows back at 2000 tokens a minute: on a slow machine the requests spread over
    # seconds, and each 6 s lets one more 200-token request in. Nothing settled before the last
    # refusal (the admitted ones were all still held by the upstream).
    spread = max(refused_at) - started
    assert spread < fake_upstream.hang_seconds
    flowed_back = 2000 * spread / 60
    # One shared budget: about floor(2000 / 200) admitted in all, not that many per replica.
    assert 2000 // per_request <= statuses.count(200) <= (2000 + flowed_back) // per_request
    assert statuses.count(429) == 20 - statuses.count(200)
    assert sum(reserved) <= 2000 + flowed_back


def test_request_limit_covers_every_route(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, redis_url: str
) -> None:
    url = start_team_gateway(start_gateway, redis_url, team_name(), limits={"requests_per_minute": 3})
    auth = {"Authorization": f"Bearer {KEY}"}
    answers = [
        httpx.get(url + "/models", headers=auth),
        httpx.post(url + "/embeddings", json={"model": "e", "input": "x"}, headers=auth),
        httpx.post(url + "/chat/completions", json={"model": "gpt-4o", "messages": HELLO}, headers=auth),
        httpx.get(url + "/models", headers=auth),
    ]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == ["2", "1", "0", "0"]
    assert answers[3].json()["error"]["type"] == "requests"
    assert "on requests per min (RPM): Limit 3, Used 3, Requested 1" in answers[3].json()["error"]["message"]


# --- accounting --------------------------------------------------------------------------------


def normalized(events: bytes) -> bytes:
    # Two answers of the fake differ only in their serial-numbered id and timestamp.
    return re.sub(rb'"created":\d+', b"", re.sub(rb"chatcmpl-fake-\d+", b"ID", events))


def test_streams_are_counted_exactly_and_the_client_stream_is_unchanged(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, redis_url: str
) -> None:
    fake_upstream.window = 128_000  # the fake counts exactly, so its usage is the truth
    team = team_name()
    url = start_team_gateway(start_gateway, redis_url, team, limits={"tokens_per_minute": 100_000})
    body = {"model": "gpt-4o", "messages": HELLO * 3, "stream": True, "max_tokens": 50}
    direct = httpx.post(fake_upstream.base_url + "/chat/completions", json=body).content
    via_team = httpx.post(url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert normalized(via_team.content) == normalized(direct)
    assert b'"usage"' not in via_team.content
    assert fake_upstream.received[-1].json["stream_options"] == {"include_usage": True}
    # The SDK's own stream parser agrees, and a client that asks for usage gets it.
    chunks = list(
        client(url).chat.completions.create(
            model="gpt-4o", messages=HELLO * 3, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    reported = chunks[-1].usage
    wait_for(lambda: recorded_usage(redis_url, team).get("gpt-4o", Usage()).requests == 2)
    usage = recorded_usage(redis_url, team)["gpt-4o"]
    assert usage.prompt == 2 * reported.prompt_tokens
    assert usage.completion == 2 * reported.completion_tokens


def test_a_client_that_leaves_mid_stream_is_settled(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, redis_url: str
) -> None:
    fake_upstream.chunk_delay = 0.05
    team = team_name()
    url = start_team_gateway(start_gateway, redis_url, team, limits={"tokens_per_minute": 100_000})
    long_question = [{"role": "user", "content": "one two three four five six seven eight nine ten " * 4}]
    with httpx.stream(
        "POST",
        url + "/chat/completions",
        json={"model": "gpt-4o", "messages": long_question, "stream": True, "max_tokens": 5000},
        headers={"Authorization": f"Bearer {KEY}"},
    ) as answer:
        prompt = int(answer.headers["x-gateway-prompt-tokens-after"])
        next(answer.iter_raw())
    wait_for(lambda: "gpt-4o" in recorded_usage(redis_url, team))
    usage = recorded_usage(redis_url, team)["gpt-4o"]
    # Settled with the exact prompt and the deltas relayed, not the 5000-token reservation.
    assert usage.prompt == prompt and 0 < usage.completion < 50


def test_usage_command_prints_the_records(
    fake_upstream: FakeUpstream,
    start_gateway: GatewayFactory,
    redis_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake_upstream.window = 128_000
    team = team_name()
    url = start_team_gateway(start_gateway, redis_url, team)
    answer = client(url).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert answer.usage is not None
    wait_for(lambda: "gpt-4o-mini" in recorded_usage(redis_url, team))
    config = tmp_path / "gateway.yaml"
    config.write_text(f"redis_url: {redis_url}\nteams:\n  {team}:\n    keys: ['{hash_key(KEY)}']\n")
    assert main(["usage", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(team))
    assert row.split() == [
        team,
        "gpt-4o-mini",
        "1",
        str(answer.usage.prompt_tokens),
        str(answer.usage.completion_tokens),
        "0",
    ]
    assert main(["usage", "--config", str(config), "--team", team, "--day", "1999-01-01"]) == 0
    assert "(nothing recorded)" in capsys.readouterr().out
    assert main(["usage", "--config", str(config), "--day", "yesterday\x1b"]) == 2
    assert "--day must be a date" in capsys.readouterr().err
    assert main(["usage", "--config", str(config), "--team", "x}{\n" * 100]) == 2
    assert "--team must be a team name" in capsys.readouterr().err


def test_usage_command_skips_counts_it_cannot_read_and_escapes_model_names(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    team = team_name()
    key = usage_key(team, int(time.time() // DAY_SECONDS))
    raw = redis.Redis.from_url(redis_url)  # bytes in, bytes out: writes what the gateway never would
    raw.hset(
        key,
        mapping={
            "superscript|requests": "\u00b2",  # str.isdigit() says yes, int() says no
            "huge|prompt": "9" * 5000,  # past int()'s 4300-digit limit
            "dashes|saved": "--5",
            "bytes|completion": b"\xff",
            "evil\x1b[2J\nforged|requests": "5",
            b"name\xff|requests": "7",
            "fine|requests": "3",
        },
    )
    raw.expire(key, 60)
    try:
        monkeypatch.setenv("GATEWAY_REDIS_URL", redis_url)
        assert main(["usage", "--team", team]) == 0
        out = capsys.readouterr().out
        rows = {line.split()[1]: line.split()[2:] for line in out.splitlines() if line.startswith(team)}
        assert rows == {
            "evil\\x1b[2J\\nforged": ["5", "0", "0", "0"],
            "fine": ["3", "0", "0", "0"],
            "name\\udcff": ["7", "0", "0", "0"],
        }
        assert "\x1b" not in out
    finally:
        raw.delete(key)
        raw.close()


def test_team_metrics_use_team_names_only(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, redis_url: str
) -> None:
    team = team_name()
    url = start_team_gateway(start_gateway, redis_url, team)
    client(url).chat.completions.create(model="gpt-4o", messages=HELLO)
    httpx.get(url + "/models", headers={"Authorization": "Bearer cgw-not-a-key-zzz"})
    wait_for(lambda: metric(url, "gateway_team_tokens_total", team=team, kind="completion") > 0)
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    assert f'gateway_team_requests_total{{outcome="admitted",team="{team}"}} 1.0' in text
    assert KEY not in text and "zzz" not in text and hash_key(KEY)[7:] not in text


# --- the team cap and compression mode -----------------------------------------------------------


def long_conversation() -> list[dict[str, str]]:
    """About 4500 tokens: fits gpt-4o's window easily, not a 2000-token team cap."""
    turns: list[dict[str, str]] = [{"role": "system", "content": "You are terse."}]
    for index in range(12):
        turns.append({"role": "user", "content": f"Question {index}: " + "explain the ledger entry " * 40})
        turns.append(
            {"role": "assistant", "content": f"Answer {index}: " + "the entry balances debits " * 40}
        )
    turns.append({"role": "user", "content": "And the last one?"})
    return turns


@pytest.mark.parametrize(
    ("mode", "header", "compressed"),
    [("auto", None, True), ("auto", "off", True), ("off", None, False), ("off", "auto", True)],
)
def test_team_cap_compresses_a_prompt_that_fits_the_model_but_not_the_team(
    fake_upstream: FakeUpstream,
    start_gateway: GatewayFactory,
    mode: str,
    header: str | None,
    compressed: bool,
) -> None:
    url = start_team_gateway(
        start_gateway, None, team_name(), compression=mode, limits={"max_context_tokens": 2000}
    )
    headers = {"Authorization": f"Bearer {KEY}"}
    if header:
        headers["x-gateway-compression"] = header
    answer = httpx.post(
        url + "/chat/completions",
        json={"model": "gpt-4o", "messages": long_conversation(), "max_tokens": 100},
        headers=headers,
    )
    assert answer.status_code == 200
    before = int(answer.headers["x-gateway-prompt-tokens-before"])
    after = int(answer.headers["x-gateway-prompt-tokens-after"])
    assert before > 4000
    sent = fake_upstream.received[-1].json["messages"]
    if compressed:
        assert answer.headers["x-gateway-team-cap"] == "2000"
        assert after <= 2000 < before and answer.headers["x-gateway-compression"] != "none"
        assert sent[-1]["content"] == "And the last one?" and len(sent) < len(long_conversation())
    else:
        assert after == before and answer.headers["x-gateway-compression"] == "none"
        assert sent == long_conversation()


# --- Redis failures ------------------------------------------------------------------------------


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[Any]:
    """A redis-server of this test's own on a free port, to stop and start at will (never 6379)."""
    import shutil
    import subprocess

    from tests.fakes.serve import free_port

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()

    class OwnRedis:
        url = f"redis://127.0.0.1:{port}/0"
        process: subprocess.Popen[bytes] | None = None

        def start(self) -> None:
            self.process = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(tmp_path),
                ],
                stdout=subprocess.DEVNULL,
            )
            wait_for(lambda: self._answers())

        def _answers(self) -> bool:
            try:
                return bool(redis.Redis(port=port, socket_timeout=0.2).ping())
            except redis.RedisError:
                return False

        def stop(self) -> None:
            if self.process is not None:
                self.process.terminate()
                self.process.wait(5)
                self.process = None

    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_fail_open_keeps_serving_with_limits_in_memory(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, own_redis: Any
) -> None:
    team = team_name()
    url = start_team_gateway(
        start_gateway,
        own_redis.url,
        team,
        limits={"tokens_per_minute": 1000},
    )
    assert client(url).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=100).choices
    fallbacks = metric(url, "gateway_policy_fallbacks_total")
    own_redis.stop()
    for _ in range(3):
        assert client(url).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=100).choices
    assert metric(url, "gateway_policy_fallbacks_total") == fallbacks + 3
    assert metric(url, "gateway_policy_store_failures_total") >= 1
    # The per-replica memory limit still holds the line.
    with pytest.raises(openai.RateLimitError):
        client(url).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=990)
    assert len([r for r in fake_upstream.received if r.path.endswith("/chat/completions")]) == 4


def test_fail_closed_answers_503_then_recovers(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, own_redis: Any
) -> None:
    team = team_name()
    teams = {team: {"keys": [hash_key(KEY)], "limits": {"tokens_per_minute": 10_000}}}
    url = start_gateway(
        GATEWAY_TEAMS=json.dumps(teams),
        GATEWAY_REDIS_URL=own_redis.url,
        GATEWAY_WINDOWS_DISCOVERY="false",
        GATEWAY_POLICY_ON_STORE_FAILURE="closed",
        GATEWAY_POLICY_BREAKER_COOLDOWN="0.2",
    )
    assert client(url).chat.completions.create(model="gpt-4o", messages=HELLO).choices
    own_redis.stop()
    with pytest.raises(openai.InternalServerError) as failure:
        client(url).chat.completions.create(model="gpt-4o", messages=HELLO)
    assert failure.value.status_code == 503 and failure.value.code == "limits_unavailable"
    assert failure.value.response.headers["retry-after"] == "1"
    assert len(fake_upstream.received) == 1  # nothing unchecked went upstream
    own_redis.start()

    def admitted() -> bool:
        try:
            return bool(client(url).chat.completions.create(model="gpt-4o", messages=HELLO).choices)
        except openai.InternalServerError:
            return False

    wait_for(admitted)


def test_a_stalled_redis_costs_one_bounded_wait_then_the_breaker_opens(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, own_redis: Any
) -> None:
    import os
    import signal

    team = team_name()
    teams = {team: {"keys": [hash_key(KEY)], "limits": {"requests_per_minute": 1000}}}
    url = start_gateway(
        GATEWAY_TEAMS=json.dumps(teams),
        GATEWAY_REDIS_URL=own_redis.url,
        GATEWAY_WINDOWS_DISCOVERY="false",
        GATEWAY_POLICY_STORE_TIMEOUT="0.05",
        GATEWAY_POLICY_BREAKER_COOLDOWN="60",
    )
    assert client(url).models.list().data
    failures = metric(url, "gateway_policy_store_failures_total")
    os.kill(own_redis.process.pid, signal.SIGSTOP)  # alive but silent: the slow-Redis case
    try:
        for _ in range(5):
            assert client(url).models.list().data
    finally:
        os.kill(own_redis.process.pid, signal.SIGCONT)
    # Three calls waited out the timeout; the open breaker sent the other two straight to memory.
    assert metric(url, "gateway_policy_store_failures_total") == failures + 3


def test_every_route_keeps_to_the_team_model_list(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_team_gateway(start_gateway, None, team_name(), models=["text-embedding-3-*", "gpt-4o-mini"])
    auth = {"Authorization": f"Bearer {KEY}"}
    refused = httpx.post(
        url + "/embeddings", json={"model": "text-embedding-ada-002", "input": "x"}, headers=auth
    )
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    refused = httpx.post(url + "/responses", json={"model": "gpt-4o", "input": "hi"}, headers=auth)
    assert refused.status_code == 404 and "'gpt-4o'" in refused.json()["error"]["message"]
    assert fake_upstream.received == []
    allowed = [
        httpx.post(url + "/embeddings", json={"model": "text-embedding-3-small", "input": "x"}, headers=auth),
        httpx.post(url + "/responses", json={"model": "gpt-4o-mini", "input": "hi"}, headers=auth),
        httpx.get(url + "/models", headers=auth),
        httpx.post(
            url + "/embeddings", content=b"[1, {", headers={**auth, "content-type": "application/json"}
        ),
    ]
    assert [answer.status_code for answer in allowed] == [200, 200, 200, 400]
    assert fake_upstream.received[2].body == b"" and "content-length" not in fake_upstream.received[2].headers


def test_no_body_shape_slips_a_model_past_the_team_list(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """Whatever shape names the model (JSON after any whitespace or deep inside, a multipart or
    urlencoded form, a form part sent as a file), the team's list holds; bodies without a model
    still pass."""
    url = start_team_gateway(start_gateway, None, team_name(), models=["whisper-1", "text-embedding-3-*"])
    auth = {"Authorization": f"Bearer {KEY}"}
    json_type = {**auth, "content-type": "application/json"}
    forbidden = "gpt-5-forbidden"
    wav = ("a.wav", b"RIFF0000WAVE")
    attempts = [
        httpx.post(
            url + "/embeddings",
            content=b" " * 2000 + json.dumps({"model": forbidden}).encode(),
            headers=json_type,
        ),
        httpx.post(
            url + "/audio/transcriptions", data={"model": forbidden}, files={"file": wav}, headers=auth
        ),
        httpx.post(
            url + "/audio/transcriptions",
            files={"model": ("m", forbidden.encode()), "file": wav},
            headers=auth,
        ),
        httpx.post(
            url + "/audio/transcriptions",
            data={"model": ["whisper-1", forbidden]},  # type: ignore[dict-item]
            files={"file": wav},
            headers=auth,
        ),
        httpx.post(
            url + "/embeddings",
            content=f"input=x&model={forbidden}".encode(),
            headers={**auth, "content-type": "application/x-www-form-urlencoded"},
        ),
        httpx.post(  # an eval run names the model it samples deeper in the body
            url + "/evals/eval_1/runs",
            json={"name": "r", "data_source": {"type": "responses", "model": forbidden}},
            headers=auth,
        ),
    ]
    assert [answer.status_code for answer in attempts] == [404] * len(attempts)
    assert all(answer.json()["error"]["code"] == "model_not_found" for answer in attempts)
    # Batches run the models their requests name: in the body (Anthropic), in the input file (OpenAI).
    lines = [
        {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": m}}
        for m in ("whisper-1", forbidden)
    ]
    batch_file = "\n".join(json.dumps(line) for line in lines).encode()
    uploaded = httpx.post(
        url + "/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", batch_file)}, headers=auth
    )
    assert uploaded.status_code == 404 and forbidden in uploaded.json()["error"]["message"]
    # A stored prompt names its own model, which the team's list cannot judge: the line must name one.
    stored = {"custom_id": "p", "method": "POST", "url": "/v1/responses", "body": {"prompt": {"id": "p1"}}}
    upload = {"file": ("p.jsonl", json.dumps(stored))}
    unnamed = httpx.post(url + "/files", data={"purpose": "batch"}, files=upload, headers=auth)
    assert unnamed.status_code == 400 and unnamed.json()["error"]["param"] == "model"
    params = {"model": forbidden, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    batched = httpx.post(
        url + "/messages/batches", json={"requests": [{"custom_id": "a", "params": params}]}, headers=auth
    )
    assert batched.status_code == 404 and batched.json()["type"] == "error"
    cut = b'--zz\r\nContent-Disposition: form-data; name="model"\r\n\r\n' + forbidden.encode()
    malformed = [
        httpx.post(url + "/embeddings", content=b'{"model": NaN}', headers=json_type),
        httpx.post(
            url + "/audio/transcriptions",
            content=cut,
            headers={**auth, "content-type": "multipart/form-data; boundary=zz"},
        ),
    ]
    assert [answer.status_code for answer in malformed] == [400, 400]
    assert fake_upstream.received == []
    allowed = [
        httpx.post(
            url + "/audio/transcriptions", data={"model": "whisper-1"}, files={"file": wav}, headers=auth
        ),
        httpx.post(
            url + "/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", b"{}")}, headers=auth
        ),
    ]
    # Both reach the upstream (this fake serves neither path, as OpenAI answers an unknown one).
    assert all("Invalid URL" in answer.json()["error"]["message"] for answer in allowed)
    assert [request.path for request in fake_upstream.received] == ["/v1/audio/transcriptions", "/v1/files"]


def test_no_encoding_or_spelling_slips_a_model_past_the_team_list(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """Bodies a lenient upstream reads as JSON though orjson cannot (a byte order mark, UTF-16:
    Python's parser, which FastAPI servers use whatever the content type, takes both), compressed
    bodies, and a model named in the query string (Realtime calls) all reached a model the team's
    list forbids. They are refused; a raw body naming no model still passes."""
    url = start_team_gateway(start_gateway, None, team_name(), models=["text-embedding-3-*"])
    auth = {"Authorization": f"Bearer {KEY}"}
    plain = json.dumps({"model": "gpt-5-forbidden", "input": "hi"})
    attempts = {
        "bom": httpx.post(url + "/embeddings", content=b"\xef\xbb\xbf" + plain.encode(), headers=auth),
        "utf-16": httpx.post(url + "/embeddings", content=plain.encode("utf-16"), headers=auth),
        "gzip": httpx.post(
            url + "/embeddings",
            content=gzip.compress(plain.encode()),
            headers={**auth, "content-type": "text/plain", "content-encoding": "gzip"},
        ),
        "query": httpx.post(
            url + "/realtime/calls?model=gpt-5-forbidden",
            content=b"v=0\r\n",
            headers={**auth, "content-type": "application/sdp"},
        ),
    }
    for query in ("model%5B%5D=gpt-5-forbidden", "Model=gpt-5-forbidden", "a=1;model=gpt-5-forbidden"):
        attempts["query: " + query] = httpx.post(
            url + "/realtime/calls?" + query,
            content=b"v=0\r\n",
            headers={**auth, "content-type": "application/sdp"},
        )
    attempts["query on chat"] = httpx.post(
        url + "/chat/completions?model=gpt-5-forbidden",
        json={"model": "text-embedding-3-small", "messages": [{"role": "user", "content": "hi"}]},
        headers=auth,
    )
    attempts["two content types"] = httpx.post(
        url + "/embeddings",
        content=b'{"model": "text-embedding-3-small", "input": "hi"}',
        headers=[*auth.items(), ("content-type", "application/json"), ("content-type", "text/plain")],
    )
    assert fake_upstream.received == []  # each refused by the gateway, none relayed
    refusals = {
        name: (answer.status_code, answer.json()["error"]["param"]) for name, answer in attempts.items()
    }
    assert refusals == {
        "bom": (400, None),
        "utf-16": (400, None),
        "gzip": (415, "content-encoding"),
        "query": (404, "model"),
        "query: model%5B%5D=gpt-5-forbidden": (404, "model"),
        "query: Model=gpt-5-forbidden": (404, "model"),
        "query: a=1;model=gpt-5-forbidden": (404, "model"),
        "query on chat": (404, "model"),
        "two content types": (400, "content-type"),
    }
    sdp = httpx.post(
        url + "/realtime/calls?model=text-embedding-3-small",
        content=b"v=0\r\n",
        headers={**auth, "content-type": "application/sdp"},
    )
    assert sdp.status_code == 404 and fake_upstream.received[-1].body == b"v=0\r\n"  # reached the upstream


@pytest.mark.parametrize("claimed", [2**64 - 1, 999_999_999])
def test_a_usage_no_request_could_spend_is_not_charged(
    start_gateway: GatewayFactory, redis_url: str, claimed: int
) -> None:
    """An upstream (or anything posing as one) reporting 2**64 - 1 prompt tokens set the team's
    day to 1.8e19 in Redis: every later request that day answered 429, and the settlement
    script failed on the number. One reporting 999,999,999 for a 13-token prompt held the team's
    per-minute budget for 333 hours. No count is charged beyond what one request could use (twice
    the model's window); an implausible one gives way to the gateway's own count."""
    absurd = {"prompt_tokens": claimed, "completion_tokens": 5, "total_tokens": 4}

    async def completions(request: Request) -> JSONResponse:
        answer = {"role": "assistant", "content": "ok"}
        choice = {"index": 0, "message": answer, "finish_reason": "stop"}
        return JSONResponse({"id": "c", "object": "chat.completion", "choices": [choice], "usage": absurd})

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    with serve_in_thread(app) as upstream:
        team = team_name()
        limits = {"tokens_per_day": 10_000_000, "tokens_per_minute": 2_000_000}
        teams = {team: {"keys": [hash_key(KEY)], "limits": limits}}
        url = start_gateway(
            GATEWAY_UPSTREAM_BASE_URL=upstream + "/v1",
            GATEWAY_TEAMS=json.dumps(teams),
            GATEWAY_REDIS_URL=redis_url,
            GATEWAY_WINDOWS_DISCOVERY="false",
        )
        body = {"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {KEY}"}
        answers = [httpx.post(url + "/chat/completions", json=body, headers=headers) for _ in range(3)]
        wait_for(lambda: sum(usage.requests for usage in recorded_usage(redis_url, team).values()) == 3)
        after = httpx.post(url + "/chat/completions", json=body, headers=headers)
    assert [answer.status_code for answer in [*answers, after]] == [200] * 4
    [usage] = recorded_usage(redis_url, team).values()
    assert 0 < usage.prompt <= 4 * 2 * 128_000 and usage.completion < 100  # gpt-4o: a 128k window


def test_another_spelling_of_a_prompt_route_is_that_route(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """`/v1//chat/completions` or a trailing slash went out as pass-through: no token limit, no
    cap, no compression, while nginx in front of an upstream (merging slashes) served it as chat
    completions. Such a spelling is the route itself, limits and usage included."""
    url = start_team_gateway(start_gateway, None, team_name(), limits={"tokens_per_day": 200})
    origin = url.removesuffix("/v1")
    body = {"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {KEY}"}
    paths = [
        "/v1//chat/completions",
        "/v1/chat/completions/",
        "//v1/chat//completions//",
        "/v1/Chat/Completions",
    ]
    before = {
        route: metric(url, "gateway_requests_total", route=route)
        for route in ("chat_completions", "passthrough")
    }
    answers = [httpx.post(origin + path, json=body, headers=headers) for path in paths]
    assert [answer.status_code for answer in answers] == [200] * 4
    assert all("x-gateway-prompt-tokens-before" in answer.headers for answer in answers)
    assert [request.path for request in fake_upstream.received] == ["/v1/chat/completions"] * 4
    # Counted as the route they are: an operator's chat error rate and latency include them.
    after = {route: metric(url, "gateway_requests_total", route=route) for route in before}
    assert {route: after[route] - before[route] for route in before} == {
        "chat_completions": 4,
        "passthrough": 0,
    }
    # Path parameters, which Tomcat or Spring strip before routing, are no path of the API.
    for path in ("/v1/chat/completions;a=b", "/v1/chat;v=1/completions"):
        refused = httpx.post(origin + path, json=body, headers=headers)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "path"
    assert len(fake_upstream.received) == 4
    while (answer := httpx.post(origin + paths[0], json=body, headers=headers)).status_code == 200:
        assert len(fake_upstream.received) < 50
    assert answer.status_code == 429 and answer.json()["error"]["code"] == "insufficient_quota"
    assert httpx.post(origin + paths[1], json=body, headers=headers).status_code == 429


def test_a_pass_through_body_naming_its_model_twice_is_refused_for_a_team_with_a_list(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """The gateway reads the last of two `model` keys; an upstream reading the first would run a
    model the list never saw. Such a body is refused where a list applies."""
    url = start_team_gateway(start_gateway, None, team_name(), models=["text-embedding-3-small"])
    twice = b'{"model": "gpt-5-forbidden", "input": "hi", "mod\\u0065l": "text-embedding-3-small"}'
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    answer = httpx.post(url + "/embeddings", content=twice, headers=headers)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "model"
    assert fake_upstream.received == []
    # A team without a list is not judged by its model: the body goes on as it came.
    headers["Authorization"] = f"Bearer {OTHER_KEY}"
    answer = httpx.post(url + "/embeddings", content=twice, headers=headers)
    assert answer.status_code == 200 and fake_upstream.received[-1].body == twice


def test_a_large_upload_is_judged_as_it_streams_and_a_refused_one_never_arrives_whole(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """A batch file of megabytes streams through a team's list: the worker holds a line of it,
    not the upload (hundreds of megabytes once took a worker past its memory limit). A file
    whose last line names a model the list refuses is refused, and the upstream never gets
    the upload whole (here: never takes it at all); an allowed one arrives byte for byte."""
    url = start_team_gateway(start_gateway, None, team_name(), models=["text-embedding-3-*"])
    auth = {"Authorization": f"Bearer {KEY}"}
    line = {"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {"input": "y" * 1000}}
    lines = [json.dumps({**line, "body": {**line["body"], "model": "text-embedding-3-small"}})] * 3000
    forbidden = json.dumps({**line, "body": {"model": "gpt-5-forbidden"}})
    headers = dict(auth)
    for first in (False, True):  # the line naming the forbidden model last, then first
        refused_file = "\n".join([forbidden, *lines] if first else [*lines, forbidden]).encode()
        upload = httpx.Request(
            "POST", url, data={"purpose": "batch"}, files={"file": ("in.jsonl", refused_file)}
        )
        content, headers["content-type"] = upload.read(), upload.headers["content-type"]
        assert len(content) > 3_000_000
        tracemalloc.start()  # this process serves the gateway (a thread) and the fake upstream
        try:
            refused = httpx.post(url + "/files", content=content, headers=headers, timeout=30)
            held = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert refused.status_code == 404 and "gpt-5-forbidden" in refused.json()["error"]["message"]
        assert fake_upstream.requests_to("/v1/files") == []
    # Refused at its first line, the upload was never held, by the gateway or (unsent) upstream.
    assert held < len(content) / 2  # read whole, it was held three times over
    allowed_file = "\n".join(lines).encode()
    upload = httpx.Request("POST", url, data={"purpose": "batch"}, files={"file": ("in.jsonl", allowed_file)})
    headers["content-type"] = upload.headers["content-type"]
    allowed = httpx.post(url + "/files", content=upload.read(), headers=headers, timeout=30)
    assert allowed.status_code == 404  # this fake serves no /v1/files, as OpenAI answers an unknown path
    [arrived] = fake_upstream.requests_to("/v1/files")
    assert arrived.body == upload.read()


def test_a_batch_runs_only_on_models_the_team_may_use_wherever_its_file_came_from(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """A batch's input file names its models, and it may reach the upstream by a route the gateway
    cannot read as a whole (the Uploads API in parts) or from a client with the same upstream key:
    creating the batch reads the file from the upstream, with the team's key, and checks it."""
    url = start_team_gateway(start_gateway, None, team_name(), models=["text-embedding-3-*"])
    sdk = client(url)

    def batch_file(*models: str) -> bytes:
        lines = [
            {"custom_id": str(n), "method": "POST", "url": "/v1/embeddings", "body": {"model": m}}
            for n, m in enumerate(models)
        ]
        return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"

    fake_upstream.files["file-allowed"] = batch_file("text-embedding-3-small", "text-embedding-3-large")
    # The forbidden request far into the file, past any first chunk the upstream sends.
    fake_upstream.files["file-mixed"] = batch_file(*["text-embedding-3-small"] * 2000, "gpt-5-forbidden")
    create = {"endpoint": "/v1/embeddings", "completion_window": "24h"}

    with pytest.raises(openai.NotFoundError) as refused:
        sdk.batches.create(input_file_id="file-mixed", **create)  # type: ignore[arg-type]
    assert refused.value.code == "model_not_found" and "gpt-5-forbidden" in refused.value.message
    fetched = fake_upstream.received[-1]
    assert (fetched.method, fetched.path) == ("GET", "/v1/files/file-mixed/content")
    assert fetched.headers["authorization"] == f"Bearer {UPSTREAM_KEY}" and KEY not in str(fetched.headers)
    assert "content-length" not in fetched.headers

    batch = sdk.batches.create(input_file_id="file-allowed", **create)  # type: ignore[arg-type]
    assert batch.status == "validating" and batch.input_file_id == "file-allowed"
    assert [r.path for r in fake_upstream.received[-2:]] == ["/v1/files/file-allowed/content", "/v1/batches"]

    sent = len(fake_upstream.received)
    auth = {"Authorization": f"Bearer {KEY}"}
    for file_id in ("../chat/completions", "file-x?purpose=y", 7, None):
        answer = httpx.post(url + "/batches", json={"input_file_id": file_id, **create}, headers=auth)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "input_file_id"
    assert len(fake_upstream.received) == sent  # nothing reached the upstream
    missing = httpx.post(url + "//batches/", json={"input_file_id": "file-gone", **create}, headers=auth)
    assert missing.status_code == 400 and "HTTP 404" in missing.json()["error"]["message"]
    assert fake_upstream.received[-1].path == "/v1/files/file-gone/content"
    # A team without a list creates batches without the gateway reading anything.
    other = client(url, OTHER_KEY).batches.create(input_file_id="file-mixed", **create)  # type: ignore[arg-type]
    assert other.status == "validating" and fake_upstream.received[-1].path == "/v1/batches"


def test_fail_open_replicas_each_take_their_share(
    fake_upstream: FakeUpstream,
    start_gateway: GatewayFactory,
    own_redis: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gateway.policy.replicas.HEARTBEAT_SECONDS", 0.1)
    team = team_name()
    replicas = [
        start_team_gateway(start_gateway, own_redis.url, team, limits={"tokens_per_minute": 1000})
        for _ in range(2)
    ]
    store = redis.Redis.from_url(own_redis.url)
    wait_for(lambda: store.zcard("context-gateway:replicas") == 2)
    both_seen = int(store.time()[0])
    # Once each replica has beaten after that second, each has read a count of 2.
    wait_for(
        lambda: (
            min(score for _, score in store.zrange("context-gateway:replicas", 0, -1, withscores=True))
            > both_seen
        )
    )
    for url in replicas:  # with Redis, a 600-token request fits the 1000-token budget
        assert client(url).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=590).choices
    own_redis.stop()
    for url in replicas:
        # Alone, each replica holds to half the budget: the same request no longer fits.
        with pytest.raises(openai.RateLimitError) as failure:
            client(url).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=590)
        assert failure.value.response.headers["x-ratelimit-limit-tokens"] == "500"
    # Smaller requests still pass: the replica serves, within its share.
    assert client(replicas[0]).chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=100).choices
