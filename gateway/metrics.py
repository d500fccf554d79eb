"""Prometheus metrics, served at GET /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUESTS = Counter(
    "gateway_requests_total",
    "Requests answered, the gateway's own errors included, by route and status class.",
    ["route", "status"],
)
COMPRESSIONS = Counter(
    "gateway_compression_stages_total", "Compression stages applied to chat requests.", ["stage"]
)
PROMPT_TOKENS_SAVED = Counter(
    "gateway_prompt_tokens_saved_total", "Prompt tokens removed by compression before forwarding."
)
OVERFLOW_RETRIES = Counter(
    "gateway_overflow_retries_total", "Upstream context overflows answered by a compressed retry.", ["result"]
)
UPSTREAM_RETRIES = Counter(
    "gateway_upstream_retries_total", "Extra upstream attempts after connection errors, 429 or 5xx."
)
SILENT_TRUNCATIONS = Counter(
    "gateway_upstream_silent_truncations_total",
    "Answers whose reported prompt tokens were far below what was sent (upstream truncated silently).",
    ["model"],
)
REFUSALS = Counter(
    "gateway_context_refusals_total", "Requests refused because they could not be made to fit."
)
GATEWAY_OVERHEAD = Histogram(
    "gateway_request_overhead_seconds",
    "Time spent in the gateway before the upstream request was sent (parse, count, compress).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
CONTEXT_WINDOW_STOPS = Counter(
    "gateway_context_window_stops_total",
    "Answers the upstream ended because the context window filled up (Anthropic's stop_reason "
    "model_context_window_exceeded, a 200): reported, not retried.",
)
SERVER_TRUNCATIONS = Counter(
    "gateway_responses_server_truncations_total",
    "Responses requests with server-side history sent with truncation auto (responses_server_state).",
)
# Team label values are configured team names only (never keys, never client text): bounded.
TEAM_REQUESTS = Counter(
    "gateway_team_requests_total",
    "Team requests by outcome: admitted, rate_limited, quota_exceeded, too_large, model_not_allowed, "
    "store_unavailable.",
    ["team", "outcome"],
)
TEAM_TOKENS = Counter(
    "gateway_team_tokens_total",
    "Tokens settled per team from the upstream's usage: prompt, completion, and prompt tokens saved.",
    ["team", "kind"],
)
POLICY_UNAUTHORIZED = Counter(
    "gateway_policy_unauthorized_total", "Requests refused with 401: missing or unknown gateway key."
)
POLICY_STORE_FAILURES = Counter(
    "gateway_policy_store_failures_total", "Calls to the team limit store (Redis) that failed or timed out."
)
POLICY_FALLBACKS = Counter(
    "gateway_policy_fallbacks_total",
    "Team requests checked against this replica's share of the limits (Redis unreachable, fail open).",
)
WINDOW_EVIDENCE = Counter(
    "gateway_window_evidence_total",
    "What upstream overflow errors taught about context windows: a believed stated window, a refused "
    "size (no window stated), or an implausible stated window that was ignored.",
    ["kind"],
)
