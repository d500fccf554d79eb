"""Deciding what to send: count the prompt, find the budget, fit when over it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import orjson
from starlette.requests import ClientDisconnect

from gateway import metrics
from gateway.chat_request import ChatRequest
from gateway.compress import CompressionOptions, ContextBudgetExceeded
from gateway.compress.fit import DroppedSpan, FitResult, with_summaries
from gateway.errors import GatewayError
from gateway.proxy.overflow import Overflow
from gateway.tokens.counter import (
    INLINE_COUNT_BYTES,
    TokenCounter,
    counter_for,
    finish_count_async,
    request_lookup,
)
from gateway.tokens.learned_windows import Refusal
from gateway.tokens.windows import requested_output
from gateway.wire.fitting import fit_request, fitted_body

if TYPE_CHECKING:
    from gateway.runtime import Runtime
    from gateway.summarize import Summarizer
    from gateway.summarize.ahead import SummariesAhead
    from gateway.summarize.summarizer import Charge

# Fitting a payload this large can take tens of milliseconds: do it off the event loop.
FIT_IN_THREAD_BYTES = 256 * 1024
# After an overflow the gateway's estimate was wrong: aim this far below the stated window.
OVERFLOW_RETRY_HEADROOM = 0.9
# A bisected estimate keeps at most 1/N of itself (or the safety margin) free for counting noise.
BISECTED_MARGIN_DIVISOR = 32
# When the upstream names no window and nothing close was accepted, aim at this share of
# the refused demand.
OVERFLOW_BLIND_CUT = 0.75


@dataclass
class Plan:
    body: bytes
    budget: int | None
    tokens_before: int = 0
    tokens_after: int = 0
    stages: tuple[str, ...] = ()
    result: FitResult | None = None  # the fit, when there was one (its spans: the summarizer's work)
    # The budget is the team's max_context_tokens, below what the model's window allows.
    capped: bool = False
    # The exact count of a prompt already known to fit, running while the upstream works.
    counting: asyncio.Task[int] | None = None
    # False when the upstream's usage will cover more than was counted (history it keeps itself).
    calibrate: bool = True

    async def settle(self) -> None:
        """Wait for a count still running (the headers and calibration need it)."""
        if self.counting is not None:
            self.tokens_before = self.tokens_after = await self.counting
            self.counting = None


async def plan_request(
    runtime: Runtime,
    chat: ChatRequest,
    *,
    budget: int | None = None,
    cap: int | None = None,
    client_gone: Callable[[], Awaitable[bool]] | None = None,
    charge: Charge | None = None,
) -> Plan:
    """The body to forward: the original bytes when the prompt fits, a fitted one otherwise.

    ``budget`` forces a budget (the overflow retry); otherwise it comes from the model's window,
    bounded by ``cap`` (a team's max_context_tokens) when that is lower.
    ``client_gone`` is asked between counting and fitting, the two costly steps of a large
    body: once its client has hung up, the fit is not started (ClientDisconnect).
    ``charge`` pays for summarizer calls this request makes (its team's usage).
    The exact count comes first when little of the body is new (a growing conversation: its
    known head costs a comparison, its new messages are tokenized). When much is new and no
    decision needs the exact count — no known budget, or the free byte bound (a BPE token
    covers at least one byte) is already under it — the original bytes go out at once and
    the count runs alongside the upstream request.
    """
    counter = counter_for(chat.model)
    await runtime.load_learned(chat.model)
    counted = chat.view.counted
    capped = False
    if budget is None and chat.mode != "off":
        window = runtime.windows.resolve_window(chat.model)
        if window.source == "bisected" and window.tokens is not None:
            budget = bisected_budget(runtime, chat, window.tokens)
        elif window.tokens is not None:
            budget = runtime.settings.budget.usable(window.tokens, counted)
        if cap is not None and (budget is None or cap < budget):
            budget, capped = cap, True
    lookup = request_lookup(counter, counted, chat.view_encoded)
    if lookup.missing_bytes >= INLINE_COUNT_BYTES and (
        budget is None or (chat.mode != "aggressive" and _fits_by_bytes(counter, chat.raw, budget))
    ):
        plan = Plan(
            chat.raw,
            budget,
            capped=capped,
            counting=asyncio.create_task(finish_count_async(counter, counted, lookup)),
        )
        _look_ahead(runtime, chat, plan, charge)
        return plan
    tokens = await finish_count_async(counter, counted, lookup)
    if capped and budget is not None and tokens > budget and not chat.view.fittable:
        raise over_the_cap(chat, tokens, budget, "a tool output does not follow its call")
    if budget is None or (tokens <= budget and chat.mode != "aggressive") or not chat.view.fittable:
        plan = Plan(chat.raw, budget, tokens, tokens, capped=capped)
        _look_ahead(runtime, chat, plan, charge)
        return plan
    if client_gone is not None and await client_gone():
        raise ClientDisconnect
    counter.keep_warm(lookup)
    if len(chat.raw) > FIT_IN_THREAD_BYTES:
        plan = await asyncio.to_thread(_fitted_plan, runtime, chat, counter, tokens, budget)
    else:
        plan = _fitted_plan(runtime, chat, counter, tokens, budget)
    if runtime.summarizer is not None and plan.result is not None and plan.result.spans:
        plan = await _with_summaries(runtime, runtime.summarizer, plan, plan.result, chat, charge)
    for stage in plan.stages:
        metrics.COMPRESSIONS.labels(stage).inc()
    metrics.PROMPT_TOKENS_SAVED.inc(max(0, tokens - plan.tokens_after))
    plan.capped = capped
    return plan


async def _with_summaries(
    runtime: Runtime,
    summarizer: Summarizer,
    plan: Plan,
    result: FitResult,
    chat: ChatRequest,
    charge: Charge | None,
) -> Plan:
    """The summarizer's hook: summaries for the spans the plan drops, and the work for the next request.

    Where fit cuts never depends on summaries, so the spans of the plan made
    without them are the spans to look up, and the summaries found only take
    their markers' place (`with_summaries`). Background mode uses what the
    store holds and makes the rest after the request has gone on; inline
    mode waits for them up to the summarizer's timeout. Whatever is missing
    stays the digest.
    """
    summaries = await summarizer.cached(result.spans)
    missing = [span for span in result.spans if span.key not in summaries]
    if missing and not summarizer.background:
        summaries.update(await summarizer.wait_for(missing, chat.model, charge))
    elif missing:
        for span in missing:
            runtime.in_background(_make(summarizer, span, chat.model, charge))
    summarized = with_summaries(result, summaries, model=chat.model)
    if summarized is result:  # (none found, or "": a span whose summary failed keeps the digest)
        return plan
    options = runtime.compression(chat.model)
    body = orjson.dumps(fitted_body(chat.wire, chat.payload, chat.view, summarized, options))
    tokens_after = plan.tokens_after + summarized.tokens_after - result.tokens_after
    return Plan(body, plan.budget, plan.tokens_before, tokens_after, summarized.stages, summarized)


def merged_markers_plan(chat: ChatRequest, plan: Plan, options: CompressionOptions) -> Plan | None:
    """`plan`'s fit sent with user messages in a row joined (`markers: merged`), or None when that
    sends the same body: no fit, no dropped span, or merged already."""
    if plan.result is None or not plan.result.spans:
        return None
    merged = replace(options, markers="merged")
    body = orjson.dumps(fitted_body(chat.wire, chat.payload, chat.view, plan.result, merged))
    if body == plan.body:
        return None
    return replace(plan, body=body)


def _look_ahead(runtime: Runtime, chat: ChatRequest, plan: Plan, charge: Charge | None) -> None:
    """A prompt that fits but nears its budget: summarize what its first drop will remove, in the
    background (`start_ratio`; gateway/summarize/ahead.py)."""
    ahead = runtime.summaries_ahead
    if ahead is None or plan.budget is None or chat.mode == "off" or not chat.view.fittable:
        return
    runtime.in_background(_prepare_ahead(ahead, chat, plan, plan.budget, charge))


async def _prepare_ahead(
    ahead: SummariesAhead, chat: ChatRequest, plan: Plan, budget: int, charge: Charge | None
) -> None:
    tokens = plan.tokens_after if plan.counting is None else await plan.counting
    if not ahead.due(tokens, budget):
        return
    messages = chat.view.messages
    fixed = tokens - counter_for(chat.model).messages(messages)  # tools and schemas are never cut
    await ahead.prepare(messages, model=chat.model, budget=budget - fixed, charge=charge)


async def _make(summarizer: Summarizer, span: DroppedSpan, model: str, charge: Charge | None) -> None:
    await summarizer.make(span, model, charge=charge)


def _fits_by_bytes(counter: TokenCounter, raw: bytes, budget: int) -> bool:
    bound = counter.byte_upper_bound(raw)
    return bound is not None and bound <= budget


def _fitted_plan(
    runtime: Runtime, chat: ChatRequest, counter: TokenCounter, tokens: int, budget: int
) -> Plan:
    try:
        body, result, fixed = fit_request(
            chat.wire,
            chat.payload,
            chat.view,
            model=chat.model,
            budget=budget,
            tokens=tokens,
            options=runtime.compression(chat.model),
            aggressive=chat.mode == "aggressive",
        )
    except ContextBudgetExceeded as exc:
        metrics.REFUSALS.inc()
        needed = exc.minimum + tokens - exc.tokens
        # The output the budget was reduced by, and the field the client asked for it in.
        output = requested_output(chat.view.counted) or 0
        field = next((name for name in _OUTPUT_FIELDS if _is_count(chat.payload.get(name), output)), "")
        param = chat.wire.prompt_field
        if output and budget == 0:  # the answer asked for takes the whole window
            param = field
            message = (
                f"This request asks for up to {output} output tokens ({field}), which leaves no room "
                f"in the usable budget (model window or team cap) for the prompt ({tokens} tokens, at "
                f"least {needed} after compression). Lower {field}."
            )
        else:
            message = (
                f"This request needs at least {needed} prompt tokens even after compression, but the "
                f"usable budget (model window or team cap) is {budget} tokens (prompt was {tokens} "
                "tokens). Shorten the system prompt or the latest message"
            )
            if output and needed <= budget + output:  # a smaller answer would leave it room
                message += f", or lower {field} to at most {output - (needed - budget)}"
            message += "."
        raise GatewayError(
            400,
            message,
            param=param,
            code="context_length_exceeded",
            headers={"x-gateway-prompt-tokens-before": str(tokens), "x-gateway-compression": "refused"},
        ) from None
    if body is None:
        return Plan(chat.raw, budget, tokens, tokens)
    return Plan(orjson.dumps(body), budget, tokens, result.tokens_after + fixed, tuple(result.stages), result)


def over_the_cap(chat: ChatRequest, tokens: int, cap: int, why: str) -> GatewayError:
    """A prompt over its team's cap that the gateway cannot compress (`why`: items laid out so that
    a pair could be split, a history kept upstream): the upstream would take it, the team's
    policy does not."""
    metrics.REFUSALS.inc()
    return GatewayError(
        400,
        f"This prompt has {tokens} tokens, over the {cap} your team's context cap allows, and the "
        f"gateway cannot compress it: {why}.",
        param=chat.wire.prompt_field,
        code="context_length_exceeded",
        headers={"x-gateway-prompt-tokens-before": str(tokens), "x-gateway-compression": "refused"},
    )


_OUTPUT_FIELDS = ("max_output_tokens", "max_completion_tokens", "max_tokens")


def _is_count(value: object, count: int) -> bool:
    return type(value) is int and value == count  # `true` equals 1 but is no count


def demand(chat: ChatRequest, plan: Plan) -> int:
    """What a request asks of the window: its prompt (as counted) plus the output it asked for.
    Without max_tokens upstreams check the prompt alone, so nothing is added."""
    return plan.tokens_after + (requested_output(chat.view.counted) or 0)


def bisected_budget(runtime: Runtime, chat: ChatRequest, estimate: int) -> int:
    """Prompt tokens that fit a demand estimate learned from accepted and refused requests.

    The estimate is in demand units, measured on this model's own answers: only the output
    this request asks for and the safety margin come off, not a default output reserve.
    """
    output = requested_output(chat.view.counted) or 0
    # The margin covers counting noise, which scales with the prompt: small windows keep most of it.
    margin = min(runtime.settings.budget.safety_margin, estimate // BISECTED_MARGIN_DIVISOR)
    return max(1, estimate - output - margin)


def refusal_of(runtime: Runtime, chat: ChatRequest, sent: Plan, overflow: Overflow) -> Refusal:
    return Refusal(
        demand=demand(chat, sent),
        prompt_tokens=sent.tokens_after,
        stated_window=overflow.window,
        stated_prompt=overflow.prompt_tokens,
        stated_output=overflow.requested_output,
        expected_window=runtime.windows.reference_window(chat.model),
    )


def overflow_retry_budget(
    runtime: Runtime, chat: ChatRequest, sent: Plan, overflow: Overflow, window: int | None
) -> int | None:
    """A budget, in the gateway's own token units, that the upstream will accept this time.

    ``window`` is the stated window when it was believed (`learned_windows.judge`), else None.
    None when compressing cannot help: the requested output alone fills the stated window, or
    the refused request was smaller than any plausible window.
    When the upstream states its count of what was sent, its ratio to ours converts the stated
    window into our units (our estimate can be off for non-OpenAI tokenizers).

    With no believable window the retry must not fail again (a second refusal reaches the
    client): it aims at the largest demand this model accepted when that is close below the
    refused one (a growing conversation's previous turn), else at the bisection estimate.
    """
    ceiling = int(sent.tokens_after * OVERFLOW_RETRY_HEADROOM)
    if window is None:
        refused = demand(chat, sent)
        if refused < runtime.settings.windows.min_plausible_window:
            # Smaller than any plausible window: the upstream's complaint is about something else.
            return None
        evidence = runtime.windows.learned.get(chat.model)
        target = int(refused * OVERFLOW_BLIND_CUT)
        if evidence is not None and evidence.accepted is not None and evidence.accepted >= target:
            target = evidence.accepted
        elif evidence is not None:
            target = evidence.estimate() or target
        return max(1, min(ceiling, bisected_budget(runtime, chat, target)))
    if overflow.requested_output is not None and overflow.requested_output >= window:
        return None
    cfg = runtime.settings.budget
    # An input limit covers the prompt alone: no room to reserve for the answer.
    budget = (
        max(0, window - cfg.safety_margin) if overflow.input_limit else cfg.usable(window, chat.view.counted)
    )
    if overflow.prompt_tokens and overflow.prompt_tokens > sent.tokens_after:
        budget = budget * sent.tokens_after // overflow.prompt_tokens
    return max(1, min(ceiling, int(budget * OVERFLOW_RETRY_HEADROOM)))
