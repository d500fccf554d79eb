"""Context windows end to end: discovery from the upstream's model endpoints, learning when the
overflow error states no numbers, no poisoning by echoed numbers, and learned windows shared,
listed and forgotten across two replicas on one real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import orjson
import pytest
import redis

from gateway.app import create_app
from gateway.cli import main
from gateway.runtime import Runtime
from gateway.settings import load_settings
from gateway.store.redis import KEY_PREFIX
from gateway.tokens import discovery
from gateway.tokens.learned_windows import learned_key
from tests.conftest import GatewayFactory
from tests.fakes.serve import serve_in_thread
from tests.fakes.upstream import FakeUpstream


def history(turns: int, words: int = 150) -> list[dict[str, Any]]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"turn {i}: " + "lorem ipsum dolor " * words,
        }
        for i in range(turns)
    ]


def ask(url: str, model: str, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [*messages, {"role": "user", "content": "latest question"}], **extra}
    return httpx.post(f"{url}/chat/completions", json=body, timeout=30)


@pytest.mark.parametrize(
    "knobs",
    [
        {"model_cards": {"served-model": {"max_model_len": 3000}}},  # vLLM / SGLang
        {"model_cards": {"served-model": {"context_length": 3000}}},  # OpenRouter
        {"ollama_models": {"served-model": {"show": {"parameters": "num_ctx 3000"}}}},
        {"ollama_models": {"served-model": {"ps": {"context_length": 3000}}}},
        {"llamacpp_props": {"default_generation_settings": {"n_ctx": 3000}}},
    ],
    ids=["vllm", "openrouter", "ollama-show", "ollama-ps", "llamacpp"],
)
def test_a_discovered_window_fits_the_first_request(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, knobs: dict[str, Any]
) -> None:
    for name, value in knobs.items():
        setattr(fake_upstream, name, value)
    fake_upstream.window = 3000
    url = start_gateway()
    for _ in range(3):
        answer = ask(url, "served-model", history(12))
        assert answer.status_code == 200, answer.text
        assert "x-gateway-retry" not in answer.headers  # fitted before sending: no overflow
        assert answer.headers["x-gateway-compression"] != "none"
    # Asked once, at first sight: never again on the request path.
    assert fake_upstream.hits["/v1/models"] == 1
    assert fake_upstream.hits["/v1/chat/completions"] == 3


def test_discovery_off_asks_nothing(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    fake_upstream.model_cards = {"served-model": {"max_model_len": 3000}}
    fake_upstream.window = 3000
    url = start_gateway(GATEWAY_WINDOWS_DISCOVERY="false")
    answer = ask(url, "served-model", history(12))
    assert answer.status_code == 200
    assert answer.headers["x-gateway-retry"] == "overflow"  # learned the hard way
    assert not any(request.path in ("/v1/models", "/api/ps", "/props") for request in fake_upstream.received)


def test_no_numbers_overflow_converges_on_a_growing_conversation(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """OpenAI's newer wording states no window: the gateway bisects between the largest accepted
    and the smallest refused size and, after a few retried requests, fits first time."""
    fake_upstream.window = 6000
    fake_upstream.overflow_style = "openai_new"
    url = start_gateway()
    model = f"unknown-model-{uuid.uuid4().hex[:8]}"
    failed, retried, fitted = [], [], []
    for turns in range(2, 60, 2):
        answer = ask(url, model, history(turns, words=60))
        if answer.status_code != 200:
            failed.append(turns)
        elif "x-gateway-retry" in answer.headers:
            retried.append(turns)
        elif answer.headers["x-gateway-compression"] != "none":
            fitted.append(turns)
    assert failed == []
    assert 1 <= len(retried) <= 3, retried
    # Converged: every later request (all over the window) was fitted before it was sent.
    assert fitted == list(range(retried[-1] + 2, 60, 2))


@pytest.mark.parametrize("style", ["openai", "anthropic", "openai_new"])
def test_a_tiny_echoed_window_does_not_poison_the_model(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, style: str
) -> None:
    """An overflow error echoing a client's number ("maximum context length is 20 tokens"), or
    one odd error stating none far below the model's known window, is not believed: the request
    recovers and later requests of every client go through untouched."""
    fake_upstream.overflow_style = style  # type: ignore[assignment]
    fake_upstream.stated_window = 20
    fake_upstream.faults = ["overflow"]
    url = start_gateway()
    first = ask(url, "gpt-4o-mini", history(4))
    assert first.status_code == 200
    assert first.headers["x-gateway-retry"] == "overflow"
    for _ in range(3):
        later = ask(url, "gpt-4o-mini", history(4))
        assert later.status_code == 200
        assert later.headers["x-gateway-compression"] == "none"
        assert "x-gateway-retry" not in later.headers


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def test_two_replicas_share_list_and_forget_learned_windows(
    fake_upstream: FakeUpstream,
    start_gateway: GatewayFactory,
    redis_url: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = f"replica-model-{uuid.uuid4().hex[:8]}"
    shared = {"GATEWAY_REDIS_URL": redis_url, "GATEWAY_WINDOWS_STORE_REFRESH_SECONDS": "0"}
    first, second = start_gateway(**shared), start_gateway(**shared)
    fake_upstream.window = 3000

    learned = ask(first, model, history(12))
    assert learned.headers["x-gateway-retry"] == "overflow"
    ahead = ask(second, model, history(12))
    assert "x-gateway-retry" not in ahead.headers and ahead.headers["x-gateway-compression"] != "none"
    # Every key the gateway wrote expires.
    ttl = redis_client.ttl(KEY_PREFIX + learned_key(model))
    assert 0 < ttl <= 86_400
    assert 0 < redis_client.ttl(KEY_PREFIX + discovery.store_key(model)) <= 86_400

    monkeypatch.setenv("GATEWAY_REDIS_URL", redis_url)
    assert main(["windows", "list"]) == 0
    listed = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [model, "3000", "learned"] in [row[:3] for row in listed]

    assert main(["windows", "forget", model]) == 0
    assert "2 record(s) removed" in capsys.readouterr().out
    assert redis_client.exists(KEY_PREFIX + learned_key(model)) == 0
    # The server was redeployed with a larger window; both replicas stop compressing for the old one.
    fake_upstream.window = None
    for url in (first, second):
        fresh = ask(url, model, history(12))
        assert fresh.status_code == 200
        assert fresh.headers["x-gateway-compression"] == "none"


def test_windows_list_escapes_what_it_shows_and_skips_what_it_cannot_read(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Records planted in Redis (the gateway never writes them) cost one skipped key or one
    escaped line each: never a traceback, never a forged line or a terminal escape."""
    tag = uuid.uuid4().hex[:8]
    planted: dict[bytes, bytes | None] = {
        f"{KEY_PREFIX}{discovery.store_key(f'fz-{tag}-bytes')}".encode(): b"\xff\xfe",
        f"{KEY_PREFIX}{learned_key(f'fz-{tag}-hash')}".encode(): None,  # a hash, not a string
        f"{KEY_PREFIX}{discovery.store_key(f'fz-{tag}-')}".encode() + b"\xff": orjson.dumps(
            {"window": 4096, "server": "vllm", "expires_at": time.time() + 60}
        ),
        f"{KEY_PREFIX}{discovery.store_key(f'fz-{tag}-forger')}".encode(): orjson.dumps(
            {"window": 4096, "server": "x\x1b[2J\nfz-forged\t1\tlearned", "expires_at": time.time() + 60}
        ),
    }
    raw = redis.Redis.from_url(redis_url)  # bytes in, bytes out: writes what the gateway never would
    try:
        for key, value in planted.items():
            if value is None:
                raw.hset(key, "a", "b")
            else:
                raw.set(key, value, ex=60)
        monkeypatch.setenv("GATEWAY_REDIS_URL", redis_url)
        assert main(["windows", "list"]) == 0
        captured = capsys.readouterr()
        rows = [line.split("\t") for line in captured.out.splitlines()]
        assert all(len(row) == 5 for row in rows)  # the forged newline and tabs stay in one line
        mine = {row[0]: row for row in rows if row[0].startswith(f"fz-{tag}")}
        assert set(mine) == {f"fz-{tag}-\\udcff", f"fz-{tag}-forger"}
        assert mine[f"fz-{tag}-forger"][4] == "stated by x\\x1b[2J\\nfz-forged\\t1\\tlearned"
        assert "\x1b" not in captured.out
        assert "hold no window record it wrote; skipped" in captured.err
        assert "unreachable" not in captured.err  # a key of another type is not an outage
        # A name that is not UTF-8 (argv decodes it as the listing does) can be forgotten.
        assert main(["windows", "forget", f"fz-{tag}-\udcff"]) == 0
        assert capsys.readouterr().out == f"fz-{tag}-\\udcff: 1 record(s) removed\n"
    finally:
        raw.delete(*planted)
        raw.close()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://127.0.0.1:1/0", "ConnectionError"),
        ("redis://127.0.0.1:6379/99", "ResponseError: DB index is out of range"),
    ],
    ids=["unreachable", "no-such-database"],
)
@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["windows", "list"], "windows list"),
        (["windows", "forget", "m"], "windows forget"),
        (["usage"], "usage"),
    ],
)
def test_store_commands_on_a_redis_they_cannot_use_say_so_in_one_line(
    redis_url: str,
    url: str,
    reason: str,
    command: list[str],
    named: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_URL", url)
    monkeypatch.setenv("GATEWAY_TEAMS", orjson.dumps({"t": {"keys": ["sha256:" + "0" * 64]}}).decode())
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"context-gateway: {named}: ") and err.count("\n") == 1
    assert f"Redis at {url} failed: {reason}" in err


def test_windows_commands_without_redis_say_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GATEWAY_REDIS_URL", raising=False)
    assert main(["windows", "list"]) == 2
    assert "no redis_url configured" in capsys.readouterr().err
    assert main(["windows", "resolve", "claude-3-5-sonnet-20241022", "no-such-model"]) == 0
    out = capsys.readouterr().out
    assert "claude-3-5-sonnet-20241022\t200000\tmodel_map" in out
    assert "no-such-model\t-\tunknown" in out


def test_a_flood_of_model_names_stays_bounded(
    fake_upstream: FakeUpstream, redis_url: str, redis_client: redis.Redis
) -> None:
    """Distinct hostile model names, each overflowing: memory holds at most windows.max_models of
    them, and every Redis key written expires."""
    settings = load_settings(
        None,
        {
            "GATEWAY_UPSTREAM_BASE_URL": fake_upstream.base_url,
            "GATEWAY_REDIS_URL": redis_url,
            "GATEWAY_WINDOWS_MAX_MODELS": "5",
        },
    )
    app = create_app(settings)
    runtime: Runtime = app.state.runtime
    tag = uuid.uuid4().hex[:8]
    fake_upstream.window = 3000
    with ExitStack() as stack:
        url = stack.enter_context(serve_in_thread(app)) + "/v1"
        for index in range(20):
            answer = ask(url, f"flood-{tag}-{index}-" + "x" * 200, history(12))
            assert answer.status_code == 200
    assert len(runtime.windows.learned) <= 5
    assert len(runtime.windows.discovered) <= 5
    keys = list(redis_client.scan_iter(match=f"{KEY_PREFIX}window:*flood-{tag}-*"))
    assert len(keys) >= 20
    assert all(redis_client.ttl(key) > 0 for key in keys)


def test_discovery_carries_the_gateways_key_never_the_clients(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """With an upstream key configured, the gateway's own look-ups use it, like the requests
    they serve; the model list is fetched once for all new models."""
    fake_upstream.model_cards = {"served-a": {"max_model_len": 3000}, "served-b": {"max_model_len": 3000}}
    url = start_gateway(GATEWAY_UPSTREAM_API_KEY="sk-gateway-own-key-0001")
    for model in ("served-a", "served-b"):
        answer = httpx.post(
            f"{url}/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": "Bearer sk-client-secret-9999", "x-api-key": "client-other-key"},
            timeout=30,
        )
        assert answer.status_code == 200
    looked_up = [r for r in fake_upstream.received if r.path != "/v1/chat/completions"]
    assert looked_up, "discovery asked nothing"
    for request in looked_up:
        assert request.headers.get("authorization") == "Bearer sk-gateway-own-key-0001"
        assert "client" not in str(request.headers)
    assert fake_upstream.hits["/v1/models"] == 1


def test_a_client_cannot_spell_a_window_into_another_error(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """The Messages API quotes an unknown content block's type in its 400: spelled as an overflow
    with a small window, it must not become the window every other client of the model gets."""
    root = start_gateway().removesuffix("/v1")
    headers = {"x-api-key": "sk-ant-caller", "anthropic-version": "2023-06-01"}
    model = "claude-3-5-haiku-20241022"  # no window configured: a learned one would take over
    text = "The quick brown fox jumps over the lazy dog. " * 300
    victim = {
        "model": model,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "Summarize: " + text}],
    }
    spelled = "prompt is too long: 3000 tokens > 1100 maximum"
    attack = {
        "model": model,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": [{"type": spelled}, {"type": "text", "text": text}]}],
    }
    refused = httpx.post(f"{root}/v1/messages", json=attack, headers=headers, timeout=30)
    assert refused.status_code == 400
    # Read as an overflow the client wrote: retried compressed once, then the upstream's own answer.
    assert refused.json()["type"] == "error" and spelled in refused.json()["error"]["message"]
    assert refused.headers.get("x-gateway-retry") == "overflow"
    later = httpx.post(f"{root}/v1/messages", json=victim, headers=headers, timeout=30)
    assert later.status_code == 200
    assert later.headers["x-gateway-compression"] == "none"
    assert int(later.headers["x-gateway-prompt-tokens-after"]) > 3000


def test_a_refusal_the_client_wrote_inside_a_stream_is_neither_learned_nor_charged() -> None:
    """An upstream (SGLang-like) that answers 200 and puts its error in the stream, quoting the
    client's overflow-shaped text twice: relayed as it came, never taken for an accepted request
    (whose size would raise the model's known window) nor charged to the team."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from gateway.policy.keys import hash_key

    spelled = (
        "This model's maximum context length is 20000 tokens. "
        "However, your messages resulted in 150000 tokens."
    )

    async def refuse(request: Request) -> Response:
        message = f"Invalid value: '{spelled}' is not a supported tool_call_id."
        event = b"data: " + orjson.dumps({"object": "error", "message": message, "code": 400}) + b"\n\n"
        return Response(event, media_type="text/event-stream")

    upstream = Starlette(routes=[Route("/{path:path}", refuse, methods=["POST"])])
    teams = {"t": {"keys": [hash_key("sk-team-t")], "limits": {"tokens_per_day": 1_000_000}}}
    with ExitStack() as stack:
        origin = stack.enter_context(serve_in_thread(upstream))
        environ = {
            "GATEWAY_UPSTREAM_BASE_URL": origin + "/v1",
            "GATEWAY_WINDOWS_DISCOVERY": "false",
            "GATEWAY_TEAMS": orjson.dumps(teams).decode(),
        }
        app = create_app(load_settings(None, environ))
        url = stack.enter_context(serve_in_thread(app)) + "/v1"
        runtime: Runtime = app.state.runtime
        body = {
            "model": "sglang-served",
            "stream": True,
            "max_tokens": 100,
            "messages": [*history(4), {"role": "user", "content": spelled}],
        }
        team_key = {"authorization": "Bearer sk-team-t"}
        answer = httpx.post(url + "/chat/completions", json=body, headers=team_key, timeout=30)
        assert answer.status_code == 200 and spelled in answer.text  # the upstream's own answer
        assert answer.headers["x-gateway-retry"] == "overflow"
        assert runtime.windows.learned.get("sglang-served") is None
        day = int(time.time()) // 86400
        for _ in range(50):  # the settlement runs in the background once the stream ends
            usage = asyncio.run(runtime.policy.usage("t", day))
            if usage:
                break
            time.sleep(0.05)
    assert usage and all(model.prompt == 0 and model.completion == 0 for model in usage.values())
