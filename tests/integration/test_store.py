"""The store behind learned windows and calibration: in memory, and a real Redis shared by replicas."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.policy.keys import hash_key
from gateway.runtime import Runtime
from gateway.settings import load_settings
from gateway.store import MemoryStore, Store, open_store
from gateway.store.redis import STORE_ERRORS, RedisStore
from gateway.tokens.learned_windows import Evidence, LearnedWindows, learned_key
from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        backend: Store = MemoryStore()
    else:
        backend = RedisStore(request.getfixturevalue("redis_url"), timeout=1.0, cooldown=1.0)
    yield backend
    await backend.close()


def _key() -> str:
    return f"test:{uuid.uuid4().hex}"


async def test_get_set_roundtrip(store: Store) -> None:
    key = _key()
    assert await store.get(key) is None
    await store.set(key, "value-1")
    assert await store.get(key) == "value-1"
    await store.set(key, "value-2")
    assert await store.get(key) == "value-2"


async def test_the_memory_store_stays_bounded_and_keeps_what_is_used() -> None:
    """Each invented model name left a record behind, without end. Past its bounds the store
    drops what was used least recently, in entries and in characters alike."""
    store = MemoryStore(max_entries=100, max_chars=10_000)
    await store.set("window:learned:gpt-4o", "128000")
    for n in range(20_000):
        await store.set(f"window:discovered:invented-{n}", "{}", ttl_seconds=3600)
        if n % 50 == 0:
            assert await store.get("window:learned:gpt-4o") == "128000"  # in use: kept
    assert len(await store.keys("window:", 1_000)) == 100
    assert await store.get("window:discovered:invented-0") is None
    await store.set("summary:big", "x" * 9_000)
    assert len(await store.keys("window:", 1_000)) < 100  # characters count too
    assert await store.get("summary:big") == "x" * 9_000
    await store.set("summary:big", "short")  # replaced: its old size no longer counts
    for n in range(100):
        await store.set(f"window:discovered:again-{n}", "{}")
    assert await store.get("summary:big") is None
    assert len(await store.keys("window:", 1_000)) == 100


async def test_ttl_expires(store: Store) -> None:
    key = _key()
    await store.set(key, "short-lived", ttl_seconds=1)
    assert await store.get(key) == "short-lived"
    await asyncio.sleep(1.2)
    assert await store.get(key) is None


async def test_a_lock_has_one_holder_and_only_its_holder_releases_it(store: Store) -> None:
    key = _key()
    assert await store.add(key, "token-a", 5) is True
    assert await store.add(key, "token-b", 5) is False  # taken
    await store.remove_if(key, "token-b")  # not the holder: nothing happens
    assert await store.get(key) == "token-a"
    await store.remove_if(key, "token-a")
    assert await store.get(key) is None
    assert await store.add(key, "token-b", 1) is True
    await asyncio.sleep(1.2)  # an abandoned lock expires
    assert await store.add(key, "token-c", 5) is True


async def test_ping(store: Store) -> None:
    assert await store.ping() is True


def test_open_store_picks_backend(redis_url: str) -> None:
    assert isinstance(open_store(None, timeout=1.0, cooldown=1.0), MemoryStore)
    assert isinstance(open_store("", timeout=1.0, cooldown=1.0), MemoryStore)
    assert isinstance(open_store(redis_url, timeout=1.0, cooldown=1.0), RedisStore)


def test_replicas_share_learned_window_through_redis(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, redis_url: str
) -> None:
    """An overflow learned by one replica makes another fit ahead of time."""
    model = f"replica-model-{uuid.uuid4().hex[:8]}"
    fake_upstream.window = 3000
    first = start_gateway(GATEWAY_REDIS_URL=redis_url)
    second = start_gateway(GATEWAY_REDIS_URL=redis_url)
    long_history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "lorem ipsum dolor " * 150}
        for i in range(12)
    ]
    body = {"model": model, "messages": [*long_history, {"role": "user", "content": "latest question"}]}
    learned = httpx.post(f"{first}/chat/completions", json=body, timeout=30)
    assert int(learned.headers["x-gateway-prompt-tokens-before"]) > fake_upstream.window
    assert learned.status_code == 200
    assert learned.headers["x-gateway-retry"] == "overflow"
    hits_before = fake_upstream.hits["/v1/chat/completions"]
    ahead = httpx.post(f"{second}/chat/completions", json=body, timeout=30)
    assert ahead.status_code == 200
    assert "x-gateway-retry" not in ahead.headers
    assert ahead.headers["x-gateway-compression"] != "none"
    assert fake_upstream.hits["/v1/chat/completions"] == hits_before + 1


@pytest.mark.parametrize(
    ("teams", "on_failure", "status"),
    [(False, "closed", 200), (True, "open", 200), (True, "closed", 503)],
)
def test_readyz_needs_redis_only_where_requests_do(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, teams: bool, on_failure: str, status: int
) -> None:
    environ = {"GATEWAY_REDIS_URL": "redis://127.0.0.1:1/0", "GATEWAY_POLICY_ON_STORE_FAILURE": on_failure}
    if teams:
        team = {"keys": [hash_key(TEAM_KEY)], "limits": {"requests_per_minute": 100}}
        environ["GATEWAY_TEAMS"] = json.dumps({"research": team})
    url = start_gateway(**environ)
    ready = httpx.get(url.removesuffix("/v1") + "/readyz")
    assert ready.status_code == status
    assert ready.json() == {"status": "ready" if status == 200 else "not ready", "store": "unreachable"}
    assert httpx.get(url.removesuffix("/v1") + "/healthz").status_code == 200
    # What readiness promises: a ready gateway serves; a not-ready one would refuse with 503.
    answer = httpx.post(
        f"{url}/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {TEAM_KEY}"},
        timeout=30,
    )
    assert answer.status_code == status


TEAM_KEY = "cgw-ready-team-key-0001"


def test_readyz_with_redis_up(start_gateway: GatewayFactory, redis_url: str) -> None:
    url = start_gateway(GATEWAY_REDIS_URL=redis_url)
    ready = httpx.get(url.removesuffix("/v1") + "/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "store": "ok"}


class SlowStore(MemoryStore):
    """A store whose reads take a while, as Redis does across a network."""

    async def get(self, key: str) -> str | None:
        await asyncio.sleep(0.05)
        return await super().get(key)


async def test_concurrent_first_requests_all_wait_for_the_one_store_read() -> None:
    """A worker's first burst of requests for a model must all see what another replica learned,
    not only the one that happened to start the read."""
    model = f"burst-model-{uuid.uuid4().hex[:8]}"
    store = SlowStore()
    replica = LearnedWindows()
    replica.put(model, Evidence(stated=5000, expires_at=time.time() + 3600))
    await replica.save(store, model)
    runtime = Runtime.create(load_settings(None, {}))
    runtime.store = store

    async def first_request() -> int | None:
        await runtime.load_learned(model)
        return runtime.windows.resolve_window(model).tokens

    assert await asyncio.gather(*(first_request() for _ in range(6))) == [5000] * 6


async def test_a_silent_redis_costs_a_few_bounded_waits_then_none(caplog: pytest.LogCaptureFixture) -> None:
    """Redis accepting connections and never answering (a stall, a black-holed route): each read
    fails at the store's bound, and once the breaker opens reads fail at once, reaching nothing."""
    accepted: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # never answers

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = RedisStore(f"redis://127.0.0.1:{port}/0", timeout=0.2, cooldown=30.0)
    try:
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(STORE_ERRORS):
                await store.get("window:gpt-4o")
            assert time.monotonic() - started < 1.5  # the bound, not redis-py's own socket timeout
        reached = len(accepted)
        for _ in range(20):
            with pytest.raises(STORE_ERRORS):
                await store.get("window:gpt-4o")
        assert len(accepted) == reached  # the breaker is open: no more waits
        # Requests for many models meanwhile go on with what this replica knows, and the log
        # says so once (the breaker's line), not once per model.
        runtime = Runtime.create(load_settings(None, {}))
        runtime.store = store
        with caplog.at_level(logging.WARNING):
            for model in range(30):
                await runtime.load_learned(f"model-{model}")
        assert not [record for record in caplog.records if "could not read" in record.getMessage()]
    finally:
        await store.close()
        for writer in accepted:
            writer.close()
        server.close()


async def test_a_window_learned_in_memory_survives_its_record_being_evicted() -> None:
    """Without Redis, 10,000 newer records (discoveries of invented model names) evicted a
    learned window's record, and the next refresh read its absence as `windows forget`: the
    gateway went back to its guess and the next long prompt overflowed again."""
    store = MemoryStore(max_entries=50)
    learned = LearnedWindows()
    learned.put("small-model", Evidence(stated=8192, expires_at=time.time() + 3600))
    await learned.save(store, "small-model")
    for n in range(100):
        await store.set(f"window:discovered:invented-{n}", "{}")
    assert await store.get(learned_key("small-model")) is None  # evicted
    await learned.load(store, "small-model")
    evidence = learned.get("small-model")
    assert evidence is not None and evidence.stated == 8192
