"""LLM summaries of dropped turns through the real route: cached, shared, single-flight, never in the way."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
import redis

from gateway.policy.keys import hash_key
from gateway.policy.limits import RedisLimits, Usage
from gateway.settings import BudgetSettings
from tests.conftest import GatewayFactory
from tests.fakes.serve import free_port
from tests.fakes.summarizer import FakeSummarizer, serve_summarizer
from tests.fakes.upstream import FakeUpstream
from tests.metrics import metric

WINDOW = 6_000
MODEL = "gpt-4o-mini"
MODELS = json.dumps({MODEL: {"context_window": WINDOW}})
MARKER = "omitted to fit the context window; what they held"


@pytest.fixture
def summarizer() -> Iterator[FakeSummarizer]:
    with serve_summarizer() as fake:
        yield fake


def conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a support assistant."},
        {"role": "user", "content": "Never share customer emails. " + "Some background. " * 60},
        {"role": "assistant", "content": "Understood. " + "More detail. " * 60},
    ]
    for turn in range(turns):
        messages += [
            {
                "role": "user",
                "content": f"Ticket T-{turn:03d} is about invoice INV-{turn:04d}. " + "Context. " * 60,
            },
            {"role": "assistant", "content": f"Noted ticket T-{turn:03d}. " + "Explanation. " * 60},
        ]
    return [*messages, {"role": "user", "content": "What was the first ticket about?"}]


def ask(
    url: str, messages: list[dict[str, Any]], key: str = "sk-test"
) -> tuple[str, list[dict[str, Any]], Any]:
    client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=200,
    )
    assert raw.http_response.status_code == 200
    return raw.headers["x-gateway-compression"], messages, raw


def sent_marker(fake_upstream: FakeUpstream) -> str:
    sent = fake_upstream.received[-1].json["messages"]
    return next(str(m["content"]) for m in sent if MARKER in str(m["content"]))


def start(start_gateway: GatewayFactory, summarizer: FakeSummarizer, **extra: str) -> str:
    return start_gateway(
        GATEWAY_MODELS=MODELS,
        GATEWAY_COMPRESSION_SUMMARIZER_MODEL="summarizer-mini",
        GATEWAY_COMPRESSION_SUMMARIZER_BASE_URL=summarizer.base_url,
        **extra,
    )


def wait_until(condition: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_background_mode_sends_the_digest_at_once_and_the_summary_next_time(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, summarizer: FakeSummarizer
) -> None:
    fake_upstream.window = WINDOW
    summarizer.mode, summarizer.delay = "slow", 1.0
    url = start(start_gateway, summarizer)
    messages = conversation(30)
    header, _, _ = ask(url, messages)
    # The answer came back while the summarizer was still working: it was never waited for.
    assert summarizer.answered == 0
    assert "digest" in header.split(",") and "The user said:\n- Ticket T-" in sent_marker(fake_upstream)
    wait_until(lambda: summarizer.answered == 1)
    time.sleep(0.3)  # the store write follows the answer
    header, _, _ = ask(url, messages)
    assert "summary" in header.split(",") and "digest" not in header.split(",")
    marker = sent_marker(fake_upstream)
    assert marker.split("]\n", 1)[1].startswith("Notes: ") and "INV-0019" in marker  # the last dropped turn
    assert summarizer.calls == 1  # the second request used the stored summary


def test_inline_mode_waits_for_the_summary(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, summarizer: FakeSummarizer
) -> None:
    fake_upstream.window = WINDOW
    url = start(start_gateway, summarizer, GATEWAY_COMPRESSION_SUMMARIZER_MODE="inline")
    header, _, _ = ask(url, conversation(30))
    assert "summary" in header.split(",") and summarizer.calls == 1
    body = summarizer.bodies[0]
    # Capped by the configured output and by the room the marker has (a tenth of the budget).
    assert body["model"] == "summarizer-mini" and 0 < body["max_tokens"] <= WINDOW // 10
    assert "User instructions" in body["messages"][0]["content"]


def test_an_answer_that_arrives_in_pieces_is_read_to_its_end(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, summarizer: FakeSummarizer
) -> None:
    fake_upstream.window = WINDOW
    summarizer.mode, summarizer.delay = "pieces", 0.1
    url = start(start_gateway, summarizer, GATEWAY_COMPRESSION_SUMMARIZER_MODE="inline")
    header, _, _ = ask(url, conversation(30))
    # Valid JSON in four writes 0.1 s apart: the whole of it is the answer, not its first piece.
    assert "summary" in header.split(",") and "digest" not in header.split(",")
    assert sent_marker(fake_upstream).split("]\n", 1)[1].startswith("Notes: ")
    assert summarizer.calls == 1


def test_a_redirect_from_the_summarizer_is_not_followed(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, summarizer: FakeSummarizer
) -> None:
    fake_upstream.window = WINDOW
    with serve_summarizer() as elsewhere:
        summarizer.mode, summarizer.redirect_to = "redirect", f"{elsewhere.base_url}/chat/completions"
        url = start(start_gateway, summarizer, GATEWAY_COMPRESSION_SUMMARIZER_MODE="inline")
        redirected = metric(url, "gateway_summary_failures_total", reason="status_3xx")
        header, _, _ = ask(url, conversation(30))
        # The conversation went to the configured summarizer only; its 307 is a failure.
        assert summarizer.calls == 1 and elsewhere.calls == 0
        assert "digest" in header.split(",") and "summary" not in header.split(",")
        assert metric(url, "gateway_summary_failures_total", reason="status_3xx") == redirected + 1


def agent_conversation(turns: int, steps: int) -> list[dict[str, Any]]:
    """Earlier turns, then an agent's tool steps: a fit drops a span of each."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(turns):
        messages += [
            {"role": "user", "content": f"Task K-{turn:03d}: fix m{turn}.py. " + "Background. " * 60},
            {"role": "assistant", "content": f"Fixed K-{turn:03d}. " + "Explanation. " * 60},
        ]
    messages.append({"role": "user", "content": "Now run the test suite and fix what fails."})
    for step in range(steps):
        call = {"name": "read_file", "arguments": json.dumps({"path": f"src/f{step}.py"})}
        messages += [
            {
                "role": "assistant",
                "content": f"Step {step}.",
                "tool_calls": [{"id": f"call_{step}", "type": "function", "function": call}],
            },
            {
                "role": "tool",
                "tool_call_id": f"call_{step}",
                "content": f"src/f{step}.py: value={step * 7}. " + "Output. " * 60,
            },
        ]
    return messages


def test_inline_mode_waits_one_timeout_for_all_the_spans_of_a_request(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, summarizer: FakeSummarizer
) -> None:
    fake_upstream.window = WINDOW
    summarizer.mode, summarizer.delay = "slow", 60.0  # never answers in time
    timeout = 5.0
    url = start(
        start_gateway,
        summarizer,
        GATEWAY_COMPRESSION_SUMMARIZER_MODE="inline",
        GATEWAY_COMPRESSION_SUMMARIZER_TIMEOUT=str(timeout),
    )
    started = time.monotonic()
    header, _, _ = ask(url, agent_conversation(30, 30))
    waited = time.monotonic() - started
    assert summarizer.calls == 2  # two spans dropped, a summary asked for each
    assert "digest" in header.split(",") and "summary" not in header.split(",")
    # One deadline for the request: the two waits overlap rather than add up to 2 x timeout.
    assert timeout <= waited < 2 * timeout - 1


@pytest.mark.parametrize("mode", ["fail", "refuse", "garbage", "long", "slow"])
def test_any_summarizer_failure_falls_back_to_the_digest(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, summarizer: FakeSummarizer, mode: str
) -> None:
    fake_upstream.window = WINDOW
    summarizer.mode, summarizer.delay = mode, 3.0
    url = start(
        start_gateway,
        summarizer,
        GATEWAY_COMPRESSION_SUMMARIZER_MODE="inline",
        GATEWAY_COMPRESSION_SUMMARIZER_TIMEOUT="0.5",
    )
    header, _, _ = ask(url, conversation(30))
    assert "digest" in header.split(",") and "summary" not in header.split(",")
    assert "The user said:\n- Ticket T-" in sent_marker(fake_upstream)
    header, _, _ = ask(url, conversation(30))
    assert "digest" in header.split(",")
    assert summarizer.calls == 1  # one attempt per span: the next request did not try again


def test_a_summarizer_that_is_down_falls_back_to_the_digest(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    fake_upstream.window = WINDOW
    url = start_gateway(
        GATEWAY_MODELS=MODELS,
        GATEWAY_COMPRESSION_SUMMARIZER_MODEL="summarizer-mini",
        GATEWAY_COMPRESSION_SUMMARIZER_BASE_URL=f"http://127.0.0.1:{free_port()}/v1",
        GATEWAY_COMPRESSION_SUMMARIZER_MODE="inline",
    )
    header, _, _ = ask(url, conversation(30))
    assert "digest" in header.split(",")


def test_a_growing_conversation_makes_one_call_per_cut_and_keeps_its_prefix(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, summarizer: FakeSummarizer
) -> None:
    fake_upstream.window = WINDOW
    url = start(start_gateway, summarizer, GATEWAY_COMPRESSION_SUMMARIZER_MODE="inline")
    spans: list[str] = []
    previous: list[dict[str, Any]] | None = None
    moves = 0
    for turns in range(8, 108):
        header, _, _ = ask(url, conversation(turns))
        sent = fake_upstream.received[-1].json["messages"]
        marker = next((str(m["content"]) for m in sent if MARKER in str(m["content"])), None)
        if marker is None:
            assert "drop_turns" not in header
            continue
        assert "summary" in header.split(",")
        if spans and marker != spans[-1]:
            moves += 1
        elif previous is not None:
            # While the cut stays put, the previous prompt (bar its question) is a prefix of this one.
            assert sent[: len(previous) - 1] == previous[:-1]
        spans.append(marker)
        previous = sent
    assert moves >= 3  # the cut moved several times over 100 turns
    assert summarizer.calls <= moves + 1  # at most one call per cut position
    assert summarizer.calls == len(set(spans))
    # Incremental: after the first, each summary read the earlier summary, not the whole span again.
    assert all(
        "Notes on the conversation before" in str(b["messages"][1]["content"]) for b in summarizer.bodies[1:]
    )


def test_two_gateway_processes_on_one_redis_make_one_call_for_one_span(
    fake_upstream: FakeUpstream, summarizer: FakeSummarizer, redis_url: str
) -> None:
    redis.Redis.from_url(redis_url).flushdb()
    fake_upstream.window = WINDOW
    summarizer.mode, summarizer.delay = "slow", 1.0
    ports = [free_port(), free_port()]
    environ = {
        **os.environ,
        "GATEWAY_UPSTREAM_BASE_URL": fake_upstream.base_url,
        "GATEWAY_MODELS": MODELS,
        "GATEWAY_REDIS_URL": redis_url,
        "GATEWAY_COMPRESSION_SUMMARIZER_MODEL": "summarizer-mini",
        "GATEWAY_COMPRESSION_SUMMARIZER_BASE_URL": summarizer.base_url,
        "GATEWAY_COMPRESSION_SUMMARIZER_MODE": "inline",
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    try:
        urls = [f"http://127.0.0.1:{port}/v1" for port in ports]
        for url in urls:
            wait_until(lambda url=url: _healthy(url))
        messages = conversation(30)
        with ThreadPoolExecutor(8) as pool:
            headers = list(pool.map(lambda i: ask(urls[i % 2], messages)[0], range(8)))
        assert summarizer.calls == 1
        assert all("summary" in header.split(",") for header in headers)  # the others waited for it
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/healthz", timeout=1) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["inline", "background"])
def test_a_summary_is_the_usage_of_the_team_whose_request_made_it(
    fake_upstream: FakeUpstream,
    start_gateway: GatewayFactory,
    summarizer: FakeSummarizer,
    redis_url: str,
    mode: str,
) -> None:
    redis.Redis.from_url(redis_url).flushdb()  # no summary stored by an earlier test
    fake_upstream.window = WINDOW
    payer, other = "t" + uuid.uuid4().hex[:10], "t" + uuid.uuid4().hex[:10]
    teams = {payer: {"keys": [hash_key(PAYER_KEY)]}, other: {"keys": [hash_key(OTHER_KEY)]}}
    url = start_for_teams(start_gateway, summarizer, redis_url, teams, mode)
    messages = conversation(30)
    ask(url, messages, key=PAYER_KEY)
    wait_until(lambda: SUMMARIES in recorded_usage(redis_url, payer))
    usage = recorded_usage(redis_url, payer)[SUMMARIES]
    # What the summarizer reported for its one call, to the team whose request made it.
    reported = summarizer.usage[0]
    assert summarizer.calls == 1
    assert (usage.requests, usage.prompt, usage.completion) == (
        1,
        reported["prompt_tokens"],
        reported["completion_tokens"],
    )
    assert usage.prompt > 1_000  # it read the dropped turns
    assert MODEL in recorded_usage(redis_url, payer)  # beside the team's own request
    # The other team's identical conversation finds the summary made: no call, nothing charged.
    wait_until(lambda: summarizer.answered == 1)
    time.sleep(0.3)  # the store write follows the answer
    header, _, _ = ask(url, messages, key=OTHER_KEY)
    assert "summary" in header.split(",")
    assert summarizer.calls == 1
    wait_until(lambda: MODEL in recorded_usage(redis_url, other))
    assert SUMMARIES not in recorded_usage(redis_url, other)


def test_a_summarizer_usage_no_call_could_spend_is_not_charged(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, summarizer: FakeSummarizer, redis_url: str
) -> None:
    """A summarizer reporting 2**64 - 1 prompt tokens set the paying team's day to 1.8e19 in
    Redis (every later request 429) and broke the settlement script: such a count is not charged."""
    redis.Redis.from_url(redis_url).flushdb()  # no summary stored by an earlier test
    fake_upstream.window = WINDOW
    summarizer.reported_usage = {"prompt_tokens": 2**64 - 1, "completion_tokens": 40, "total_tokens": 39}
    payer = "t" + uuid.uuid4().hex[:10]
    teams = {payer: {"keys": [hash_key(PAYER_KEY)], "limits": {"tokens_per_day": 1_000_000}}}
    url = start_for_teams(start_gateway, summarizer, redis_url, teams, "inline")
    header, _, _ = ask(url, conversation(30), key=PAYER_KEY)
    assert "summary" in header.split(",")
    wait_until(lambda: SUMMARIES in recorded_usage(redis_url, payer))
    assert recorded_usage(redis_url, payer)[SUMMARIES].prompt == 0
    assert recorded_usage(redis_url, payer)[SUMMARIES].completion == 40
    header, _, _ = ask(url, conversation(31), key=PAYER_KEY)  # the team's day is not used up
    assert header


def start_for_teams(
    start_gateway: GatewayFactory,
    summarizer: FakeSummarizer,
    redis_url: str,
    teams: dict[str, Any],
    mode: str,
) -> str:
    """A gateway for `teams` whose limits and usage live in Redis, summarizing in `mode`."""
    return start(
        start_gateway,
        summarizer,
        GATEWAY_TEAMS=json.dumps(teams),
        GATEWAY_REDIS_URL=redis_url,
        GATEWAY_POLICY_STORE_TIMEOUT="2",
        GATEWAY_COMPRESSION_SUMMARIZER_MODE=mode,
    )


PAYER_KEY = "cgw-payer-team-key-0001"
OTHER_KEY = "cgw-other-team-key-0002"
SUMMARIES = "summaries:summarizer-mini"


def recorded_usage(redis_url: str, team: str) -> dict[str, Usage]:
    async def read() -> dict[str, Usage]:
        limits = RedisLimits(redis_url, timeout=2.0)
        try:
            seconds, _ = await limits.client.time()
            return await limits.usage(team, int(seconds) // 86400)
        finally:
            await limits.close()

    return asyncio.run(read())


@pytest.mark.parametrize("start_ratio", ["0.8", "1"])
def test_the_span_of_the_first_drop_is_summarized_ahead_of_it(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, summarizer: FakeSummarizer, start_ratio: str
) -> None:
    fake_upstream.window = WINDOW
    url = start(start_gateway, summarizer, GATEWAY_COMPRESSION_SUMMARIZER_START_RATIO=start_ratio)
    budget = BudgetSettings().usable(WINDOW, {"max_tokens": 200})
    calls_before_drop = 0
    for turns in range(1, 40):
        header, _, raw = ask(url, conversation(turns))
        if "drop_turns" in header.split(","):
            break
        prompt = int(raw.headers["x-gateway-prompt-tokens-before"])
        wait_until(lambda: summarizer.answered == summarizer.calls)
        time.sleep(0.3)  # the store write follows the answer
        if summarizer.calls > calls_before_drop:  # started once the prompt neared its budget, not before
            assert prompt >= float(start_ratio) * budget
        calls_before_drop = summarizer.calls
    else:
        pytest.fail("the conversation never outgrew its window")
    if start_ratio == "1":
        assert calls_before_drop == 0
        assert "digest" in header.split(",")  # the first drop sends the digest, as without a summarizer
    else:
        assert calls_before_drop == 1  # one call, made ahead, for the span the drop removed
        assert "summary" in header.split(",") and "digest" not in header.split(",")
        assert sent_marker(fake_upstream).split("]\n", 1)[1].startswith("Notes: ")
