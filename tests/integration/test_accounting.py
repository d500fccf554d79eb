"""Token accounting on the request path: headers, calibration from usage, persistence, CLI."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from gateway.cli import main
from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream

PARAGRAPH = (
    "The quarterly report covers revenue, churn and hiring across three regions; "
    "each figure is compared with the same quarter last year. "
)


def _conversation(turn: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a careful analyst."}]
    for i in range(turn):
        messages.append({"role": "user", "content": f"Question {i}: " + PARAGRAPH * (3 + i % 4)})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + PARAGRAPH * 2})
    messages.append({"role": "user", "content": "Summarise the trend."})
    return messages


def test_openai_model_header_equals_upstream_usage(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    fake_upstream.window = 10_000_000  # makes the fake count exactly
    answer = httpx.post(
        f"{gateway_url}/chat/completions", json={"model": "gpt-4o", "messages": _conversation(5)}
    )
    assert answer.status_code == 200
    assert int(answer.headers["x-gateway-prompt-tokens-before"]) == answer.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("stream", [False, True])
def test_calibration_converges_and_persists(
    fake_upstream: FakeUpstream,
    start_gateway: GatewayFactory,
    request: pytest.FixtureRequest,
    stream: bool,
    store: str,
) -> None:
    """A model the gateway can only estimate converges on the upstream's own counts (within 3%),
    with either store; Redis keeps the factor for other replicas, with an expiry."""
    fake_upstream.window = 10_000_000
    model = f"local-llm-{uuid.uuid4().hex[:8]}"
    redis_url = request.getfixturevalue("redis_url") if store == "redis" else ""
    url = start_gateway(GATEWAY_REDIS_URL=redis_url)
    errors = []
    for turn in range(1, 26):
        body = {"model": model, "messages": _conversation(turn), "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        answer = httpx.post(f"{url}/chat/completions", json=body, timeout=30)
        assert answer.status_code == 200
        estimate = int(answer.headers["x-gateway-prompt-tokens-before"])
        if stream:
            last = [line for line in answer.text.split("\n\n") if '"usage"' in line][-1]
            reported = orjson.loads(last.removeprefix("data: "))["usage"]["prompt_tokens"]
        else:
            reported = answer.json()["usage"]["prompt_tokens"]
        errors.append(abs(estimate - reported) / reported)
    assert errors[0] > 0.05  # the family factor alone starts off
    assert max(errors[20:]) < 0.03
    if store == "redis":
        client = redis.Redis.from_url(redis_url)
        saved = client.get(f"context-gateway:calibration:{model}")
        assert saved is not None and orjson.loads(saved)["samples"] >= 1
        assert client.ttl(f"context-gateway:calibration:{model}") > 0  # never kept forever


def test_count_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps({"model": "gpt-4o", "messages": _conversation(2), "max_tokens": 1000}))
    assert main(["count", "--model", "gpt-4o", "--verbose", str(request)]) == 0
    out = capsys.readouterr().out
    assert "[0] system:" in out and "[5] user:" in out
    assert "(exact (tiktoken o200k_base))" in out
    assert "context window: 128000 (from model_map)" in out
    assert "usable budget: 126744 -> fits" in out


def test_count_cli_unknown_model_and_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request = tmp_path / "messages.json"
    request.write_bytes(orjson.dumps(_conversation(1)))  # a bare message list
    assert main(["count", "--model", "my-private-model", str(request)]) == 0
    out = capsys.readouterr().out
    assert "estimated" in out and "context window: unknown" in out
    broken = tmp_path / "broken.json"
    broken.write_text("{nope")
    assert main(["count", "--model", "gpt-4o", str(broken)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
