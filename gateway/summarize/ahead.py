"""Summaries made ahead of the first drop, while the conversation still fits.

A conversation whose prompt has reached `start_ratio` of its budget will drop turns
soon. The span it will drop first is known already (`upcoming_spans`: the first cut of
the drop grid depends only on the turns before it), so it is summarized now, in the background,
and the request that first drops finds the summary instead of sending the digest once.

Cheap when nothing is due: below the ratio it is one comparison. Above it, finding the
spans costs a fit (off the event loop, one at a time per process: a busy process skips,
a later request of the conversation tries again). A conversation is then remembered by
its opening (model, budget, first two messages) with the prefix its spans end at, so its
later requests hash that prefix instead of fitting again. The summaries themselves go
through `Summarizer.make`: the same store, lock and single flight as after a drop.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence

from gateway.compress.fit import Message, span_key, upcoming_spans
from gateway.settings import CompressionSettings
from gateway.summarize.summarizer import Charge, Summarizer

# Conversations remembered per process (an evicted one costs one more fit).
MAX_CONVERSATIONS = 1_024


class SummariesAhead:
    def __init__(self, summarizer: Summarizer, options: CompressionSettings) -> None:
        self.summarizer = summarizer
        self.options = options
        self.share = options.summarizer.start_ratio
        # (model, budget, opening key) -> (messages up to the last upcoming span, their key)
        self._known: OrderedDict[tuple[str, int, str], tuple[int, str]] = OrderedDict()
        self._fitting = False

    def due(self, tokens: int, budget: int) -> bool:
        """Whether a prompt of `tokens` (that fits `budget`) is close enough to it to start."""
        return self.share < 1 and tokens >= budget * self.share

    async def prepare(
        self, messages: Sequence[Message], *, model: str, budget: int, charge: Charge | None
    ) -> None:
        """Summarize what this conversation's first drop will remove, unless already under way.

        `budget` is the messages' own (the request's less its tools and schemas).
        """
        conversation = (model, budget, span_key(messages[:2]))
        known = self._known.get(conversation)
        if known is not None and len(messages) > known[0] and span_key(messages[: known[0]]) == known[1]:
            self._known.move_to_end(conversation)
            return
        if self._fitting:
            return
        self._fitting = True
        try:
            spans = await asyncio.to_thread(
                upcoming_spans,
                messages,
                model=model,
                budget_tokens=budget,
                options=self.options,
            )
        finally:
            self._fitting = False
        if not spans:
            return
        last = spans[-1].messages[-1]
        end = next(i for i, message in enumerate(messages) if message is last) + 1
        self._known[conversation] = (end, span_key(messages[:end]))
        if len(self._known) > MAX_CONVERSATIONS:
            self._known.popitem(last=False)
        for span in spans:
            await self.summarizer.make(span, model, charge=charge)
