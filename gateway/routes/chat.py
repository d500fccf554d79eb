"""POST /v1/chat/completions: authenticate → parse → count → fit → reserve → forward → relay →
settle → learn.

Orchestration only: counting lives in gateway.tokens, fitting in gateway.compress,
overflow recognition in gateway.overflow, the HTTP client in gateway.upstream, teams and
their limits in gateway.policy.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from yarl import URL

from gateway import metrics
from gateway.chat_request import ChatRequest, parse_chat_request, read_body
from gateway.errors import GatewayError
from gateway.overflow import Overflow, classify_overflow, classify_stream_error
from gateway.planning import Plan, demand, overflow_retry_budget, plan_request, refusal_of
from gateway.policy.answers import without_rate_limits
from gateway.policy.chat import output_allowance, team_chat
from gateway.policy.enforcer import Admission, Team
from gateway.policy.limits import Usage
from gateway.policy.streams import StreamMeter, metered, usage_counts
from gateway.proxy_headers import to_client, to_upstream, upstream_query
from gateway.relay import (
    cancel_safely,
    first_chunk,
    prompt_tokens,
    prompt_tokens_from_sse_tail,
    relay_sse,
    usage_from_json,
)
from gateway.request_log import RequestRecord
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
    record: RequestRecord = request.state.record
    team = runtime.policy.authenticate(request.headers)
    record.team = None if team is None else team.name
    chat = parse_chat_request(
        await read_body(request, runtime.settings.server.max_body_bytes), request.headers
    )
    # uvicorn stops reading a connection while a large body waits for the app, and a hang-up is
    # seen only once it reads again: asking now resumes reading, so that a client leaving while
    # its request is counted and fitted is noticed before the upstream call.
    await request.is_disconnected()
    record.model, record.stream = chat.model, chat.stream
    strip_usage = False
    if team is not None:
        runtime.policy.check_model(team, chat.model)
        chat, strip_usage = team_chat(team, chat, request.headers)
    upstream = _upstreaming(request, runtime, team)
    await runtime.discover(chat.model, upstream.headers)
    plan = await plan_request(
        runtime,
        chat,
        cap=team.settings.limits.max_context_tokens if team else None,
        client_gone=request.is_disconnected,
    )
    admission = None
    if team is not None:
        await plan.settle()  # the exact prompt count is what gets reserved
        allowance = output_allowance(chat.payload, runtime.settings.policy.default_output_allowance)
        admission = await runtime.policy.admit(team, plan.tokens_after + allowance)
    record.overhead_seconds = time.perf_counter() - started
    metrics.GATEWAY_OVERHEAD.observe(record.overhead_seconds)
    try:
        return await _forward(request, runtime, chat, plan, upstream, admission, strip_usage)
    except BaseException:
        if admission is not None:  # nothing was relayed: give the reservation back
            runtime.in_background(runtime.policy.settle(admission, chat.model, Usage(requests=1)))
        raise


def _upstreaming(request: Request, runtime: Runtime, team: Team | None) -> Upstreaming:
    request_id: str = request.state.request_id
    api_key = runtime.upstream_key(team)
    # With teams, the caller's credential is a gateway key: it never crosses, key or no key.
    strip = team is not None
    query = upstream_query(request.url.query, api_key=api_key, strip_credentials=strip)
    return Upstreaming(
        headers=to_upstream(
            request.headers,
            api_key=api_key,
            request_id=request_id,
            identity_encoding=True,
            strip_credentials=strip,
        ),
        url=runtime.upstream.url_for("/v1/chat/completions", query),  # Azure's api-version rides on it
        gateway_credentials=bool(api_key) or strip,
    )


async def _forward(
    request: Request,
    runtime: Runtime,
    chat: ChatRequest,
    plan: Plan,
    upstream: Upstreaming,
    admission: Admission | None,
    strip_usage: bool,
) -> Response:
    request_id: str = request.state.request_id
    await _stop_if_client_left(request, plan)
    record: RequestRecord = request.state.record
    attempt = await _send(runtime, chat, plan, upstream, record)
    metrics.PROMPT_TOKENS.inc(plan.tokens_before)
    record.tokens_before = plan.tokens_before
    retried = False
    first_overflow = attempt.overflow
    retry_budget = None
    believed = None
    if first_overflow is not None and chat.mode != "off":
        believed = runtime.learn_from_overflow(chat.model, refusal_of(runtime, chat, plan, first_overflow))
        retry_budget = overflow_retry_budget(runtime, chat, plan, first_overflow, believed)
    if first_overflow is not None and retry_budget is not None:
        retried = True
        attempt.reply.close()
        retry_plan = await plan_request(
            runtime, chat, budget=retry_budget, client_gone=request.is_disconnected
        )
        await _stop_if_client_left(request, retry_plan)
        attempt = await _send(runtime, chat, retry_plan, upstream, record)
        if attempt.overflow is not None:
            metrics.OVERFLOW_RETRIES.labels("failed").inc()
            runtime.learn_from_overflow(chat.model, refusal_of(runtime, chat, retry_plan, attempt.overflow))
            attempt.reply.close()
            raise GatewayError(
                400,
                "The upstream rejected the prompt as longer than the model's context window twice: "
                f"first with {plan.tokens_after} tokens (as counted by the gateway), then after compressing "
                f"to {retry_plan.tokens_after} tokens"
                + (f" for a stated window of {believed} tokens" if believed else "")
                + ".",
                param="messages",
                code="context_length_exceeded",
                headers=dict(_gateway_headers(retry_plan, retried=True, admission=admission)),
            )
        metrics.OVERFLOW_RETRIES.labels("recovered").inc()

    final_plan = attempt.plan
    record.tokens_after, record.compression = final_plan.tokens_after, final_plan.stages
    record.overflow_retry = retried
    if attempt.reply.status == 200 and chat.mode != "off":
        runtime.learn_from_success(chat.model, demand(chat, final_plan))
    saved = max(0, plan.tokens_before - final_plan.tokens_after)
    reply_headers = attempt.reply.headers if admission is None else without_rate_limits(attempt.reply.headers)
    headers = to_client(
        reply_headers,
        request_id=request_id,
        extra=_gateway_headers(final_plan, retried=retried, admission=admission),
    )
    idle = runtime.settings.upstream.timeouts.idle
    if attempt.stream_rest is not None:

        def learn(tail: bytes) -> None:
            runtime.observe_usage(chat.model, final_plan.tokens_after, prompt_tokens_from_sse_tail(tail))

        stream = relay_sse(attempt.stream_head, attempt.stream_rest, idle_timeout=idle, on_complete=learn)
        if admission is not None:
            meter = StreamMeter(strip=strip_usage)
            settled = admission

            def settle() -> None:
                usage = meter.settlement(final_plan.tokens_after, saved)
                runtime.in_background(runtime.policy.settle(settled, chat.model, usage))

            stream = metered(stream, meter, on_end=settle)
        response: Response = StreamingResponse(stream, status_code=attempt.reply.status)
    else:
        body = await attempt.reply.read(idle)
        usage = Usage(requests=1)
        if attempt.reply.status == 200:
            reported_usage = usage_from_json(body)
            reported = prompt_tokens(reported_usage)
            if runtime.observe_usage(chat.model, final_plan.tokens_after, reported):
                headers.append((b"x-gateway-upstream-truncated", str(reported).encode()))
            prompt, completion = usage_counts(reported_usage) or (final_plan.tokens_after, 0)
            usage = Usage(requests=1, prompt=prompt, completion=completion, saved=saved)
        if admission is not None:
            runtime.in_background(runtime.policy.settle(admission, chat.model, usage))
        response = Response(body, status_code=attempt.reply.status)
        headers.append((b"content-length", str(len(body)).encode()))
    response.raw_headers = headers
    return response


async def _stop_if_client_left(request: Request, plan: Plan) -> None:
    """Counting and fitting a large body takes a while: if its client hung up meanwhile, nobody
    would read the answer, so the upstream is not called (nor billed)."""
    if await request.is_disconnected():
        if plan.counting is not None:
            plan.counting.cancel()
        raise ClientDisconnect


async def _send(
    runtime: Runtime, chat: ChatRequest, plan: Plan, upstream: Upstreaming, record: RequestRecord
) -> Attempt:
    """One upstream request (with transport retries); notes an overflow answer instead of relaying it."""
    sent = time.perf_counter()
    try:
        reply = await runtime.upstream.send(
            "POST",
            upstream.url,
            upstream.headers,
            plan.body,
            gateway_credentials=upstream.gateway_credentials,
        )
    finally:
        record.upstream_seconds += time.perf_counter() - sent
    record.upstream_attempts += reply.attempts
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


def _gateway_headers(plan: Plan, *, retried: bool, admission: Admission | None) -> list[tuple[str, str]]:
    headers = [
        ("x-gateway-prompt-tokens-before", str(plan.tokens_before)),
        ("x-gateway-prompt-tokens-after", str(plan.tokens_after)),
        ("x-gateway-compression", ",".join(plan.stages) or "none"),
    ]
    if plan.capped:
        headers.append(("x-gateway-team-cap", str(plan.budget)))
    if retried:
        headers.append(("x-gateway-retry", "overflow"))
    if admission is not None:
        headers += admission.headers
    return headers
