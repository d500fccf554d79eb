"""The policy a route applies: who is calling, may it, reserve before forwarding, settle after.

Route-agnostic: a route calls `authenticate`, then `admit` (with the tokens it is about to send
and the output it allows, or none for request-only routes), forwards, then `settle` with what
the upstream reported. Redis is the shared engine; each call to it is bounded by
``policy.store_timeout``, and a call that fails gets the failure policy (fail open: this
replica's share of the limits, in memory, see replicas.py; fail closed: 503). A circuit
breaker (gateway/store/breaker.py) opens after a few failures in a row: Redis is then left alone
for ``policy.breaker_cooldown`` seconds and every check gets the failure policy at once, so an
outage adds at most a few bounded waits per cooldown, per replica.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.datastructures import Headers

from gateway import metrics
from gateway.chat_request import CompressionMode
from gateway.policy import answers
from gateway.policy.config import COMPRESSION_MODES, PolicySettings, TeamLimits, TeamSettings
from gateway.policy.keys import KEY_HEADERS, KeyIndex, presented_key
from gateway.policy.limits import DAY_SECONDS, Decision, MemoryLimits, RedisLimits, Usage
from gateway.policy.replicas import ReplicaCount, share
from gateway.store.breaker import CircuitBreaker
from gateway.store.redis import STORE_ERRORS

log = logging.getLogger("gateway.policy")


@dataclass(frozen=True)
class Team:
    name: str
    settings: TeamSettings

    def compression_mode(self, asked: CompressionMode | None) -> CompressionMode:
        """The team's mode, or the request's when it asks for more (never less)."""
        own: CompressionMode = self.settings.compression  # type: ignore[assignment]
        if asked is None:
            return own
        return max(own, asked, key=COMPRESSION_MODES.index)


@dataclass
class Admission:
    """An admitted request: what it reserved, where, and the headers that report it."""

    team: Team
    reserved: int
    day: int
    backend: MemoryLimits | RedisLimits
    # The limits the check applied: the team's, or this replica's share of them in memory.
    limits: TeamLimits
    headers: list[tuple[str, str]] = field(default_factory=list)
    settled: bool = False


class Policy:
    def __init__(
        self, teams: Mapping[str, TeamSettings], settings: PolicySettings, redis_url: str | None
    ) -> None:
        self.teams = {name: Team(name, team) for name, team in teams.items()}
        self.settings = settings
        self._keys = KeyIndex(teams)
        self._memory = MemoryLimits()
        self._redis = RedisLimits(redis_url, timeout=settings.store_timeout) if redis_url and teams else None
        self._breaker = CircuitBreaker(settings.breaker_cooldown, "team limit store")
        self._replicas = ReplicaCount(self._redis.client, settings.store_timeout) if self._redis else None

    def authenticate(self, headers: Headers) -> Team | None:
        """The caller's team; None when no teams are configured (the caller's key passes through)."""
        if not self.teams:
            return None
        key = presented_key(headers)
        name = self._keys.team_for(key) if key is not None else None
        if name is None:
            metrics.POLICY_UNAUTHORIZED.inc()
            raise answers.unauthorized(presented=any(header in headers for header in KEY_HEADERS))
        return self.teams[name]

    def check_model(self, team: Team, model: str) -> None:
        if not team.settings.allows_model(model):
            metrics.TEAM_REQUESTS.labels(team.name, "model_not_allowed").inc()
            raise answers.model_not_allowed(team.name, model) if model else answers.model_unnamed(team.name)

    async def admit(self, team: Team, tokens: int | None) -> Admission:
        """Check the team's limits and reserve ``tokens`` (None: a request-only route), atomically."""
        limits = team.settings.limits
        cost = tokens or 0
        if tokens is not None:
            for kind, limit in (("minute", limits.tokens_per_minute), ("day", limits.tokens_per_day)):
                if limit and cost > limit:
                    metrics.TEAM_REQUESTS.labels(team.name, "too_large").inc()
                    raise answers.too_large(team.name, kind, limit, cost, [])
        if not (limits.requests_per_minute or limits.tokens_per_minute or limits.tokens_per_day):
            # Nothing to check: no round trip; the settlement still records usage.
            metrics.TEAM_REQUESTS.labels(team.name, "admitted").inc()
            day = int(time.time() // DAY_SECONDS)
            backend = self._redis if self._redis is not None and self._breaker.allows() else self._memory
            return Admission(team, cost, day, backend, limits)
        decision, backend, applied = await self._call_admit(team, cost, requests_only=tokens is None)
        headers = answers.rate_limit_headers(applied, decision)
        if decision.denied is not None:
            outcome = "quota_exceeded" if decision.denied == "day" else "rate_limited"
            metrics.TEAM_REQUESTS.labels(team.name, outcome).inc()
            raise answers.over_limit(team.name, applied, decision, cost, headers)
        metrics.TEAM_REQUESTS.labels(team.name, "admitted").inc()
        return Admission(team, cost, decision.day, backend, applied, headers)

    async def _call_admit(
        self, team: Team, tokens: int, *, requests_only: bool
    ) -> tuple[Decision, MemoryLimits | RedisLimits, TeamLimits]:
        """The decision, where it was made, and the limits it applied."""
        limits = team.settings.limits
        if self._redis is not None and self._breaker.allows():
            try:
                async with asyncio.timeout(self.settings.store_timeout):
                    decision = await self._redis.admit(team.name, limits, tokens, requests_only=requests_only)
                self._breaker.succeeded()
                return decision, self._redis, limits
            except STORE_ERRORS as exc:
                metrics.POLICY_STORE_FAILURES.inc()
                self._breaker.failed(exc, self._fallback_name())
        if self._replicas is not None:  # Redis is configured but did not answer
            if self.settings.on_store_failure == "closed":
                metrics.TEAM_REQUESTS.labels(team.name, "store_unavailable").inc()
                raise answers.store_unavailable()
            metrics.POLICY_FALLBACKS.inc()
            limits = share(limits, self._replicas.known)
        decision = await self._memory.admit(team.name, limits, tokens, requests_only=requests_only)
        return decision, self._memory, limits

    def _fallback_name(self) -> str:
        return (
            "answering 503"
            if self.settings.on_store_failure == "closed"
            else "each replica's share of the limits in memory"
        )

    async def settle(self, admission: Admission, model: str, usage: Usage) -> None:
        """Replace the reservation by what was used, and record the usage. Never raises."""
        if admission.settled:
            return
        admission.settled = True
        team = admission.team
        used = usage.prompt + usage.completion
        for kind, value in (
            ("prompt", usage.prompt),
            ("completion", usage.completion),
            ("saved", usage.saved),
        ):
            if value:
                metrics.TEAM_TOKENS.labels(team.name, kind).inc(value)
        delta = used - admission.reserved
        backend = admission.backend
        try:
            async with asyncio.timeout(self.settings.store_timeout):
                await backend.settle(team.name, admission.limits, admission.day, delta, model, usage)
            if backend is self._redis:
                self._breaker.succeeded()
        except STORE_ERRORS as exc:
            # The reservation stays charged (over-counts, never under): the safe side.
            metrics.POLICY_STORE_FAILURES.inc()
            self._breaker.failed(exc, "settlement lost")

    async def charge(self, team: Team, model: str, prompt: int, completion: int) -> None:
        """Record tokens the gateway spent for the team on its own (a summary of its conversation):
        they count against its token limits from now on, as usage of ``model``. Never refused, it
        is spent already; never raises."""
        backend = self._redis if self._redis is not None and self._breaker.allows() else self._memory
        day = int(time.time() // DAY_SECONDS)
        admission = Admission(team, 0, day, backend, team.settings.limits)
        await self.settle(admission, model, Usage(requests=1, prompt=prompt, completion=completion))

    async def start(self) -> None:
        if self._redis is None:
            return
        try:
            async with asyncio.timeout(max(1.0, self.settings.store_timeout)):
                await self._redis.warm_up()
        except STORE_ERRORS as exc:
            # Not fatal: requests follow the failure policy until Redis answers.
            log.warning("team limit store not reachable at start-up (%s)", type(exc).__name__)
        if self._replicas is not None:
            await self._replicas.beat()
            self._replicas.start()

    async def usage(self, team: str, day: int) -> dict[str, Usage]:
        backend = self._redis if self._redis is not None else self._memory
        return await backend.usage(team, day)

    async def close(self) -> None:
        await self._memory.close()
        if self._replicas is not None:
            await self._replicas.stop()
        if self._redis is not None:
            await self._redis.close()
