"""POST /v1/messages (Anthropic Messages API) through the shared prompt flow; the rest of
/v1/messages* (count_tokens, Message Batches) relayed to Anthropic.

The request goes to `upstream.anthropic_base_url` with the caller's `x-api-key` (or
`upstream.anthropic_api_key` in place of every client credential); `anthropic-version` and
`anthropic-beta` pass through like any header. Errors the gateway raises here are written in
Anthropic's shape (app.py). An answer the upstream ended because the window filled up
(`stop_reason: "model_context_window_exceeded"`, a 200 under the beta of that name) is
reported — `x-gateway-context-window-exceeded: true` on a non-streamed answer, the metric
`gateway_context_window_stops_total` on both — and not retried: the answer is already there.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response
from yarl import URL

from gateway import metrics
from gateway.errors import anthropic_error_body
from gateway.policy.enforcer import Team
from gateway.proxy.headers import client_query, to_upstream, upstream_query
from gateway.request_path import upstream_path
from gateway.routes.passthrough import relay_unchanged
from gateway.routes.prompt import Dialect, Upstreaming, prompt_endpoint
from gateway.runtime import Runtime
from gateway.wire.anthropic import ANTHROPIC
from gateway.wire.anthropic_validation import validate_messages_body

WINDOW_STOP = "model_context_window_exceeded"
WINDOW_STOP_BYTES = WINDOW_STOP.encode()
WINDOW_STOP_HEADER = "x-gateway-context-window-exceeded"


def anthropic_url(runtime: Runtime, path: str, query: str) -> URL:
    base = runtime.settings.upstream.anthropic_base_url.rstrip("/")
    return URL(base + path + (f"?{query}" if query else ""), encoded=True)


def _upstream(runtime: Runtime, request: Request, team: Team | None) -> Upstreaming:
    request_id: str = request.state.request_id
    api_key = runtime.settings.upstream.anthropic_api_key
    strip = team is not None  # the caller's credential is a gateway key: it never crosses
    query = upstream_query(client_query(request.scope), api_key=api_key, strip_credentials=strip)
    return Upstreaming(
        url=anthropic_url(runtime, "/v1/messages", query),
        headers=to_upstream(
            request.headers,
            api_key=api_key,
            request_id=request_id,
            identity_encoding=True,
            key_header="x-api-key",
            strip_credentials=strip,
        ),
        gateway_credentials=bool(api_key) or strip,
    )


def _error_event(message: str, code: str) -> bytes:
    """Anthropic's in-stream error event: its SDKs raise it as an APIError."""
    kind = "timeout_error" if "timeout" in code else "api_error"
    return b"event: error\ndata: " + anthropic_error_body(message, kind) + b"\n\n"


def _window_stop(body: bytes) -> list[tuple[str, str]]:
    if WINDOW_STOP_BYTES not in body:  # the answer is not parsed a second time for nothing
        return []
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    if isinstance(answer, dict) and answer.get("stop_reason") == WINDOW_STOP:
        metrics.CONTEXT_WINDOW_STOPS.inc()
        return [(WINDOW_STOP_HEADER, "true")]
    return []


def _window_stop_in_stream(tail: bytes) -> None:
    # The stop reason arrives in the last message_delta, after the headers went out: a metric only.
    if WINDOW_STOP_BYTES not in tail:  # nearly always: no need to split the tail into events
        return
    for event in tail.split(b"\n\n"):
        if b"message_delta" in event and WINDOW_STOP_BYTES in event:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    try:
                        delta = orjson.loads(line[5:]).get("delta")
                    except (orjson.JSONDecodeError, AttributeError):
                        continue
                    if isinstance(delta, dict) and delta.get("stop_reason") == WINDOW_STOP:
                        metrics.CONTEXT_WINDOW_STOPS.inc()


messages = prompt_endpoint(
    Dialect(
        upstream=_upstream,
        wire=ANTHROPIC,
        validate=validate_messages_body,
        error_event=_error_event,
        inspect_body=_window_stop,
        inspect_stream=_window_stop_in_stream,
        # Window discovery reads OpenAI-compatible model lists; Anthropic's states no windows.
        discover=False,
    )
)


async def anthropic_passthrough(request: Request) -> Response:
    """Anthropic's other endpoints under /v1/messages (count_tokens, Message Batches), and
    /v1/messages itself by any method but POST: relayed to Anthropic as they are, never to the
    OpenAI base URL with an OpenAI key. Its count is the authority, nothing to fit."""
    runtime: Runtime = request.app.state.runtime
    path = upstream_path(request.scope["raw_path"])
    return await relay_unchanged(
        request,
        lambda query: anthropic_url(runtime, path, query),
        lambda team: runtime.settings.upstream.anthropic_api_key,
        key_header="x-api-key",
    )
