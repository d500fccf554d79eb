"""Prometheus metrics, served at GET /metrics.

Label values are bounded sets only (route families, status classes, stage names, outcomes,
model names the operator or litellm's map knows, else "other"), never free text a client
chooses. With several worker processes (``serve --workers N``) every worker writes its values
to files in ``PROMETHEUS_MULTIPROC_DIR`` and a scrape of any worker adds them all up
(prometheus-client's multiprocess mode).
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY as PROCESS_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Whole requests, streams included: a long generation takes minutes.
REQUEST_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)

REQUESTS = Counter(
    "gateway_requests_total",
    "Requests answered, the gateway's own errors included, by route and status class.",
    ["route", "status"],
)
REQUEST_DURATION = Histogram(
    "gateway_request_duration_seconds",
    "Whole requests, from arrival to the last byte relayed (streams included), by route and status class.",
    ["route", "status"],
    buckets=REQUEST_BUCKETS,
)
IN_FLIGHT = Gauge(
    "gateway_requests_in_flight",
    "Requests being handled right now, streams included (probes and scrapes are not).",
    multiprocess_mode="livesum",
)
UPSTREAM_DURATION = Histogram(
    "gateway_upstream_duration_seconds",
    "From sending a request upstream to its response headers, retries included, by status class "
    "(error: unreachable or timed out).",
    ["status"],
    buckets=REQUEST_BUCKETS,
)
UPSTREAM_RETRIES = Counter(
    "gateway_upstream_retries_total", "Extra upstream attempts after connection errors, 429 or 5xx."
)
GATEWAY_OVERHEAD = Histogram(
    "gateway_request_overhead_seconds",
    "Time spent in the gateway before the upstream request was sent (parse, count, compress).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
PROMPT_TOKENS = Counter(
    "gateway_prompt_tokens_total", "Prompt tokens of chat requests as received (before compression)."
)
PROMPT_TOKENS_SAVED = Counter(
    "gateway_prompt_tokens_saved_total", "Prompt tokens removed by compression before forwarding."
)
COMPRESSIONS = Counter(
    "gateway_compression_stages_total", "Compression stages applied to chat requests.", ["stage"]
)
OVERFLOW_RETRIES = Counter(
    "gateway_overflow_retries_total", "Upstream context overflows answered by a compressed retry.", ["result"]
)
MERGED_MARKERS_RETRIES = Counter(
    "gateway_merged_markers_retries_total",
    "Fitted requests sent again with user messages in a row joined, after the upstream's chat template "
    "refused them (roles must alternate); the model then goes merged at once.",
)
REFUSALS = Counter(
    "gateway_context_refusals_total", "Requests refused because they could not be made to fit."
)
SILENT_TRUNCATIONS = Counter(
    "gateway_upstream_silent_truncations_total",
    "Answers whose reported prompt tokens were far below what was sent (upstream truncated silently).",
    ["model"],
)
STORE_ERRORS = Counter(
    "gateway_store_errors_total",
    "Failed calls to the store of learned state (read, write, ping); requests go on without it.",
    ["operation"],
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
SUMMARIES = Counter(
    "gateway_summaries_total",
    "Summaries of dropped spans: made by the summarizer, found in the cache, or fallen back to the digest.",
    ["outcome"],
)
SUMMARY_FAILURES = Counter(
    "gateway_summary_failures_total",
    "Summarizer attempts that gave nothing usable, by reason (timeout, refused, garbage, too_long, ...).",
    ["reason"],
)
SUMMARIZER_LATENCY = Histogram(
    "gateway_summarizer_seconds",
    "Time of one summarizer call.",
    buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
SUMMARIZER_TOKENS = Counter(
    "gateway_summarizer_tokens_total", "Tokens the summarizer reported using, by kind.", ["kind"]
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


def status_class(status: int) -> str:
    return f"{status // 100}xx"


def exposition() -> bytes:
    """The text a scrape gets: this process's metrics, or every worker's added up."""
    if os.environ.get(MULTIPROC_DIR_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry)
    return generate_latest(PROCESS_REGISTRY)


def process_exiting() -> None:
    """A worker's live gauges (requests in flight) stop counting once it is gone."""
    process_gone(os.getpid())


def process_gone(pid: int) -> None:
    """Worker `pid`'s live gauges stop counting (it exited, or was killed and replaced)."""
    if os.environ.get(MULTIPROC_DIR_ENV):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
