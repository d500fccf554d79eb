"""POST /v1/chat/completions: parse → count → fit → forward → relay → learn.

Orchestration only: counting lives in gateway.tokens, fitting in gateway.compress,
overflow recognition in gateway.overflow, the HTTP client in gateway.upstream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from yarl import URL

from gateway import metrics
from gateway.chat_request import ChatRequest, parse_chat_request, read_body
from gateway.errors import GatewayError
from gateway.overflow import Overflow, classify_overflow, classify_stream_error
from gateway.planning import Plan, overflow_retry_budget, plan_request
from gateway.proxy_headers import to_client, to_upstream, upstream_query
from gateway.relay import (
    cancel_safely,
    first_chunk,
    prompt_tokens_from_json,
    prompt_tokens_from_sse_tail,
    relay_sse,
)
from gateway.runtime import Runtime
from gateway.upstream import UpstreamReply


@dataclass(frozen=True)
class Upstreaming:
    """Where and how every attempt of one request goes upstream."""

    url: URL
    headers: list[tuple[str, str]]
    gateway_credentials: bool


@dataclass
class Attempt:
    plan: Plan
    reply: UpstreamReply
    overflow: Overflow | None = None
    # For a stream: what was read to check for an in-stream error, and the rest of it.
    stream_head: bytes = b""
    stream_rest: AsyncGenerator[bytes, None] | None = None


async def chat_completions(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    started = time.perf_counter()
    request_id: str = request.state.request_id
    chat = parse_chat_request(
        await read_body(request, runtime.settings.server.max_body_bytes), request.headers
    )
    plan = await plan_request(runtime, chat)
    metrics.GATEWAY_OVERHEAD.observe(time.perf_counter() - started)
    api_key = runtime.settings.upstream.api_key
    query = upstream_query(request.url.query, api_key=api_key)  # Azure's api-version rides on it
    upstream = Upstreaming(
        headers=to_upstream(request.headers, api_key=api_key, request_id=request_id, identity_encoding=True),
        url=runtime.upstream.url_for("/v1/chat/completions", query),
        gateway_credentials=bool(api_key),
    )

    attempt = await _send(runtime, chat, plan, upstream)
    retried = False
    first_overflow = attempt.overflow
    retry_budget = None
    if first_overflow is not None and chat.mode != "off":
        await runtime.learn_from_overflow(chat.model, first_overflow)
        retry_budget = overflow_retry_budget(runtime, chat, plan, first_overflow)
    if first_overflow is not None and retry_budget is not None:
        retried = True
        attempt.reply.close()
        retry_plan = await plan_request(runtime, chat, budget=retry_budget)
        attempt = await _send(runtime, chat, retry_plan, upstream)
        if attempt.overflow is not None:
            metrics.OVERFLOW_RETRIES.labels("failed").inc()
            attempt.reply.close()
            raise GatewayError(
                400,
                "The upstream rejected the prompt as longer than the model's context window twice: "
                f"first with {plan.tokens_after} tokens (as counted by the gateway), then after compressing "
                f"to {retry_plan.tokens_after} tokens"
                + (f" for a stated window of {first_overflow.window} tokens" if first_overflow.window else "")
                + ".",
                param="messages",
                code="context_length_exceeded",
                headers=dict(_gateway_headers(retry_plan, retried=True)),
            )
        metrics.OVERFLOW_RETRIES.labels("recovered").inc()

    final_plan = attempt.plan
    headers = to_client(
        attempt.reply.headers, request_id=request_id, extra=_gateway_headers(final_plan, retried=retried)
    )
    idle = runtime.settings.upstream.timeouts.idle
    if attempt.stream_rest is not None:

        def learn(tail: bytes) -> None:
            runtime.observe_usage(chat.model, final_plan.tokens_after, prompt_tokens_from_sse_tail(tail))

        response: Response = StreamingResponse(
            relay_sse(attempt.stream_head, attempt.stream_rest, idle_timeout=idle, on_complete=learn),
            status_code=attempt.reply.status,
        )
    else:
        body = await attempt.reply.read(idle)
        if attempt.reply.status == 200:
            reported = prompt_tokens_from_json(body)
            if runtime.observe_usage(chat.model, final_plan.tokens_after, reported):
                headers.append((b"x-gateway-upstream-truncated", str(reported).encode()))
        response = Response(body, status_code=attempt.reply.status)
        headers.append((b"content-length", str(len(body)).encode()))
    response.raw_headers = headers
    return response


async def _send(runtime: Runtime, chat: ChatRequest, plan: Plan, upstream: Upstreaming) -> Attempt:
    """One upstream request (with transport retries); notes an overflow answer instead of relaying it."""
    reply = await runtime.upstream.send(
        "POST", upstream.url, upstream.headers, plan.body, gateway_credentials=upstream.gateway_credentials
    )
    # A count left running alongside the upstream is needed from here on (headers, retry budget).
    await plan.settle()
    if reply.attempts > 1:
        metrics.UPSTREAM_RETRIES.inc(reply.attempts - 1)
    attempt = Attempt(plan, reply)
    idle = runtime.settings.upstream.timeouts.idle
    if reply.status >= 400:
        body = await reply.read(idle)
        reply.buffered_body = body
        attempt.overflow = classify_overflow(reply.status, body)
    elif chat.stream and reply.status == 200 and reply.response is not None:
        # Some servers (SGLang) answer 200 and put the overflow inside the stream.
        attempt.stream_head, rest = await first_chunk(reply, idle)
        attempt.overflow = classify_stream_error(attempt.stream_head)
        if attempt.overflow is None:
            attempt.stream_rest = rest
        else:
            await cancel_safely(rest)
    return attempt


def _gateway_headers(plan: Plan, *, retried: bool) -> list[tuple[str, str]]:
    headers = [
        ("x-gateway-prompt-tokens-before", str(plan.tokens_before)),
        ("x-gateway-prompt-tokens-after", str(plan.tokens_after)),
        ("x-gateway-compression", ",".join(plan.stages) or "none"),
    ]
    if retried:
        headers.append(("x-gateway-retry", "overflow"))
    return headers
