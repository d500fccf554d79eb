"""What the policy tells clients: OpenAI's x-ratelimit-* headers and its 401/404/429 shapes.

The formats follow OpenAI's rate-limit guide: ``x-ratelimit-reset-*`` as a Go-style duration
("1s", "6m0s", "250ms"), 429 bodies ``{"error": {"type": "tokens" | "requests", "code":
"rate_limit_exceeded"}}`` with a message stating limit, used and requested, and an exhausted
quota as ``insufficient_quota`` with ``x-should-retry: false`` (the SDKs honour it and do not
retry).
"""

from __future__ import annotations

import math

from gateway.errors import GatewayError
from gateway.policy.config import TeamLimits
from gateway.policy.limits import Decision


def duration(microseconds: int) -> str:
    """A Go-style duration, as OpenAI writes its reset times."""
    if microseconds < 1_000_000:
        return f"{max(0, math.ceil(microseconds / 1000))}ms"
    seconds = microseconds / 1e6
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if minutes or hours:
        text = f"{int(minutes)}m{text}"
    if hours:
        text = f"{int(hours)}h{text}"
    return text


def rate_limit_headers(limits: TeamLimits, decision: Decision) -> list[tuple[str, str]]:
    """The six x-ratelimit-* headers for the per-minute limits the team has."""
    headers: list[tuple[str, str]] = []
    for kind, limit, remaining, reset in (
        ("requests", limits.requests_per_minute, decision.requests_remaining, decision.requests_reset_us),
        ("tokens", limits.tokens_per_minute, decision.tokens_remaining, decision.tokens_reset_us),
    ):
        if limit and remaining >= 0:
            headers += [
                (f"x-ratelimit-limit-{kind}", str(limit)),
                (f"x-ratelimit-remaining-{kind}", str(remaining)),
                (f"x-ratelimit-reset-{kind}", duration(reset)),
            ]
    return headers


def unauthorized(presented: bool) -> GatewayError:
    # The key is never quoted, not even in part (OpenAI quotes its last four characters).
    message = (
        "Incorrect API key provided. Use a gateway key issued for your team."
        if presented
        else "You didn't provide an API key. Send your gateway key as 'Authorization: Bearer <key>'."
    )
    return GatewayError(401, message, code="invalid_api_key")


def model_not_allowed(team: str, model: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model '{model[:200]}' does not exist or team {team} does not have access to it.",
        param="model",
        code="model_not_found",
    )


def model_unnamed(team: str) -> GatewayError:
    """A body naming no model (a Responses stored prompt names its own) under a model allow-list."""
    return GatewayError(
        400,
        f"Team {team} may use only its listed models: name the model in the request "
        "(the model a stored prompt names cannot be checked).",
        param="model",
    )


def store_unavailable() -> GatewayError:
    return GatewayError(
        503,
        "The gateway cannot check team limits right now (its limit store is unreachable). Retry shortly.",
        type="server_error",
        code="limits_unavailable",
        headers={"retry-after": "1"},
    )


def too_large(
    team: str, kind: str, limit: int, requested: int, headers: list[tuple[str, str]]
) -> GatewayError:
    """A request that can never pass: retrying would not help, so the SDKs are told not to."""
    per = "tokens per day (TPD)" if kind == "day" else "tokens per min (TPM)"
    return GatewayError(
        429,
        f"Request too large for team {team} on {per}: Limit {limit}, Requested {requested}. "
        "The input or output tokens (max_completion_tokens) must be reduced for it to run.",
        type="tokens",
        code="rate_limit_exceeded",
        headers={**dict(headers), "x-should-retry": "false"},
    )


def over_limit(
    team: str, limits: TeamLimits, decision: Decision, requested_tokens: int, headers: list[tuple[str, str]]
) -> GatewayError:
    if decision.denied == "day":
        limit = limits.tokens_per_day or 0
        return GatewayError(
            429,
            f"Team {team} exceeded its daily token quota (tokens per day): Limit {limit}, "
            f"Used {decision.day_used}, Requested {requested_tokens}. It resets at 00:00 UTC.",
            type="insufficient_quota",
            code="insufficient_quota",
            headers={**dict(headers), "x-should-retry": "false"},
        )
    retry = decision.retry_after_us / 1e6
    wait = {"retry-after": str(max(1, math.ceil(retry))), "retry-after-ms": str(math.ceil(retry * 1000))}
    if decision.denied == "requests":
        limit = limits.requests_per_minute or 0
        used = limit - decision.requests_remaining
        what, requested = "requests per min (RPM)", 1
    else:
        limit = limits.tokens_per_minute or 0
        used = limit - decision.tokens_remaining
        what, requested = "tokens per min (TPM)", requested_tokens
    return GatewayError(
        429,
        f"Rate limit reached for team {team} on {what}: Limit {limit}, Used {used}, Requested {requested}. "
        f"Please try again in {duration(decision.retry_after_us)}.",
        type=decision.denied or "requests",
        code="rate_limit_exceeded",
        headers={**dict(headers), **wait},
    )


def without_rate_limits(upstream_headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The upstream's headers less its x-ratelimit-*: those describe the organisation's key, the
    team's own replace them."""
    return [(name, value) for name, value in upstream_headers if not name.lower().startswith("x-ratelimit-")]
