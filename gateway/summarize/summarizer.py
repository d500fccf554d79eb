"""Find, make and share summaries of the spans `fit()` drops; every failure falls back to the digest.

Cache: a summary is stored under the prompt version, the summarizer model and
the span's content key, with an expiry, so every replica reuses it and an
identical span (the same conversation on another replica) costs nothing.

Single flight: making a summary takes a store lock (a token and an expiry)
named after the same key. N concurrent requests of one conversation, on any
replica, make one call; the others go on with the digest (background) or wait
for the holder's result (inline).

Incremental: a span on the drop grid is its predecessor (the span of the
previous cut) plus the turns the cut moved past. When the predecessor's
summary is cached, only those turns are read, after that summary.

Paid for: a call's usage, as the summarizer reports it, is charged to whoever asked
(`charge`: the team of the request that made the call), even when the answer is then
discarded; a summary found in the store costs nobody anything.

Bounded: the input is fitted to `max_input_tokens` (prompt.py), the output is
capped at `max_output_tokens`, there is one attempt per span within `timeout`
(inline: a request's spans side by side, to one deadline), and a summary not
shorter than the span it replaces is discarded.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import orjson

from gateway import metrics
from gateway.compress import ContextBudgetExceeded
from gateway.compress.fit import DroppedSpan, span_key
from gateway.proxy.relay import reported_count
from gateway.settings import SummarizerSettings, UpstreamSettings
from gateway.store import Store
from gateway.summarize.prompt import PROMPT_VERSION, summary_request
from gateway.tokens.counter import TokenCounter, counter_for

log = logging.getLogger("gateway")

# How often an inline request polls the store for a summary another holder is making.
POLL_SECONDS = 0.05
# Summaries being made in this process at once; more spans wait for a later request.
MAX_IN_FLIGHT = 8
# A span whose summary failed is not tried again for this long (one attempt per span): its
# requests use the digest. Stored as an empty summary, so every replica knows.
FAILED_TTL_SECONDS = 600
# An answer's body is read to its end up to this size: a capped summary is far smaller
# (max_output_tokens is at most 100k), so a longer body is not a summary.
MAX_ANSWER_BYTES = 1 << 22


# (prompt tokens, completion tokens) of one summarizer call -> recorded for whoever asked.
Charge = Callable[[int, int], Awaitable[None]]


class SummaryFailed(Exception):
    """The summarizer gave nothing usable; `reason` is a metric label."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Summarizer:
    def __init__(self, settings: SummarizerSettings, upstream: UpstreamSettings, store: Store) -> None:
        self.settings = settings
        self.store = store
        base = (settings.base_url or upstream.base_url).rstrip("/")
        self.url = base + "/chat/completions"
        api_key = settings.api_key if settings.base_url else settings.api_key or upstream.api_key
        self.headers = {"content-type": "application/json"}
        if api_key:
            self.headers["authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None
        self._in_flight: set[str] = set()

    @property
    def background(self) -> bool:
        return self.settings.mode == "background"

    def key(self, span_key: str) -> str:
        return f"summary:{PROMPT_VERSION}:{self.settings.model}:{span_key}"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def cached(self, spans: Iterable[DroppedSpan]) -> dict[str, str]:
        """Summaries already in the store for these spans (span key -> text); none on a store failure.

        A span whose summary failed recently maps to "": not to be tried again, and `fit`
        uses the digest for it.
        """
        found: dict[str, str] = {}
        for span in spans:
            try:
                text = await self.store.get(self.key(span.key))
            except Exception as exc:  # a store outage costs the summary, never the request
                log.warning("summary lookup failed: %s", type(exc).__name__)
                metrics.SUMMARIES.labels("fallback").inc()
                return found
            if text is not None:
                found[span.key] = text
        metrics.SUMMARIES.labels("cache_hit").inc(sum(1 for text in found.values() if text))
        return found

    async def wait_for(
        self, spans: Iterable[DroppedSpan], model: str, charge: Charge | None = None
    ) -> dict[str, str]:
        """Inline mode: make (or wait for) the spans' summaries within one timeout; what came in time.

        The spans go side by side to one deadline: each has the whole timeout, and the request
        waits it once, however many spans its fit dropped.
        """
        deadline = asyncio.get_running_loop().time() + self.settings.timeout
        spans = list(spans)
        texts = await asyncio.gather(
            *(self.make(span, model, wait_until=deadline, charge=charge) for span in spans)
        )
        return {span.key: text for span, text in zip(spans, texts, strict=True) if text is not None}

    async def make(
        self,
        span: DroppedSpan,
        model: str,
        *,
        wait_until: float | None = None,
        charge: Charge | None = None,
    ) -> str | None:
        """The span's summary: from the store, or made here under the lock; None on any failure.

        `model` is the conversation's: the span's room is in its tokens.

        Without `wait_until` (background), a span another holder is making is
        left to it and one made here has the timeout. With it (inline: event-loop time), the
        store is polled until then, and one made here must be done by then.
        """
        key = self.key(span.key)
        mine = key not in self._in_flight and len(self._in_flight) < MAX_IN_FLIGHT
        if mine:
            self._in_flight.add(key)
        token = secrets.token_hex(16)
        lock = f"{key}:lock"
        try:
            cached = await self.store.get(key)
            if cached is not None:
                return cached or None
            if not mine or not await self.store.add(lock, token, int(self.settings.timeout) + 5):
                return await self._await_other(key, wait_until)
            try:  # the result is stored before the lock goes, so no one makes it twice
                try:
                    text = await self._summarize(span, counter_for(model), charge, wait_until)
                except SummaryFailed:
                    await self.store.set(key, "", FAILED_TTL_SECONDS)
                    raise
                await self.store.set(key, text, self.settings.cache_ttl)
            finally:
                await self.store.remove_if(lock, token)
            return text
        except SummaryFailed as failure:
            metrics.SUMMARIES.labels("fallback").inc()
            metrics.SUMMARY_FAILURES.labels(failure.reason).inc()
            return None
        except Exception as exc:  # the store: the digest stands in
            log.warning("summary failed: %s", type(exc).__name__)
            metrics.SUMMARIES.labels("fallback").inc()
            metrics.SUMMARY_FAILURES.labels("store").inc()
            return None
        finally:
            if mine:
                self._in_flight.discard(key)

    async def _await_other(self, key: str, wait_until: float | None) -> str | None:
        loop = asyncio.get_running_loop()
        while wait_until is not None and loop.time() < wait_until:
            await asyncio.sleep(POLL_SECONDS)
            text = await self.store.get(key)
            if text is not None:
                return text or None
        return None

    async def _summarize(
        self, span: DroppedSpan, counter: TokenCounter, charge: Charge | None, deadline: float | None
    ) -> str:
        """One attempt, done by `deadline` (event-loop time) or else within the timeout, its input
        included; raises SummaryFailed with the reason."""
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self.settings.timeout
        try:
            async with asyncio.timeout_at(deadline):
                body = await self._request_body(span)
                started = time.perf_counter()
                try:
                    answer = await self._post(body)
                finally:
                    metrics.SUMMARIZER_LATENCY.observe(time.perf_counter() - started)
        except TimeoutError:
            raise SummaryFailed("timeout") from None
        except aiohttp.ClientError:
            raise SummaryFailed("unreachable") from None
        await self._account(answer, charge)
        text = _summary_text(answer)
        tokens = counter.text(text)
        if tokens > span.room or tokens >= counter.messages(span.messages):
            raise SummaryFailed("too_long")
        metrics.SUMMARIES.labels("made").inc()
        return text

    async def _request_body(self, span: DroppedSpan) -> dict[str, Any]:
        """The summarizer request for `span`: after its predecessor's summary when that is stored."""
        messages: tuple[Any, ...] = span.messages
        earlier = None
        if span.previous:
            earlier = await self.store.get(self.key(span_key(span.messages[: span.previous])))
            if earlier is not None:
                messages = span.messages[span.previous :]
        try:
            # Fitting a long span takes a while: off the event loop, which serves requests. Past
            # the deadline the wait ends; the thread finishes its fit and the result is dropped.
            return await asyncio.to_thread(
                summary_request,
                self.settings.model,
                messages,
                earlier,
                self.settings.max_input_tokens,
                min(self.settings.max_output_tokens, span.room),  # what the marker can hold
            )
        except ContextBudgetExceeded:
            raise SummaryFailed("overflow") from None

    async def _account(self, answer: Mapping[str, Any], charge: Charge | None) -> None:
        """The call's tokens, from the answer's usage: to the metrics, and to whoever asked."""
        usage = answer.get("usage")
        if not isinstance(usage, Mapping):
            return
        # A count no call could spend (2**64 once used up a team's day) is not charged.
        prompt, completion = (
            reported_count(usage.get(kind)) or 0 for kind in ("prompt_tokens", "completion_tokens")
        )
        metrics.SUMMARIZER_TOKENS.labels("prompt").inc(prompt)
        metrics.SUMMARIZER_TOKENS.labels("completion").inc(completion)
        if charge is not None and prompt + completion:
            await charge(prompt, completion)

    async def _post(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        # A redirect is not followed: it would send the conversation span to another
        # origin, whose answer would then be used; a 3xx is a failure like any other status.
        async with self._session.post(
            self.url, data=orjson.dumps(body), headers=self.headers, allow_redirects=False
        ) as reply:
            if reply.status != 200:
                raise SummaryFailed(f"status_{reply.status // 100}xx")
            raw = await _whole_body(reply)
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise SummaryFailed("garbage") from None
        if not isinstance(answer, Mapping):
            raise SummaryFailed("garbage")
        return answer


async def _whole_body(reply: aiohttp.ClientResponse) -> bytes:
    """The body to its end, however many pieces it arrives in; one over MAX_ANSWER_BYTES is garbage."""
    if (reply.content_length or 0) > MAX_ANSWER_BYTES:
        raise SummaryFailed("garbage")
    body = bytearray()
    async for piece in reply.content.iter_any():
        body += piece
        if len(body) > MAX_ANSWER_BYTES:
            raise SummaryFailed("garbage")
    return bytes(body)


def _summary_text(answer: Mapping[str, Any]) -> str:
    """The answer's text; a refusal, a cut-off answer or anything malformed is a failure."""
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, Mapping) else None
    if not isinstance(message, Mapping) or not isinstance(choice, Mapping):
        raise SummaryFailed("garbage")
    if message.get("refusal"):
        raise SummaryFailed("refused")
    if choice.get("finish_reason") == "length":
        raise SummaryFailed("too_long")
    content = message.get("content")
    if not isinstance(content, str) or not content.strip():
        raise SummaryFailed("garbage")
    return content.strip()
