"""POST /v1/responses (OpenAI Responses API) through the shared prompt flow.

A request that carries its whole history (`input` items, `instructions`) is counted and fitted
like a chat. One whose history lives on the upstream (`previous_response_id` or
`conversation`) cannot be compressed by a proxy; `compression.responses_server_state` decides:

- `pass`: forwarded as it is (the headers count only the new input);
- `truncate_auto`: measured with the upstream's `POST /v1/responses/input_tokens` (server
  history included; skipped when the upstream does not offer it) and, when over budget, sent
  with `truncation: "auto"` so the upstream drops its oldest items; an overflow answer is
  retried once that way too.

The Responses API reports an overflow in a stream as a `response.failed` event after the
stream's opening events, so the head of a stream is read past them before anything is relayed.
"""

from __future__ import annotations

import asyncio
import re

import orjson

from gateway import metrics
from gateway.chat_request import ChatRequest
from gateway.errors import GatewayError
from gateway.planning import Plan, over_the_cap
from gateway.proxy.overflow import Overflow
from gateway.routes.chat import openai_upstream
from gateway.routes.prompt import (
    Dialect,
    Planning,
    Upstreaming,
    compressed_retry,
    plan_default,
    prompt_endpoint,
)
from gateway.runtime import Runtime
from gateway.tokens.counter import count_request_async, counter_for
from gateway.wire.responses import SERVED_RESPONSES
from gateway.wire.responses_validation import validate_responses_body

SERVER_STATE_FIELDS = ("previous_response_id", "conversation")
MEASURE_BYTES = 64 * 1024  # `{"object": "response.input_tokens", "input_tokens": N}`, with room
# What POST /v1/responses/input_tokens accepts of a Responses body.
MEASURED_FIELDS = (
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "conversation",
    "tools",
    "tool_choice",
    "text",
    "reasoning",
    "parallel_tool_calls",
    "truncation",
)
SERVER_TRUNCATION = "server_truncation"
PREAMBLE_EVENTS = (b"response.created", b"response.in_progress")
_EVENT_TYPE = re.compile(rb'data: ?\{"type": ?"([^"]{1,80})"')


def server_state(chat: ChatRequest) -> bool:
    return any(chat.payload.get(name) is not None for name in SERVER_STATE_FIELDS)


def _truncating(runtime: Runtime, chat: ChatRequest) -> bool:
    return (
        runtime.settings.compression.responses_server_state == "truncate_auto"
        and chat.mode != "off"
        and chat.payload.get("truncation") != "auto"
    )


def _truncated_plan(chat: ChatRequest, budget: int | None, tokens: int) -> Plan:
    metrics.SERVER_TRUNCATIONS.inc()
    body = orjson.dumps({**chat.payload, "truncation": "auto"})
    return Plan(body, budget, tokens, tokens, (SERVER_TRUNCATION,), calibrate=False)


async def _plan(runtime: Runtime, planning: Planning) -> Plan:
    chat, upstream = planning.chat, planning.upstream
    if chat.model and not server_state(chat):
        return await plan_default(runtime, planning)
    # What the headers count is what the gateway sees: the new input, not the upstream's history,
    # nor a stored prompt's messages (nor which model it names, when the body names none).
    local = await count_request_async(counter_for(chat.model), chat.view.counted)
    truncating, cap = bool(chat.model) and _truncating(runtime, chat), planning.cap
    if not truncating and cap is None:
        return Plan(chat.raw, None, local, local, calibrate=False)
    window = None
    if chat.model:
        await runtime.load_learned(chat.model)
        window = runtime.windows.resolve_window(chat.model).tokens
    # A team's cap is held by the upstream's own count of the whole input (its history included;
    # not a stored prompt's messages, which that count does not take).
    measured = await _measure(runtime, chat, upstream) if window is not None or cap is not None else None
    tokens = measured if measured is not None else local
    if cap is not None and tokens > cap:
        raise over_the_cap(chat, tokens, cap, "its history is kept by the upstream")
    if not truncating:
        return Plan(chat.raw, None, tokens, tokens, calibrate=False)
    budget = None if window is None else runtime.settings.budget.usable(window, chat.view.counted)
    if cap is not None and (budget is None or cap < budget):
        budget = cap
    if budget is not None and tokens > budget:
        return _truncated_plan(chat, budget, tokens)
    return Plan(chat.raw, budget, tokens, tokens, calibrate=False)


async def _measure(runtime: Runtime, chat: ChatRequest, upstream: Upstreaming) -> int | None:
    """The upstream's own count of the whole input (server history included), if it offers one in
    `windows.discovery_timeout` (a probe, like discovery: the request goes on without it)."""
    query = {name: chat.payload[name] for name in MEASURED_FIELDS if name in chat.payload}
    url = runtime.upstream.url_for("/v1/responses/input_tokens", upstream.url.query_string)
    headers = [(name, value) for name, value in upstream.headers if name.lower() != "content-length"]
    try:
        async with asyncio.timeout(runtime.settings.windows.discovery_timeout):
            reply = await runtime.upstream.send(
                "POST", url, headers, orjson.dumps(query), gateway_credentials=upstream.gateway_credentials
            )
            try:
                body = await reply.read_within(runtime.settings.upstream.timeouts.idle, MEASURE_BYTES)
            finally:
                reply.close()
    except (TimeoutError, GatewayError):
        return None
    if reply.status != 200 or body is None:
        return None
    try:
        tokens = orjson.loads(body).get("input_tokens")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else None


async def _retry(
    runtime: Runtime, planning: Planning, sent: Plan, overflow: Overflow, believed: int | None
) -> Plan | None:
    chat = planning.chat
    if not server_state(chat):
        return await compressed_retry(runtime, planning, sent, overflow, believed)
    if not _truncating(runtime, chat) or SERVER_TRUNCATION in sent.stages:
        return None
    return _truncated_plan(chat, sent.budget, sent.tokens_before)


def _error_event(message: str, code: str) -> bytes:
    """The Responses API's in-stream `error` event: its SDKs raise it as an APIError."""
    payload = {"type": "error", "code": code, "message": message, "param": None}
    return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


def _past_preamble(head: bytes) -> bool:
    """Does the head hold an event after the two every stream opens with? Each event's data line
    is found with `find` and its type read there: the opening events echo the whole request's
    settings, which a regex scanning every line start would walk through byte by byte."""
    start = 0
    while (found := head.find(b"data:", start)) >= 0:
        start = found + 5
        if found and head[found - 1] != 0x0A:  # not at a line start: inside some value
            continue
        event = _EVENT_TYPE.match(head, found)
        if event is not None and event[1] not in PREAMBLE_EVENTS:
            return True
    return False


responses = prompt_endpoint(
    Dialect(
        upstream=openai_upstream("/v1/responses"),
        wire=SERVED_RESPONSES,
        validate=validate_responses_body,
        plan=_plan,
        retry=_retry,
        error_event=_error_event,
        head_complete=_past_preamble,
    )
)
