"""The flow every prompt route shares: authenticate → parse → count → fit → reserve → forward →
relay → settle → learn, with one overflow retry.

Chat completions, Anthropic Messages and Responses differ only in what a `Dialect` holds:
the wire format and its validator, where the request goes and with which credentials, how a
gateway error looks inside a stream, how a plan is made and retried after an overflow, and
what a finished answer tells. Orchestration only: counting lives in gateway.tokens, fitting in
gateway.compress (through gateway.wire), overflow recognition in gateway.proxy.overflow, the HTTP
client in gateway.proxy.upstream, teams and their limits in gateway.policy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from yarl import URL

from gateway import metrics
from gateway.chat_request import ChatRequest, parse_chat_request, read_body
from gateway.errors import GatewayError
from gateway.planning import (
    Plan,
    demand,
    merged_markers_plan,
    overflow_retry_budget,
    plan_request,
    refusal_of,
)
from gateway.policy.answers import without_rate_limits
from gateway.policy.chat import output_allowance, team_chat
from gateway.policy.enforcer import Admission, Team
from gateway.policy.limits import Usage
from gateway.policy.named_models import query_models
from gateway.policy.streams import StreamMeter, metered, usage_counts
from gateway.proxy.alternation import refuses_separate_markers
from gateway.proxy.headers import to_client
from gateway.proxy.overflow import Overflow, classify_overflow, classify_stream_error
from gateway.proxy.relay import (
    MAX_REPORTED_TOKENS,
    ErrorEvent,
    RelayStream,
    cancel_safely,
    first_chunk,
    prompt_tokens,
    prompt_tokens_from_sse_tail,
    relay_sse,
    sse_error_event,
    usage_from_json,
)
from gateway.proxy.upstream import MAX_READ_ANSWER_BYTES, MAX_READ_ERROR_BYTES, UpstreamReply
from gateway.request_log import RequestRecord
from gateway.runtime import Runtime
from gateway.server.protocol import client_gone
from gateway.summarize.summarizer import Charge
from gateway.wire.base import CHAT, WireFormat
from gateway.wire.chat import validate_chat_body
from gateway.wire.incremental import Validator

# A request larger than this is read for quotes of an overflow (`_classified`) off the event loop.
CLASSIFY_INLINE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Upstreaming:
    """Where and how every attempt of one request goes upstream."""

    url: URL
    headers: list[tuple[str, str]]
    gateway_credentials: bool


ClientGone = Callable[[], Awaitable[bool]]


@dataclass(frozen=True)
class Planning:
    """What a plan is made for: the request, where it goes, a team's cap, a way to see the client
    left, and who pays for the summaries it asks for (its team, if any)."""

    chat: ChatRequest
    upstream: Upstreaming
    cap: int | None
    client_gone: ClientGone
    charge: Charge | None = None


Planner = Callable[[Runtime, Planning], Awaitable[Plan]]
# (runtime, planning, the plan refused, the overflow, the window it stated if believed) -> a retry
RetryPlanner = Callable[[Runtime, Planning, Plan, Overflow, int | None], Awaitable[Plan | None]]


async def plan_default(runtime: Runtime, planning: Planning) -> Plan:
    return await plan_request(
        runtime, planning.chat, cap=planning.cap, client_gone=planning.client_gone, charge=planning.charge
    )


async def compressed_retry(
    runtime: Runtime, planning: Planning, sent: Plan, overflow: Overflow, believed: int | None
) -> Plan | None:
    """The overflow retry of a prompt the gateway can fit: compress for what the upstream stated."""
    chat = planning.chat
    if not chat.view.fittable:  # it would go out unchanged and overflow again
        return None
    budget = overflow_retry_budget(runtime, chat, sent, overflow, believed)
    if budget is None:
        return None
    return await plan_request(
        runtime, chat, budget=budget, client_gone=planning.client_gone, charge=planning.charge
    )


@dataclass(frozen=True)
class Dialect:
    """What one prompt route does its own way."""

    # Where the request goes, with which credentials, for the caller's team (None: no teams).
    upstream: Callable[[Runtime, Request, Team | None], Upstreaming]
    wire: WireFormat = CHAT
    validate: Validator = validate_chat_body
    plan: Planner = plan_default
    retry: RetryPlanner = compressed_retry
    # An error inside a stream, in the API's own event shape.
    error_event: ErrorEvent = sse_error_event
    # Headers to add from a non-streamed 200's body; called on a finished stream's tail (for metrics).
    inspect_body: Callable[[bytes], list[tuple[str, str]]] = field(default=lambda body: [])
    inspect_stream: Callable[[bytes], None] = field(default=lambda tail: None)
    # True once a stream's head shows more than the events every answer opens with: an overflow
    # reported inside the stream (Responses: `response.failed`) comes after them.
    head_complete: Callable[[bytes], bool] = field(default=lambda head: True)
    # Ask the upstream for the model's window at its first sight (OpenAI-compatible upstreams).
    discover: bool = True


@dataclass
class Attempt:
    plan: Plan
    reply: UpstreamReply
    overflow: Overflow | None = None
    # For a stream: what was read to check for an in-stream error, and the rest of it.
    stream_head: bytes = b""
    stream_rest: AsyncGenerator[bytes, None] | None = None


def prompt_endpoint(dialect: Dialect) -> Callable[[Request], Awaitable[Response]]:
    """The route function of one prompt API."""

    async def endpoint(request: Request) -> Response:
        return await _handle(request, dialect)

    return endpoint


async def _handle(request: Request, dialect: Dialect) -> Response:
    runtime: Runtime = request.app.state.runtime
    started = time.perf_counter()
    record: RequestRecord = request.state.record
    team = runtime.policy.authenticate(request.headers)
    record.team = None if team is None else team.name
    raw = await read_body(request, runtime.settings.server.max_body_bytes)
    chat = parse_chat_request(raw, request.headers, validate=dialect.validate, wire=dialect.wire)
    # uvicorn stops reading a connection while a large body waits for the app, and a hang-up is
    # seen only once it reads again: asking now resumes reading, so that a client leaving while
    # its request is counted and fitted is noticed before the upstream call.
    await client_gone(request)
    record.model, record.stream = chat.model, chat.stream
    strip_usage = False
    if team is not None:
        runtime.policy.check_model(team, chat.model)
        for model in query_models(request.scope["query_string"]):  # a lenient upstream may read one
            runtime.policy.check_model(team, model)
        chat, strip_usage = team_chat(team, chat, request.headers, ask_usage=dialect.wire is CHAT)
    upstream = dialect.upstream(runtime, request, team)
    if dialect.discover and chat.model:
        await runtime.discover(chat.model, upstream.headers)
    cap = team.settings.limits.max_context_tokens if team else None
    planning = Planning(chat, upstream, cap, lambda: client_gone(request), _summary_charge(runtime, team))
    plan = await dialect.plan(runtime, planning)
    admission = None
    if team is not None:
        await plan.settle()  # the exact prompt count is what gets reserved
        allowance = output_allowance(chat.view.counted, runtime.settings.policy.default_output_allowance)
        admission = await runtime.policy.admit(team, plan.tokens_after + allowance)
    record.overhead_seconds = time.perf_counter() - started
    metrics.GATEWAY_OVERHEAD.observe(record.overhead_seconds)
    try:
        return await _forward(request, runtime, planning, plan, admission, strip_usage, dialect)
    except BaseException:
        if admission is not None:  # nothing was relayed: give the reservation back
            runtime.in_background(runtime.policy.settle(admission, chat.model, Usage(requests=1)))
        raise


# No model's window is larger (Llama 4 Scout states 10M tokens): a count past it is no one request's.
LARGEST_WINDOW = 10_000_000


def usage_ceiling(runtime: Runtime, model: str) -> int:
    """The most one request's prompt or output can count: twice the model's window when this
    upstream's window is known (configured, stated, discovered, or the model map's entry under
    the exact name), else the largest window any model has. An answer claiming 999,999,999
    prompt tokens for a 13-token prompt once held its team's per-minute budget for 333 hours; a
    window matched by spelling alone is a guess, and under-charged real usage fivefold."""
    window = runtime.windows.resolve_window(model) if model else None
    if window is None or window.tokens is None or (window.source == "model_map" and window.detail != "exact"):
        return LARGEST_WINDOW
    return min(MAX_REPORTED_TOKENS, 2 * window.tokens)


def _summary_charge(runtime: Runtime, team: Team | None) -> Charge | None:
    """A team's summaries are its usage, recorded under the summarizer's model, marked as such."""
    if team is None or runtime.summarizer is None:
        return None
    model = f"summaries:{runtime.summarizer.settings.model}"

    async def charge(prompt: int, completion: int) -> None:
        await runtime.policy.charge(team, model, prompt, completion)

    return charge


async def _forward(
    request: Request,
    runtime: Runtime,
    planning: Planning,
    plan: Plan,
    admission: Admission | None,
    strip_usage: bool,
    dialect: Dialect,
) -> Response:
    request_id: str = request.state.request_id
    chat, upstream = planning.chat, planning.upstream
    await _stop_if_client_left(request, plan)
    record: RequestRecord = request.state.record
    attempt = await _send_fitted(request, runtime, chat, plan, upstream, dialect)
    metrics.PROMPT_TOKENS.inc(plan.tokens_before)
    record.tokens_before = plan.tokens_before
    retried = False
    first_overflow = attempt.overflow
    retry_plan = None
    believed = None
    if first_overflow is not None and chat.mode != "off":
        if not first_overflow.client_spelled:  # (the request's own text: nothing to learn)
            refusal = refusal_of(runtime, chat, plan, first_overflow)
            believed = runtime.learn_from_overflow(chat.model, refusal)
        try:
            retry_plan = await dialect.retry(runtime, planning, plan, first_overflow, believed)
        except GatewayError:
            if not first_overflow.client_spelled:  # (a refusal: the stream kept open is closed now)
                await _discard(attempt)
                raise
            # Most likely not about length at all: the upstream's answer goes back as it came.
        except BaseException:
            await _discard(attempt)
            raise
    if first_overflow is not None and retry_plan is not None:
        retried = True
        await _discard(attempt)
        await _stop_if_client_left(request, retry_plan)
        attempt = await _send_fitted(request, runtime, chat, retry_plan, upstream, dialect)
        if attempt.overflow is None:
            metrics.OVERFLOW_RETRIES.labels("recovered").inc()
        else:
            metrics.OVERFLOW_RETRIES.labels("failed").inc()
        # Refused again: the gateway's own 400, unless the request wrote the refusal itself (most
        # likely not about its length at all: a validation error quoting the client), whose
        # answer goes back as the upstream sent it.
        if attempt.overflow is not None and not attempt.overflow.client_spelled:
            runtime.learn_from_overflow(chat.model, refusal_of(runtime, chat, retry_plan, attempt.overflow))
            await _discard(attempt)
            raise GatewayError(
                400,
                "The upstream rejected the prompt as longer than the model's context window twice: "
                f"first with {plan.tokens_after} tokens (as counted by the gateway), then after compressing "
                f"to {retry_plan.tokens_after} tokens"
                + (f" for a stated window of {believed} tokens" if believed else "")
                + ".",
                param=chat.wire.prompt_field,
                code="context_length_exceeded",
                headers=dict(
                    gateway_headers(
                        attempt.plan,
                        retried=True,
                        admission=admission,
                        merged_markers=bool(record.merged_markers_retry),
                    )
                ),
            )

    final_plan = attempt.plan
    record.tokens_after, record.compression = final_plan.tokens_after, final_plan.stages
    record.overflow_retry = retried
    refused = attempt.overflow is not None  # (relayed as the upstream sent it: a refusal, in a 200 stream)
    if attempt.reply.status == 200 and chat.mode != "off" and final_plan.calibrate and not refused:
        runtime.learn_from_success(chat.model, demand(chat, final_plan))
    saved = max(0, plan.tokens_before - final_plan.tokens_after)
    reply_headers = attempt.reply.headers if admission is None else without_rate_limits(attempt.reply.headers)
    headers = to_client(
        reply_headers,
        request_id=request_id,
        extra=gateway_headers(
            final_plan, retried=retried, admission=admission, merged_markers=bool(record.merged_markers_retry)
        ),
    )
    idle = runtime.settings.upstream.timeouts.idle
    if attempt.stream_rest is not None:
        head = attempt.stream_head

        def learn(tail: bytes) -> None:
            # Anthropic states the prompt's usage when the stream opens, the others when it ends.
            if final_plan.calibrate:
                reported = prompt_tokens_from_sse_tail(tail) or prompt_tokens_from_sse_tail(head)
                runtime.observe_usage(chat.model, final_plan.tokens_after, reported)
            dialect.inspect_stream(tail)

        stream = relay_sse(
            head, attempt.stream_rest, idle_timeout=idle, on_complete=learn, error_event=dialect.error_event
        )
        if admission is not None:
            meter = StreamMeter(strip=strip_usage)
            settled = admission
            ceiling = usage_ceiling(runtime, chat.model)

            def settle() -> None:
                # A refusal in a stream settles at zero, as one with an error status does.
                usage = Usage(requests=1) if refused else meter.settlement(final_plan.tokens_after, saved)
                runtime.in_background(runtime.policy.settle(settled, chat.model, usage.within(ceiling)))

            stream = metered(stream, meter, on_end=settle)
        response: Response = RelayStream(stream, status_code=attempt.reply.status)
    elif (body := await attempt.reply.read_within(idle, MAX_READ_ANSWER_BYTES)) is None:
        # Too large to read for its usage: relayed as it comes, settled at the prompt sent.
        if admission is not None:
            sent = final_plan.tokens_after if attempt.reply.status == 200 else 0
            usage = Usage(requests=1, prompt=sent).within(usage_ceiling(runtime, chat.model))
            runtime.in_background(runtime.policy.settle(admission, chat.model, usage))
        response = RelayStream(attempt.reply.relayed(), status_code=attempt.reply.status)
    else:
        usage = Usage(requests=1)
        if attempt.reply.status == 200:
            reported_usage = usage_from_json(body)
            reported = prompt_tokens(reported_usage) if final_plan.calibrate else None
            if runtime.observe_usage(chat.model, final_plan.tokens_after, reported):
                headers.append((b"x-gateway-upstream-truncated", str(reported).encode()))
            headers += [(name.encode(), value.encode()) for name, value in dialect.inspect_body(body)]
            prompt, completion = usage_counts(reported_usage) or (final_plan.tokens_after, 0)
            usage = Usage(requests=1, prompt=prompt, completion=completion, saved=saved)
        if admission is not None:
            usage = usage.within(usage_ceiling(runtime, chat.model))
            runtime.in_background(runtime.policy.settle(admission, chat.model, usage))
        response = Response(body, status_code=attempt.reply.status)
        headers.append((b"content-length", str(len(body)).encode()))
    response.raw_headers = headers
    return response


async def _stop_if_client_left(request: Request, plan: Plan) -> None:
    """Counting and fitting a large body takes a while: if its client hung up meanwhile, nobody
    would read the answer, so the upstream is not called (nor billed)."""
    if await client_gone(request):
        if plan.counting is not None:
            plan.counting.cancel()
        raise ClientDisconnect


async def _send(
    runtime: Runtime,
    chat: ChatRequest,
    plan: Plan,
    upstream: Upstreaming,
    dialect: Dialect,
    record: RequestRecord,
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
        body = await reply.read_within(idle, MAX_READ_ERROR_BYTES)
        if body is not None:  # (larger: no refusal the gateway reads; relayed as it comes)
            reply.buffered_body = body
            classify = partial(classify_overflow, reply.status, body, plan.body)
            attempt.overflow = await _classified(plan.body, classify)
    elif chat.stream and reply.status == 200 and reply.response is not None:
        # Some servers (SGLang, the Responses API) answer 200 and put the overflow inside the stream.
        # An overflow inside the stream is kept whole until a retry replaces it: when none can
        # (compression off, nothing left to fit), the client gets the stream as the upstream sent it.
        attempt.stream_head, attempt.stream_rest = await first_chunk(reply, idle, dialect.head_complete)
        head = attempt.stream_head
        attempt.overflow = await _classified(plan.body, partial(classify_stream_error, head, plan.body))
    return attempt


async def _classified(sent: bytes, classify: Callable[[], Overflow | None]) -> Overflow | None:
    """`classify()`, off the event loop for a large request: an error that reads as an overflow
    makes it read every string of the request once more (`overflow._client_spelled`), about
    30 ms per MB."""
    if len(sent) > CLASSIFY_INLINE_BYTES:
        return await asyncio.to_thread(classify)
    return classify()


async def _send_fitted(
    request: Request,
    runtime: Runtime,
    chat: ChatRequest,
    plan: Plan,
    upstream: Upstreaming,
    dialect: Dialect,
) -> Attempt:
    """`_send`, and where the upstream's chat template refused the fit's markers, the same fit
    again with them merged (the model remembered): the attempt the overflow logic then reads."""
    record: RequestRecord = request.state.record
    attempt = await _send(runtime, chat, plan, upstream, dialect, record)
    merged = _merged_markers(runtime, chat, attempt)
    if merged is None:
        return attempt
    runtime.alternating.learn(chat.model)
    metrics.MERGED_MARKERS_RETRIES.inc()
    record.merged_markers_retry = True
    await _discard(attempt)
    await _stop_if_client_left(request, merged)
    return await _send(runtime, chat, merged, upstream, dialect, record)


def _merged_markers(runtime: Runtime, chat: ChatRequest, attempt: Attempt) -> Plan | None:
    """The attempt's fit again with user messages in a row joined, when the upstream's chat template
    refused them (gateway/alternation.py) and joining changes what was sent; else None."""
    reply = attempt.reply
    if attempt.overflow is not None or not refuses_separate_markers(reply.status, reply.buffered_body or b""):
        return None
    return merged_markers_plan(chat, attempt.plan, runtime.compression(chat.model))


async def _discard(attempt: Attempt) -> None:
    """Give up an attempt's answer unread (its upstream connection closed)."""
    if attempt.stream_rest is not None:
        await cancel_safely(attempt.stream_rest)
    attempt.reply.close()


def gateway_headers(
    plan: Plan, *, retried: bool, admission: Admission | None, merged_markers: bool = False
) -> list[tuple[str, str]]:
    headers = [
        ("x-gateway-prompt-tokens-before", str(plan.tokens_before)),
        ("x-gateway-prompt-tokens-after", str(plan.tokens_after)),
        ("x-gateway-compression", ",".join(plan.stages) or "none"),
    ]
    if plan.capped:
        headers.append(("x-gateway-team-cap", str(plan.budget)))
    retries = [name for name, done in (("overflow", retried), ("merged_markers", merged_markers)) if done]
    if retries:
        headers.append(("x-gateway-retry", ",".join(retries)))
    if admission is not None:
        headers += admission.headers
    return headers
