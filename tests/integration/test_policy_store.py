"""The Redis scripts and the memory fallback run the same arithmetic: same sequence, same answers."""

from __future__ import annotations

import asyncio
import time
import uuid

from gateway.policy.config import PolicySettings, TeamLimits, TeamSettings
from gateway.policy.enforcer import Policy
from gateway.policy.limits import MemoryLimits, RedisLimits, Usage

LIMITS = TeamLimits(tokens_per_minute=60, tokens_per_day=150, requests_per_minute=6)
# (tokens or None for a request-only check, settlement delta after it)
STEPS = [(20, -10), (30, 0), (None, 0), (25, 5), (40, 0), (None, 0), (10, -10), (5, 0), (None, 0), (50, 0)]


async def replay(limits: RedisLimits | MemoryLimits, team: str) -> list[tuple[str | None, int, int, int]]:
    seen = []
    for tokens, delta in STEPS:
        decision = await limits.admit(team, LIMITS, tokens or 0, requests_only=tokens is None)
        seen.append(
            (decision.denied, decision.tokens_remaining, decision.requests_remaining, decision.day_used)
        )
        if decision.denied is None and tokens is not None:
            usage = Usage(1, tokens + delta, 0, 3)
            await limits.settle(team, LIMITS, decision.day, delta, "gpt-4o", usage)
    return seen


def test_redis_and_memory_agree(redis_url: str) -> None:
    team = "parity" + uuid.uuid4().hex[:8]

    async def both() -> tuple[list[tuple[str | None, int, int, int]], ...]:
        shared = RedisLimits(redis_url, timeout=2.0)
        try:
            from_redis = await replay(shared, team)
            from_memory = await replay(MemoryLimits(), team)
            usage = await shared.usage(team, int(time.time()) // 86400)
        finally:
            await shared.close()
        settled = [
            tokens + delta
            for (tokens, delta), step in zip(STEPS, from_redis, strict=True)
            if tokens is not None and step[0] is None
        ]
        assert usage == {"gpt-4o": Usage(len(settled), sum(settled), 0, 3 * len(settled))}
        return from_redis, from_memory

    from_redis, from_memory = asyncio.run(both())
    assert [step[0] for step in from_redis] == [step[0] for step in from_memory]
    assert "tokens" in [step[0] for step in from_redis] and "requests" in [step[0] for step in from_redis]
    for shared, local in zip(from_redis, from_memory, strict=True):
        # A token a second flows back: the two runs, a few milliseconds apart, may differ by one.
        assert abs(shared[1] - local[1]) <= 1 and shared[2:] == local[2:]


def test_a_refund_to_nothing_frees_the_budget_in_redis_as_in_memory(redis_url: str) -> None:
    """An upstream error settles at zero: the whole reservation flows back at once, in both backends."""
    limits = TeamLimits(tokens_per_minute=1_000)
    team = "refund" + uuid.uuid4().hex[:8]

    async def twice(backend: RedisLimits | MemoryLimits) -> list[str | None]:
        denied = []
        for _ in range(2):
            decision = await backend.admit(team, limits, 900, requests_only=False)
            denied.append(decision.denied)
            await backend.settle(team, limits, decision.day, -900, "gpt-4o", Usage(requests=1))
        return denied

    async def both() -> tuple[list[str | None], list[str | None]]:
        shared = RedisLimits(redis_url, timeout=2.0)
        try:
            return await twice(shared), await twice(MemoryLimits())
        finally:
            await shared.close()

    assert asyncio.run(both()) == ([None, None], [None, None])


def test_a_burst_beyond_the_connection_pool_waits_for_redis_rather_than_failing(redis_url: str) -> None:
    """More checks in flight than the client has connections: each waits its turn (within its bound),
    and Redis alone decides, so the budget holds."""
    limits = TeamLimits(tokens_per_minute=20_000)
    team = "burst" + uuid.uuid4().hex[:8]

    async def burst() -> list[str | None]:
        shared = RedisLimits(redis_url, timeout=5.0)
        try:
            decisions = await asyncio.gather(
                *(shared.admit(team, limits, 1_000, requests_only=False) for _ in range(300))
            )
        finally:
            await shared.close()
        return [decision.denied for decision in decisions]

    denied = asyncio.run(burst())
    admitted = denied.count(None)
    assert 20 <= admitted <= 21  # the budget and the second's refill, not a fallback's fresh one


def test_a_team_without_limits_settles_in_memory_while_the_breaker_is_open() -> None:
    """Such a team's answers are only recorded: with Redis known to be down, no settlement waits
    on it (each used to wait its full bound, and pushed the cooldown out again)."""

    async def run() -> tuple[bool, int]:
        accepted: list[asyncio.StreamWriter] = []

        async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)  # a stalled Redis: never answers

        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        settings = PolicySettings(store_timeout=0.2, breaker_cooldown=30.0)
        policy = Policy(
            {"free": TeamSettings(keys=("sha256:" + "0" * 64,))}, settings, f"redis://127.0.0.1:{port}/0"
        )
        team = policy.teams["free"]
        try:
            for _ in range(3):  # three settlements fail: the breaker opens
                await policy.settle(await policy.admit(team, 10), "gpt-4o", Usage(1, 10, 1, 0))
            reached = len(accepted)
            started = time.monotonic()
            for _ in range(10):
                await policy.settle(await policy.admit(team, 10), "gpt-4o", Usage(1, 10, 1, 0))
            return len(accepted) == reached, round(time.monotonic() - started)
        finally:
            await policy.close()
            for writer in accepted:
                writer.close()
            server.close()

    untouched, seconds = asyncio.run(run())
    assert untouched and seconds == 0
