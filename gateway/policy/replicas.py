"""How many replicas share the limits, so a replica left alone by Redis takes only its share.

Each replica records itself in one Redis sorted set every HEARTBEAT_SECONDS (score: Redis'
clock) and reads how many did within REPLICA_TTL_SECONDS. When Redis fails and limits fall
back to memory (fail open), each replica enforces limit / replicas: together they stay near
one budget, instead of admitting the budget once per replica, as gateways that fall back to
plain per-process limits do. The count is the last one seen before the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import uuid

import redis.asyncio as redis_asyncio
from redis.exceptions import RedisError

from gateway.policy.config import TeamLimits
from gateway.policy.limits import REDIS_PREFIX

HEARTBEAT_SECONDS = 10.0
REPLICA_TTL_SECONDS = 30
REPLICAS_KEY = REDIS_PREFIX + "replicas"

_BEAT = """
local now = tonumber(redis.call('TIME')[1])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return redis.call('ZCARD', KEYS[1])
"""


class ReplicaCount:
    def __init__(self, client: redis_asyncio.Redis, timeout: float) -> None:
        self.known = 1
        self._id = uuid.uuid4().hex
        self._beat = client.register_script(_BEAT)
        self._timeout = timeout
        self._task: asyncio.Task[None] | None = None

    async def beat(self) -> None:
        """Record this replica and read the count; on failure the last count stands."""
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(self._timeout):
                self.known = max(
                    1, int(await self._beat(keys=[REPLICAS_KEY], args=[self._id, REPLICA_TTL_SECONDS]))
                )

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(HEARTBEAT_SECONDS)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def share(limits: TeamLimits, replicas: int) -> TeamLimits:
    """One replica's share of the rate limits (at least 1 of each); the context cap is not shared."""
    if replicas <= 1:
        return limits

    def part(value: int | None) -> int | None:
        return None if value is None else max(1, math.ceil(value / replicas))

    return dataclasses.replace(
        limits,
        tokens_per_minute=part(limits.tokens_per_minute),
        tokens_per_day=part(limits.tokens_per_day),
        requests_per_minute=part(limits.requests_per_minute),
    )
