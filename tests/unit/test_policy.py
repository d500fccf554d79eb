"""Teams policy, pure parts: the config contract and its hostile values, keys, GCRA arithmetic in
memory, OpenAI's header formats, and the stream meter that hides the gateway's usage request."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from gateway.policy.answers import duration, rate_limit_headers
from gateway.policy.chat import output_allowance
from gateway.policy.config import TeamLimits
from gateway.policy.keys import MAX_PRESENTED_KEY, KeyIndex, hash_key, new_key, presented_key
from gateway.policy.limits import MemoryLimits, Usage
from gateway.policy.streams import StreamMeter, ask_for_usage
from gateway.routes.prompt import LARGEST_WINDOW, usage_ceiling
from gateway.runtime import Runtime
from gateway.settings import ConfigError, load_settings
from tests.fakes import answers, anthropic_api, responses_api

KEY = "cgw-test-key-1"
HASH = hash_key(KEY)


def teams_env(teams: Any) -> dict[str, str]:
    return {"GATEWAY_TEAMS": json.dumps(teams)}


def test_teams_config_contract_loads() -> None:
    settings = load_settings(
        None,
        teams_env(
            {
                "research": {
                    "keys": [HASH],
                    "upstream_api_key": "sk-team",
                    "models": ["gpt-4o", "claude-*"],
                    "compression": "aggressive",
                    "limits": {
                        "max_context_tokens": 32000,
                        "tokens_per_minute": 200000,
                        "tokens_per_day": 5000000,
                        "requests_per_minute": 600,
                    },
                }
            }
        ),
    )
    team = settings.teams["research"]
    assert team.keys == (HASH,) and team.upstream_api_key == "sk-team"
    assert team.limits == TeamLimits(32000, 200000, 5000000, 600)
    assert team.allows_model("claude-3-5-sonnet") and team.allows_model("gpt-4o")
    assert not team.allows_model("gpt-4o-mini") and not team.allows_model("GPT-4O")


@pytest.mark.parametrize(
    ("team", "named"),
    [
        ({"keys": ["sha256:abc"]}, "teams.t: keys[0] is not a key hash"),
        ({"keys": [KEY]}, "teams.t: keys[0] is not a key hash"),
        ({"keys": [HASH.upper()]}, "keys[0] is not a key hash"),
        ({"keys": []}, "keys must list"),
        ({"keys": [HASH, HASH]}, "same key hash twice"),
        (
            {"keys": [HASH], "limits": {"tokens_per_hour": 5}},
            "unknown config key teams.t.limits.tokens_per_hour",
        ),
        ({"keys": [HASH], "limits": {"tokens_per_minute": -1}}, "teams.t.limits.tokens_per_minute"),
        ({"keys": [HASH], "limits": {"tokens_per_minute": 0}}, "limits.tokens_per_minute must be between"),
        ({"keys": [HASH], "limits": {"tokens_per_minute": True}}, "teams.t.limits.tokens_per_minute"),
        ({"keys": [HASH], "limits": {"tokens_per_day": 10**30}}, "limits.tokens_per_day must be between"),
        ({"keys": [HASH], "limits": {"requests_per_minute": "many"}}, "teams.t.limits.requests_per_minute"),
        ({"keys": [HASH], "limits": {"max_context_tokens": [1]}}, "teams.t.limits.max_context_tokens"),
        ({"keys": [HASH], "limits": "lots"}, "teams.t.limits must be a mapping"),
        ({"keys": [HASH], "compression": "none"}, "compression must be off, auto or aggressive"),
        ({"keys": [HASH], "compression": "x" * 10000}, "compression must be"),
        ({"keys": [HASH], "upstream_api_key": "sk-a\r\nX-Evil: 1"}, "upstream_api_key must be printable"),
        ({"keys": [HASH], "upstream_api_key": {"nested": 1}}, "teams.t.upstream_api_key must be a string"),
        ({"keys": [HASH], "models": [""]}, "models[0] must be a printable pattern"),
        ({"keys": [HASH], "models": ["x" * 300]}, "models[0] must be a printable pattern"),
        ({"keys": [HASH], "models": [[["deep"]]]}, "teams.t.models[0] must be a string"),
        ({"keys": [HASH], "budget": 5}, "unknown config key teams.t.budget"),
        ("just a string", "teams.t must be a mapping"),
    ],
)
def test_bad_team_stops_start_up_naming_the_key(team: Any, named: str) -> None:
    with pytest.raises(ConfigError) as failure:
        load_settings(None, teams_env({"t": team}))
    assert named in str(failure.value)
    assert KEY not in str(failure.value)  # a raw key pasted by mistake is never echoed


@pytest.mark.parametrize("name", ["", "a{b}", "team\nx", "x" * 65, "-lead", "é"])
def test_team_names_must_be_labels_and_hash_tags(name: str) -> None:
    with pytest.raises(ConfigError, match="team name"):
        load_settings(None, teams_env({name: {"keys": [HASH]}}))


def test_a_key_in_two_teams_stops_start_up() -> None:
    with pytest.raises(ConfigError, match="teams a and b list the same key hash"):
        load_settings(None, teams_env({"a": {"keys": [HASH]}, "b": {"keys": [HASH]}}))


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        ("GATEWAY_POLICY_ON_STORE_FAILURE", "sometimes", "on_store_failure must be open or closed"),
        ("GATEWAY_POLICY_STORE_TIMEOUT", "nan", "policy.store_timeout must be a finite number"),
        ("GATEWAY_POLICY_STORE_TIMEOUT", "1e9", "store_timeout must be between"),
        ("GATEWAY_POLICY_BREAKER_COOLDOWN", "-1", "policy.breaker_cooldown must not be negative"),
        ("GATEWAY_POLICY_DEFAULT_OUTPUT_ALLOWANCE", "0", "default_output_allowance must be between"),
        ("GATEWAY_TEAMS", "{not json", "GATEWAY_TEAMS must be JSON"),
        ("GATEWAY_TEAMS", "[1, 2]", "teams must be a mapping"),
    ],
)
def test_bad_policy_settings_name_the_key(name: str, value: str, named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_settings(None, {name: value})


def test_keys_hash_and_lookup() -> None:
    key = new_key()
    assert key != new_key() and len(key) > 40
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", hash_key(key))
    index = KeyIndex(
        load_settings(None, teams_env({"a": {"keys": [HASH]}, "b": {"keys": [hash_key(key)]}})).teams
    )
    assert index.team_for(KEY) == "a" and index.team_for(key) == "b"
    assert index.team_for(KEY + "x") is None and index.team_for("") is None
    assert index.team_for("\udcff") is None  # lone surrogates hash, never raise


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"authorization": f"Bearer {KEY}"}, KEY),
        ({"authorization": f"bearer   {KEY}  "}, KEY),
        ({"api-key": KEY}, KEY),
        ({"x-api-key": KEY}, KEY),
        ({"authorization": "Bearer a", "x-api-key": KEY}, "a"),
        ({"authorization": KEY}, None),
        ({"authorization": f"Basic {KEY}"}, None),
        ({"authorization": "Bearer "}, None),
        ({"authorization": "Bearer " + "k" * 100_000}, None),
        ({"authorization": "Bearer k\x00\x1b[31m"}, "k\x00\x1b[31m"),
        ({}, None),
    ],
)
def test_presented_key_forms(headers: dict[str, str], expected: str | None) -> None:
    assert presented_key(Headers(headers)) == expected


@pytest.mark.parametrize(
    ("microseconds", "text"),
    [
        (0, "0ms"),
        (1, "1ms"),
        (17_400, "18ms"),
        (1_000_000, "1s"),
        (1_500_000, "1.5s"),
        (360_000_000, "6m0s"),
        (3_723_250_000, "1h2m3.25s"),
    ],
)
def test_reset_durations_in_openai_format(microseconds: int, text: str) -> None:
    assert duration(microseconds) == text


def test_output_allowance() -> None:
    assert output_allowance({}, 4096) == 4096
    assert output_allowance({"max_tokens": 100}, 4096) == 100
    assert output_allowance({"max_completion_tokens": 50, "max_tokens": 100}, 4096) == 50
    assert output_allowance({"max_tokens": 100, "n": 3}, 4096) == 300
    for hostile in ({"max_tokens": True}, {"max_tokens": -5}, {"max_tokens": "9"}, {"n": 10**9}, {"n": None}):
        assert output_allowance(hostile, 10) == 10


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_gcra_admits_the_limit_in_a_burst_then_refuses_with_retry_after() -> None:
    limits = TeamLimits(tokens_per_minute=1000, requests_per_minute=50)
    memory = MemoryLimits()

    async def scenario() -> None:
        admitted = 0
        while True:
            decision = await memory.admit("t", limits, 300, requests_only=False)
            if decision.denied:
                break
            admitted += 300
        assert admitted == 900  # never over the limit
        assert decision.denied == "tokens"
        # 200 more tokens need 200/1000 of a minute to come back.
        assert 11_000_000 <= decision.retry_after_us <= 12_100_000
        assert decision.tokens_remaining == 100
        # Settling at 100 used instead of 300 reserved gives 200 back at once.
        await memory.settle("t", limits, decision.day, -200, "gpt-4o", Usage(1, 80, 20))
        assert (await memory.admit("t", limits, 300, requests_only=False)).denied is None
        usage = await memory.usage("t", decision.day)
        assert usage == {"gpt-4o": Usage(1, 80, 20, 0)}

    run(scenario())


def test_daily_budget_and_request_only_checks() -> None:
    limits = TeamLimits(tokens_per_day=500, requests_per_minute=2)
    memory = MemoryLimits()

    async def scenario() -> None:
        assert (await memory.admit("t", limits, 400, requests_only=False)).denied is None
        over = await memory.admit("t", limits, 200, requests_only=False)
        assert over.denied == "day" and over.day_used == 400
        # A request-only route never spends tokens, but the request limit holds.
        assert (await memory.admit("t", limits, 10**9, requests_only=True)).denied is None
        assert (await memory.admit("t", limits, 0, requests_only=True)).denied == "requests"

    run(scenario())


def test_rate_limit_headers_only_for_configured_limits() -> None:
    async def decide(limits: TeamLimits) -> list[tuple[str, str]]:
        decision = await MemoryLimits().admit("t", limits, 10, requests_only=False)
        return rate_limit_headers(limits, decision)

    both = dict(run(decide(TeamLimits(tokens_per_minute=100, requests_per_minute=10))))
    assert both["x-ratelimit-limit-tokens"] == "100" and both["x-ratelimit-remaining-tokens"] == "90"
    assert both["x-ratelimit-limit-requests"] == "10" and both["x-ratelimit-remaining-requests"] == "9"
    assert both["x-ratelimit-reset-tokens"] == "6s" and both["x-ratelimit-reset-requests"] == "6s"
    assert run(decide(TeamLimits(tokens_per_day=100))) == []


# --- streams ----------------------------------------------------------------------------------

IDENTITY = answers.Identity("chatcmpl-1", 1_750_000_000, "gpt-4o")
ANSWER = answers.Answer(text='echo: a streamed answer, with "usage":null quoted inside', tool_call=None)


def stream(include_usage: bool) -> bytes:
    usage = answers.Usage(12, 9)
    return b"".join(answers.chat_events(IDENTITY, answer=ANSWER, usage=usage, include_usage=include_usage))


def test_ask_for_usage() -> None:
    assert ask_for_usage({"stream": True})["stream_options"] == {"include_usage": True}  # type: ignore[index]
    kept = ask_for_usage({"stream_options": {"other": 1}})
    assert kept is not None and kept["stream_options"] == {"other": 1, "include_usage": True}
    assert ask_for_usage({"stream_options": {"include_usage": True}}) is None
    assert ask_for_usage({"stream_options": "yes"}) is None


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=30))
def test_stripped_stream_is_byte_identical_however_it_is_split(cuts: list[int]) -> None:
    with_usage = stream(include_usage=True)
    without = stream(include_usage=False)
    assert with_usage != without
    points = sorted({cut % (len(with_usage) + 1) for cut in cuts})
    pieces = [with_usage[a:b] for a, b in zip([0, *points], [*points, len(with_usage)], strict=True)]
    meter = StreamMeter(strip=True)
    out = b"".join(meter.feed(piece) for piece in pieces) + meter.flush()
    assert out == without
    assert meter.settlement(100, 5) == Usage(1, 12, 9, 5)


def test_meter_without_strip_relays_chunks_untouched_and_still_reads_usage() -> None:
    with_usage = stream(include_usage=True)
    meter = StreamMeter(strip=False)
    pieces = [with_usage[i : i + 37] for i in range(0, len(with_usage), 37)]
    assert [meter.feed(piece) for piece in pieces] == pieces
    assert meter.flush() == b"" and meter.settlement(100, 0) == Usage(1, 12, 9, 0)


def test_a_stream_that_dies_early_settles_with_what_was_counted() -> None:
    events = stream(include_usage=True).split(b"\n\n")
    meter = StreamMeter(strip=True)
    meter.feed(b"\n\n".join(events[:3]) + b"\n\n")
    assert meter.settlement(40, 0) == Usage(1, 40, 3, 0)


ANTHROPIC_TOKENS = {"input_tokens": 505, "cache_read_input_tokens": 40, "output_tokens": 51}


def test_an_anthropic_stream_settles_with_its_own_usage_and_a_cut_one_with_its_prompt() -> None:
    text = {"type": "text", "text": "a streamed answer, " * 12}
    events = anthropic_api.events(IDENTITY, [text], "end_turn", ANTHROPIC_TOKENS)
    meter = StreamMeter(strip=False)
    for event in events:
        meter.feed(event)
    assert meter.settlement(300, 0) == Usage(1, 545, 51, 0)  # input + cache reads; the final output
    cut = StreamMeter(strip=False)
    for event in events[:-3]:  # broken before message_delta: output_tokens 1 was the opening's
        cut.feed(event)
    deltas = sum(b'"delta"' in event for event in events[:-3])
    assert deltas > 1 and cut.settlement(300, 0) == Usage(1, 545, deltas, 0)


def test_a_later_anthropic_usage_restating_the_input_without_its_cache_lowers_nothing() -> None:
    text = {"type": "text", "text": "a streamed answer, " * 12}
    events = anthropic_api.events(IDENTITY, [text], "end_turn", ANTHROPIC_TOKENS)
    restated = [
        event.replace(b'"usage":{"output_tokens":51}', b'"usage":{"input_tokens":505,"output_tokens":51}')
        for event in events
    ]
    assert restated != events
    meter = StreamMeter(strip=False)
    for event in restated:
        meter.feed(event)
    assert meter.settlement(300, 0) == Usage(1, 545, 51, 0)


def test_a_completed_event_too_long_to_hold_still_settles_with_its_usage() -> None:
    """`response.completed` echoes the whole output: an image or a long answer takes it past what the
    meter holds, and it is relayed piece by piece, its usage read from its end."""
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    item["content"] = [{"type": "output_text", "text": "x" * 3_000_000, "annotations": []}]
    events = responses_api.events(IDENTITY, {"model": "gpt-4o"}, [item], answers.Usage(262_000, 9_000))
    stream = b"".join(events)
    for strip in (False, True):
        whole = StreamMeter(strip=strip)
        expected = whole.feed(stream) + whole.flush()  # one piece: held and read as any event
        meter = StreamMeter(strip=strip)
        out = b"".join(meter.feed(stream[at : at + 65_536]) for at in range(0, len(stream), 65_536))
        assert out + meter.flush() == expected  # relayed whole, nothing held back or repeated
        assert meter.settlement(100, 0) == whole.settlement(100, 0) == Usage(1, 262_000, 9_000, 0)
    # The blank line ending it split over two pieces, or never sent: still read.
    end = stream.rindex(b"\n\n")
    for pieces in ([stream[: end + 1], stream[end + 1 :]], [stream[:end]]):
        meter = StreamMeter(strip=False)
        for piece in pieces:
            meter.feed(piece)
        meter.flush()
        assert meter.settlement(100, 0) == Usage(1, 262_000, 9_000, 0)
    # A client's metadata or `user` naming "usage" (echoed after the usage) hides nothing.
    body = {"model": "gpt-4o", "user": "usage", "metadata": {"usage": "x"}}
    echoed = b"".join(responses_api.events(IDENTITY, body, [item], answers.Usage(262_000, 9_000)))
    meter = StreamMeter(strip=False)
    for at in range(0, len(echoed), 65_536):
        meter.feed(echoed[at : at + 65_536])
    assert meter.settlement(100, 0) == Usage(1, 262_000, 9_000, 0)


def test_a_responses_stream_settles_with_the_usage_of_its_completed_event() -> None:
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    item["content"] = [{"type": "output_text", "text": "a streamed answer, " * 12, "annotations": []}]
    events = responses_api.events(IDENTITY, {"model": "gpt-4o"}, [item], answers.Usage(498, 51))
    meter = StreamMeter(strip=False)
    for event in events:
        meter.feed(event)
    assert meter.settlement(300, 7) == Usage(1, 498, 51, 7)


def test_meter_bounds_an_event_that_never_ends() -> None:
    meter = StreamMeter(strip=True)
    out = meter.feed(b"data: " + b"x" * (2 * 1024 * 1024))
    assert len(out) > 2 * 1024 * 1024  # relayed, not held


class _ScanCount:
    """The meter's event-end pattern, counting the bytes each search reads."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern = pattern
        self.scanned = 0

    def search(self, data: bytes) -> re.Match[bytes] | None:
        self.scanned += len(data)
        return self.pattern.search(data)

    def split(self, data: bytes) -> list[bytes]:
        self.scanned += len(data)
        return self.pattern.split(data)

    def findall(self, data: bytes) -> list[bytes]:
        self.scanned += len(data)
        return self.pattern.findall(data)


@pytest.mark.parametrize("strip", [False, True])
def test_a_long_event_in_small_pieces_is_read_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch, strip: bool
) -> None:
    """Each piece was scanned with every byte of its event before it: an event of 1 MB arriving in
    512-byte pieces read ~1 GB (33 s of the event loop). Now each byte is read a few times."""
    from gateway.policy import streams

    counter = _ScanCount(streams._EVENT_END)
    monkeypatch.setattr(streams, "_EVENT_END", counter)
    usage = {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127}
    held = b'data: {"choices":[{"delta":{"content":"' + b"x" * 600_000 + b'"}}],"usage":null}\n\n'
    long = b'data: {"choices":[{"delta":{"content":"' + b"y" * 2_500_000 + b'"}}]}\n\n'  # relayed as it comes
    last = b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n"
    stream = held + long + last
    whole = StreamMeter(strip=strip)
    expected = whole.feed(stream) + whole.flush()
    counter.scanned = 0
    meter = StreamMeter(strip=strip)
    out = b"".join(meter.feed(stream[at : at + 512]) for at in range(0, len(stream), 512)) + meter.flush()
    assert out == expected
    assert meter.settlement(1, 0) == whole.settlement(1, 0) == Usage(1, 120, 7, 0)
    assert counter.scanned <= 4 * len(stream)
    assert len(meter._long_tail.value() if meter._long_tail else b"") <= streams.LONG_EVENT_TAIL


def test_usage_null_spacing_variants_are_removed() -> None:
    spaced = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None}
    event = b"data: " + json.dumps(spaced).encode() + b"\n\n"
    first = b'data: {"usage": null, "id": "c"}\n\n'
    meter = StreamMeter(strip=True)
    assert b"usage" not in meter.feed(event) and b"usage" not in meter.feed(first)
    assert orjson.loads(meter.feed(first)[6:]) == {"id": "c"}


def test_teams_count_as_gateway_keys_for_the_open_relay_check() -> None:
    exposed = {"GATEWAY_SERVER_HOST": "0.0.0.0", "GATEWAY_UPSTREAM_API_KEY": "sk-org"}
    with pytest.raises(ConfigError, match="open relay"):
        load_settings(None, exposed)
    assert load_settings(None, {**exposed, **teams_env({"a": {"keys": [HASH]}})}).teams["a"].keys == (HASH,)


def test_breaker_opens_after_failures_in_a_row_and_retries_after_the_cooldown() -> None:
    from gateway.store.breaker import BREAKER_THRESHOLD, CircuitBreaker

    breaker = CircuitBreaker(cooldown=0.05, what="team limit store")
    for _ in range(BREAKER_THRESHOLD - 1):
        breaker.failed(TimeoutError(), "memory")
        assert breaker.allows()  # one late call does not hand the cooldown to per-replica limits
    breaker.succeeded()
    for _ in range(BREAKER_THRESHOLD - 1):
        breaker.failed(TimeoutError(), "memory")
    assert breaker.allows()
    breaker.failed(TimeoutError(), "memory")
    assert not breaker.allows()
    import time

    time.sleep(0.06)
    assert breaker.allows()  # half-open: one try, and one more failure opens it again
    assert not breaker.allows()  # the others wait for that try
    breaker.failed(ConnectionError(), "memory")
    assert not breaker.allows()
    time.sleep(0.06)
    assert breaker.allows()
    breaker.succeeded()  # closed again: everyone through
    assert breaker.allows() and breaker.allows()


def test_keys_commands(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from gateway.cli import main

    assert main(["keys", "new"]) == 0
    lines = dict(
        line.split(":  ", 1) if line.startswith("key:") else line.split(": ", 1)
        for line in capsys.readouterr().out.splitlines()
    )
    assert lines["hash"] == hash_key(lines["key"]) and lines["key"].startswith("cgw-")
    assert main(["keys", "hash", KEY]) == 0
    assert capsys.readouterr().out.strip() == HASH
    monkeypatch.setattr("sys.stdin", io.StringIO(KEY + "\n"))
    assert main(["keys", "hash", "-"]) == 0
    assert capsys.readouterr().out.strip() == HASH
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert main(["keys", "hash", "-"]) == 2
    assert "the key is empty" in capsys.readouterr().err


def test_keys_hash_hashes_only_what_a_request_can_present(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from gateway.cli import main

    # Spaces around the key are stripped from the argument as from stdin and from a presented key.
    assert main(["keys", "hash", f"  {KEY}\t"]) == 0
    assert capsys.readouterr().out.strip() == HASH
    presented = presented_key(Headers({"authorization": f"Bearer  {KEY} "}))
    assert presented is not None and hash_key(presented) == HASH
    monkeypatch.setattr("sys.stdin", io.StringIO(f" {KEY} \n"))
    assert main(["keys", "hash", "-"]) == 0
    assert capsys.readouterr().out.strip() == HASH
    # What the gateway refuses, or what a header cannot carry as given, is never hashed.
    longest = "k" * MAX_PRESENTED_KEY
    assert presented_key(Headers({"x-api-key": longest + "k"})) is None
    assert main(["keys", "hash", longest]) == 0
    assert capsys.readouterr().out.strip() == hash_key(longest)
    for key, named in [("k" * 513, "over 512"), ("   ", "empty"), ("cgw-clé", "ASCII"), ("a\x1bb", "ASCII")]:
        assert main(["keys", "hash", key]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and named in captured.err


@pytest.mark.parametrize("team", ["research", "a", "t.e_a-m9", "x" * 64])
def test_every_key_of_a_team_hashes_to_one_cluster_slot(team: str) -> None:
    from redis.crc import key_slot

    from gateway.policy.limits import limit_keys, usage_key

    keys = [*limit_keys(team), usage_key(team, 20_000)]
    assert len({key_slot(key.encode()) for key in keys}) == 1
    assert all(f"{{team:{team}}}" in key for key in keys)


@settings(max_examples=300, deadline=None)
@given(
    value=st.text(max_size=2000), scheme=st.sampled_from(["Bearer ", "bearer ", "Basic ", "", " Bearer  "])
)
def test_any_authorization_value_finds_no_team_without_raising(value: str, scheme: str) -> None:
    index = KeyIndex(load_settings(None, teams_env({"a": {"keys": [HASH]}})).teams)
    header = (scheme + value).encode("utf-8", errors="surrogatepass").decode("latin-1")
    key = presented_key(Headers(raw=[(b"authorization", header.encode("latin-1"))]))
    assert key is None or index.team_for(key) in (None, "a")
    assert (key is not None and index.team_for(key) == "a") == (key == KEY)


def test_a_replica_share_of_the_limits() -> None:
    from gateway.policy.replicas import share

    limits = TeamLimits(
        max_context_tokens=32000, tokens_per_minute=1001, tokens_per_day=None, requests_per_minute=3
    )
    assert share(limits, 1) is limits
    assert share(limits, 2) == TeamLimits(32000, 501, None, 2)
    assert share(limits, 10) == TeamLimits(32000, 101, None, 1)  # never below one request


def test_a_usage_is_held_to_what_one_request_could_use_where_the_window_is_known() -> None:
    """Twice the window where this upstream's window is known; where the model map matched the
    name by spelling alone (Llama-3.3-70B-Instruct: 12,288, against the 131,072 it serves), the
    ceiling charged real usage a fifth of itself: no window but the largest any model has."""
    runtime = Runtime.create(
        load_settings(None, {"GATEWAY_MODELS": '{"my-llama": {"context_window": 8000}}'})
    )
    assert usage_ceiling(runtime, "gpt-4o") == 2 * 128_000
    assert usage_ceiling(runtime, "my-llama") == 16_000
    for guessed in ("Llama-3.3-70B-Instruct", "never-heard-of-it", ""):
        assert usage_ceiling(runtime, guessed) == LARGEST_WINDOW
    assert Usage(1, 999_999_999, 5).within(256_000) == Usage(1, 256_000, 5)
