"""Deciding what to send: count the prompt, find the budget, fit when over it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from gateway import metrics
from gateway.chat_request import ChatRequest
from gateway.compress import ContextBudgetExceeded, fit
from gateway.compress.fit import DroppedSpan
from gateway.errors import GatewayError
from gateway.overflow import Overflow
from gateway.tokens.counter import TokenCounter, count_request_async, counter_for

if TYPE_CHECKING:
    from gateway.runtime import Runtime
    from gateway.summarize import Summarizer

# Fitting a payload this large can take tens of milliseconds: do it off the event loop.
FIT_IN_THREAD_BYTES = 256 * 1024
# After an overflow the gateway's estimate was wrong: aim this far below the stated window.
OVERFLOW_RETRY_HEADROOM = 0.9
# When the upstream names no window, cut at least this share of what it refused.
OVERFLOW_BLIND_CUT = 0.75


@dataclass
class Plan:
    body: bytes
    budget: int | None
    tokens_before: int = 0
    tokens_after: int = 0
    stages: tuple[str, ...] = ()
    spans: tuple[DroppedSpan, ...] = ()  # what fit dropped: the summarizer's work
    # The exact count of a prompt already known to fit, running while the upstream works.
    counting: asyncio.Task[int] | None = None

    async def settle(self) -> None:
        """Wait for a count still running (the headers and calibration need it)."""
        if self.counting is not None:
            self.tokens_before = self.tokens_after = await self.counting
            self.counting = None


async def plan_request(runtime: Runtime, chat: ChatRequest, *, budget: int | None = None) -> Plan:
    """The body to forward: the original bytes when the prompt fits, a fitted one otherwise.

    ``budget`` forces a budget (the overflow retry); otherwise it comes from the model's window.
    When no decision needs the exact count — no known budget, or the free byte bound (a BPE
    token covers at least one byte) is already under it — the original bytes go out at once
    and the count runs alongside the upstream request.
    """
    counter = counter_for(chat.model)
    await runtime.load_learned(chat.model)
    if budget is None and chat.mode != "off":
        window = runtime.windows.resolve_window(chat.model)
        if window.tokens is not None:
            budget = runtime.settings.budget.usable(window.tokens, chat.payload)
    if budget is None or (chat.mode != "aggressive" and _fits_by_bytes(counter, chat.raw, budget)):
        return Plan(
            chat.raw, budget, counting=asyncio.create_task(count_request_async(counter, chat.payload))
        )
    tokens = await count_request_async(counter, chat.payload)
    if tokens <= budget and chat.mode != "aggressive":
        return Plan(chat.raw, budget, tokens, tokens)
    plan = await _fit(runtime, chat, counter, tokens, budget, {})
    if runtime.summarizer is not None and plan.spans:
        plan = await _with_summaries(runtime, runtime.summarizer, plan, chat, counter, tokens, budget)
    for stage in plan.stages:
        metrics.COMPRESSIONS.labels(stage).inc()
    metrics.PROMPT_TOKENS_SAVED.inc(max(0, tokens - plan.tokens_after))
    return plan


async def _fit(
    runtime: Runtime,
    chat: ChatRequest,
    counter: TokenCounter,
    tokens: int,
    budget: int,
    summaries: Mapping[str, str],
) -> Plan:
    if len(chat.raw) > FIT_IN_THREAD_BYTES:
        return await asyncio.to_thread(_fitted_plan, runtime, chat, counter, tokens, budget, summaries)
    return _fitted_plan(runtime, chat, counter, tokens, budget, summaries)


async def _with_summaries(
    runtime: Runtime,
    summarizer: Summarizer,
    plan: Plan,
    chat: ChatRequest,
    counter: TokenCounter,
    tokens: int,
    budget: int,
) -> Plan:
    """The summarizer's hook: summaries for the spans the plan drops, and the work for the next request.

    Where fit cuts never depends on summaries, so the spans of the plan made
    without them are the spans to look up. Background mode uses what the
    store holds and makes the rest after the request has gone on; inline
    mode waits for them up to the summarizer's timeout. Whatever is missing
    stays the digest.
    """
    summaries = await summarizer.cached(plan.spans)
    missing = [span for span in plan.spans if span.key not in summaries]
    if missing and not summarizer.background:
        summaries.update(await summarizer.wait_for(missing, chat.model))
    elif missing:
        for span in missing:
            runtime.in_background(_make(summarizer, span, chat.model))
    if not any(summaries.values()):  # ("": a span whose summary failed; it keeps the digest)
        return plan
    return await _fit(runtime, chat, counter, tokens, budget, summaries)


async def _make(summarizer: Summarizer, span: DroppedSpan, model: str) -> None:
    await summarizer.make(span, model)


def _fits_by_bytes(counter: TokenCounter, raw: bytes, budget: int) -> bool:
    bound = counter.byte_upper_bound(raw)
    return bound is not None and bound <= budget


def _fitted_plan(
    runtime: Runtime,
    chat: ChatRequest,
    counter: TokenCounter,
    tokens: int,
    budget: int,
    summaries: Mapping[str, str],
) -> Plan:
    messages = chat.messages
    # Tool definitions, functions and response_format count against the budget but are never cut.
    fixed = tokens - counter.messages(messages)
    try:
        result = fit(
            messages,
            model=chat.model,
            budget_tokens=budget - fixed,
            options=runtime.settings.compression,
            aggressive=chat.mode == "aggressive",
            summaries=summaries,
        )
    except ContextBudgetExceeded as exc:
        metrics.REFUSALS.inc()
        raise GatewayError(
            400,
            f"This request needs at least {exc.minimum + fixed} prompt tokens even after compression, "
            f"but the model's usable budget is {budget} tokens (prompt was {tokens} tokens). "
            "Shorten the system prompt or the latest message.",
            param="messages",
            code="context_length_exceeded",
            headers={"x-gateway-prompt-tokens-before": str(tokens), "x-gateway-compression": "refused"},
        ) from None
    if not result.stages:
        return Plan(chat.raw, budget, tokens, tokens)
    body = orjson.dumps({**chat.payload, "messages": result.messages})
    return Plan(body, budget, tokens, result.tokens_after + fixed, tuple(result.stages), result.spans)


def overflow_retry_budget(runtime: Runtime, chat: ChatRequest, sent: Plan, overflow: Overflow) -> int | None:
    """A budget, in the gateway's own token units, that the upstream will accept this time.

    None when compressing cannot help: the requested output alone fills the stated window.
    When the upstream states its count of what was sent, its ratio to ours converts the stated
    window into our units (our estimate can be off for non-OpenAI tokenizers).
    """
    ceiling = int(sent.tokens_after * OVERFLOW_RETRY_HEADROOM)
    if overflow.window is None:
        return min(ceiling, int(sent.tokens_after * OVERFLOW_BLIND_CUT))
    if overflow.requested_output is not None and overflow.requested_output >= overflow.window:
        return None
    cfg = runtime.settings.budget
    if overflow.input_limit:
        # The stated maximum covers the prompt alone: no room to reserve for the answer.
        budget = max(0, overflow.window - cfg.safety_margin)
    else:
        budget = cfg.usable(overflow.window, chat.payload)
    if overflow.prompt_tokens and overflow.prompt_tokens > sent.tokens_after:
        budget = budget * sent.tokens_after // overflow.prompt_tokens
    return max(1, min(ceiling, int(budget * OVERFLOW_RETRY_HEADROOM)))
