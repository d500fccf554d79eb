"""Team limits: per-minute limits by GCRA, a daily token budget, usage records; Redis or memory.

GCRA (the generic cell rate algorithm) keeps one number per limit, the "theoretical arrival
time" (TAT): the moment the limit would be back to full. A request of cost c is admitted when
``max(TAT, now) + c·T - period <= now`` (T = period / limit) and moves TAT to that sum. It is
exact (no burst of twice the limit across a window boundary, as fixed windows allow; no
approximation, as the two-bucket sliding-window counter makes), needs no per-request state (a
sliding log keeps every request), gives Retry-After and the reset time directly, and settling a
reservation is one addition to TAT (a refund moves it back, never below now).

The daily budget is a calendar day (UTC) by the store's clock: a counter that starts again when
the day changes, as a quota that "resets at midnight" is understood.

Both backends run the same arithmetic. In Redis it runs as Lua scripts, atomically, on Redis'
own clock (``TIME``), so every replica enforces one budget whatever their clocks say; every key
of a team carries the hash tag ``{team:NAME}`` so the scripts also run on Redis Cluster. The
memory backend serves one process (no Redis configured, or Redis down under fail-open).
"""

from __future__ import annotations

import datetime
import math
import re
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.policy.config import TeamLimits
from gateway.store.redis import bounded_client

PERIOD_US = 60_000_000
DAY_SECONDS = 86_400
REDIS_PREFIX = "context-gateway:"
# Usage records are kept this long (days): a year of reports, then they expire.
USAGE_RETENTION_DAYS = 400
# Distinct models recorded per team and day; further models count under "(other)".
USAGE_MAX_MODELS = 200
OTHER_MODEL = "(other)"
USAGE_FIELDS = ("requests", "prompt", "completion", "saved")
# A count as HINCRBY writes it: a signed 64-bit integer in ASCII digits (str.isdigit takes "²").
USAGE_COUNT = re.compile(r"-?[0-9]{1,19}")

Denied = Literal["requests", "tokens", "day"]
_DENIED: dict[int, Denied] = {1: "requests", 2: "tokens", 3: "day"}


@dataclass(frozen=True)
class Decision:
    """What a check found. Remaining and reset describe the state after it (before it when denied)."""

    denied: Denied | None
    retry_after_us: int
    requests_remaining: int
    requests_reset_us: int
    tokens_remaining: int
    tokens_reset_us: int
    # Tokens of the daily budget used before this request, and the store's day (days since 1970).
    day_used: int
    day: int


@dataclass(frozen=True)
class Usage:
    requests: int = 0
    prompt: int = 0
    completion: int = 0
    saved: int = 0

    def within(self, ceiling: int) -> Usage:
        """The usage with each count held to `ceiling` (what one request could use at most)."""
        return replace(self, prompt=min(self.prompt, ceiling), completion=min(self.completion, ceiling))


def team_tag(team: str) -> str:
    return f"{REDIS_PREFIX}{{team:{team}}}:"


def limit_keys(team: str) -> tuple[str, str, str]:
    """The team's requests TAT, tokens TAT and day hash: one hash tag, so one cluster slot."""
    tag = team_tag(team)
    return tag + "rpm", tag + "tpm", tag + "day"


def usage_key(team: str, day: int) -> str:
    return f"{team_tag(team)}usage:{day_name(day)}"


def day_name(day: int) -> str:
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day)).isoformat()


def day_number(name: str) -> int:
    """Days since 1970 of an ISO date; ValueError if it is not one."""
    return (datetime.date.fromisoformat(name) - datetime.date(1970, 1, 1)).days


def _limit(value: int | None) -> int:
    return value or 0


# ---- Redis ---------------------------------------------------------------------------------------

# KEYS: requests TAT, tokens TAT, day hash. ARGV: rpm, tpm, daily limit (0 = none), tokens.
# Returns: denied (0 none, 1 requests, 2 tokens, 3 day), retry_after_us, requests remaining,
# requests reset_us, tokens remaining, tokens reset_us, day used before, day.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local day = math.floor(tonumber(t[1]) / 86400)
local period = 60000000
local function gcra(key, limit, cost)
  if limit <= 0 then return nil end
  local interval = period / limit
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  return {tat, tat + cost * interval, interval}
end
local function remaining(state, limit, at)
  if state == nil then return {-1, 0} end
  return {math.max(0, math.floor((now + period - at) / state[3] + 1e-6)), math.ceil(at - now)}
end
local rpm, tpm, daily, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local r = gcra(KEYS[1], rpm, 1)
local k = gcra(KEYS[2], tpm, tokens)
local stored_day = tonumber(redis.call('HGET', KEYS[3], 'day') or -1)
local used = 0
if stored_day == day then used = tonumber(redis.call('HGET', KEYS[3], 'used') or 0) end
local denied, retry = 0, 0
if r and r[2] - period > now then denied, retry = 1, r[2] - period - now end
if denied == 0 and k and k[2] - period > now then denied, retry = 2, k[2] - period - now end
if denied == 0 and daily > 0 and used + tokens > daily then
  denied, retry = 3, (day + 1) * 86400000000 - now
end
if denied == 0 then
  if r then
    redis.call('SET', KEYS[1], string.format('%.0f', r[2]), 'PX', math.ceil((r[2] - now) / 1000) + 1000)
  end
  if k and tokens > 0 then
    redis.call('SET', KEYS[2], string.format('%.0f', k[2]), 'PX', math.ceil((k[2] - now) / 1000) + 1000)
  end
  if daily > 0 and tokens > 0 then
    redis.call('HSET', KEYS[3], 'day', day, 'used', used + tokens)
    redis.call('EXPIRE', KEYS[3], 172800)
  end
end
local rr = remaining(r, rpm, denied == 0 and r and r[2] or (r and r[1]))
local kr = remaining(k, tpm, denied == 0 and k and k[2] or (k and k[1]))
return {denied, math.ceil(retry), rr[1], rr[2], kr[1], kr[2], used, day}
"""

# KEYS: tokens TAT, day hash, usage hash. ARGV: tpm, delta tokens, day of the reservation,
# model, requests, prompt, completion, saved, max models, retention seconds.
_SETTLE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tpm, delta, day = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if tpm > 0 and delta ~= 0 then
  local tat = tonumber(redis.call('GET', KEYS[1]) or now)
  if tat < now then tat = now end
  tat = math.max(now, tat + delta * 60000000 / tpm)
  if tat > now then
    redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  else
    redis.call('DEL', KEYS[1])  -- refunded back to a full bucket (no key): the old TAT must not stay
  end
end
if delta ~= 0 and tonumber(redis.call('HGET', KEYS[2], 'day') or -1) == day then
  local used = tonumber(redis.call('HGET', KEYS[2], 'used') or 0)
  redis.call('HSET', KEYS[2], 'used', math.max(0, used + delta))
end
local model = ARGV[4]
if redis.call('HEXISTS', KEYS[3], model .. '|requests') == 0
    and redis.call('HLEN', KEYS[3]) >= tonumber(ARGV[9]) * 4 then
  model = '(other)'
end
redis.call('HINCRBY', KEYS[3], model .. '|requests', ARGV[5])
redis.call('HINCRBY', KEYS[3], model .. '|prompt', ARGV[6])
redis.call('HINCRBY', KEYS[3], model .. '|completion', ARGV[7])
redis.call('HINCRBY', KEYS[3], model .. '|saved', ARGV[8])
redis.call('EXPIRE', KEYS[3], ARGV[10])
return 1
"""


def _decision(raw: list[Any]) -> Decision:
    values = [int(v) for v in raw]
    return Decision(_DENIED.get(values[0]), *values[1:])


class RedisLimits:
    """The shared backend. Each call is one round trip (EVALSHA; EVAL once after a script flush)."""

    def __init__(self, url: str, *, timeout: float, **client_options: Any) -> None:
        # No retry inside the client: the caller bounds the whole call and has its own fallback.
        self.client = bounded_client(url, timeout, retry=Retry(NoBackoff(), 0), **client_options)
        self._admit = self.client.register_script(_ADMIT)
        self._settle = self.client.register_script(_SETTLE)

    async def warm_up(self) -> None:
        """Connect and load the scripts, so the first requests pay neither."""
        for script in (_ADMIT, _SETTLE):
            await self.client.script_load(script)

    async def admit(self, team: str, limits: TeamLimits, tokens: int, *, requests_only: bool) -> Decision:
        raw = await self._admit(
            keys=list(limit_keys(team)),
            args=[
                _limit(limits.requests_per_minute),
                0 if requests_only else _limit(limits.tokens_per_minute),
                0 if requests_only else _limit(limits.tokens_per_day),
                0 if requests_only else tokens,
            ],
        )
        return _decision(raw)

    async def settle(
        self, team: str, limits: TeamLimits, day: int, delta: int, model: str, usage: Usage
    ) -> None:
        _, tokens_key, day_key = limit_keys(team)
        await self._settle(
            keys=[tokens_key, day_key, usage_key(team, day)],
            args=[
                _limit(limits.tokens_per_minute),
                delta,
                day,
                model,
                usage.requests,
                usage.prompt,
                usage.completion,
                usage.saved,
                USAGE_MAX_MODELS,
                USAGE_RETENTION_DAYS * DAY_SECONDS,
            ],
        )

    async def usage(self, team: str, day: int) -> dict[str, Usage]:
        fields = await self.client.hgetall(usage_key(team, day))
        return parse_usage({str(name): str(value) for name, value in fields.items()})

    async def close(self) -> None:
        await self.client.aclose()


def parse_usage(fields: dict[str, str]) -> dict[str, Usage]:
    """``model|field -> count`` hash fields as one Usage per model; a field holding no count is skipped."""
    counts: dict[str, dict[str, int]] = {}
    for name, value in fields.items():
        model, _, kind = name.rpartition("|")
        if kind in USAGE_FIELDS and USAGE_COUNT.fullmatch(value):
            counts.setdefault(model, {})[kind] = int(value)
    return {model: Usage(**values) for model, values in sorted(counts.items())}


# ---- memory --------------------------------------------------------------------------------------


@dataclass
class _TeamState:
    requests_tat: float = 0.0
    tokens_tat: float = 0.0
    day: int = -1
    day_used: int = 0
    usage: dict[tuple[int, str], Usage] = field(default_factory=dict)


class MemoryLimits:
    """The same arithmetic for one process, on its own clock. State: one entry per team."""

    def __init__(self) -> None:
        self._teams: dict[str, _TeamState] = {}

    def _state(self, team: str) -> _TeamState:
        return self._teams.setdefault(team, _TeamState())

    async def admit(self, team: str, limits: TeamLimits, tokens: int, *, requests_only: bool) -> Decision:
        now_s = time.time()
        now = now_s * 1e6
        day = int(now_s // DAY_SECONDS)
        state = self._state(team)
        rpm = _limit(limits.requests_per_minute)
        tpm = 0 if requests_only else _limit(limits.tokens_per_minute)
        daily = 0 if requests_only else _limit(limits.tokens_per_day)
        cost = 0 if requests_only else tokens
        if state.day != day:
            state.day, state.day_used = day, 0
        r_tat = max(state.requests_tat, now)
        k_tat = max(state.tokens_tat, now)
        r_new = r_tat + PERIOD_US / rpm if rpm else r_tat
        k_new = k_tat + cost * PERIOD_US / tpm if tpm else k_tat
        denied: Denied | None = None
        retry = 0.0
        if rpm and r_new - PERIOD_US > now:
            denied, retry = "requests", r_new - PERIOD_US - now
        elif tpm and k_new - PERIOD_US > now:
            denied, retry = "tokens", k_new - PERIOD_US - now
        elif daily and state.day_used + cost > daily:
            denied, retry = "day", (day + 1) * DAY_SECONDS * 1e6 - now
        used = state.day_used
        if denied is None:
            state.requests_tat, state.tokens_tat = r_new, k_new
            state.day_used += cost
            r_tat, k_tat = r_new, k_new
        r_left, r_reset = _remaining(rpm, r_tat, now)
        k_left, k_reset = _remaining(tpm, k_tat, now)
        return Decision(denied, math.ceil(retry), r_left, r_reset, k_left, k_reset, used, day)

    async def settle(
        self, team: str, limits: TeamLimits, day: int, delta: int, model: str, usage: Usage
    ) -> None:
        state = self._state(team)
        now = time.time() * 1e6
        tpm = _limit(limits.tokens_per_minute)
        if tpm and delta:
            state.tokens_tat = max(now, max(state.tokens_tat, now) + delta * PERIOD_US / tpm)
        if delta and state.day == day:
            state.day_used = max(0, state.day_used + delta)
        # Only this day's records are kept in memory: the state stays bounded.
        for stale in [key for key in state.usage if key[0] != day]:
            del state.usage[stale]
        models = {key[1] for key in state.usage}
        if model not in models and len(models) >= USAGE_MAX_MODELS:
            model = OTHER_MODEL
        old = state.usage.get((day, model), Usage())
        state.usage[(day, model)] = Usage(
            old.requests + usage.requests,
            old.prompt + usage.prompt,
            old.completion + usage.completion,
            old.saved + usage.saved,
        )

    async def usage(self, team: str, day: int) -> dict[str, Usage]:
        state = self._teams.get(team)
        if state is None:
            return {}
        return {model: usage for (d, model), usage in sorted(state.usage.items()) if d == day}

    async def close(self) -> None:
        self._teams.clear()


def _remaining(limit: int, tat: float, now: float) -> tuple[int, int]:
    if not limit:
        return -1, 0
    interval = PERIOD_US / limit
    return max(0, math.floor((now + PERIOD_US - tat) / interval + 1e-6)), math.ceil(tat - now)
