"""The summarizer's prompt. Its version is part of every cache key: a new prompt, new summaries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.compress import CompressionOptions, fit
from gateway.compress.fit import Message

PROMPT_VERSION = "1"
# Room for the instructions, the earlier summary's framing and the closing request.
FRAME_TOKENS = 512

INSTRUCTIONS = """You compress the earlier part of a conversation between a user and an AI assistant \
(possibly an agent using tools) into notes the assistant will read instead of it. Write in the \
conversation's own language, under these headings, omitting empty ones:
1. User instructions: the user's own instructions, rules and requests, quoted verbatim.
2. Constraints and preferences: limits, deadlines, formats, things to avoid.
3. Decisions and dead ends: what was decided and why; what was tried and failed.
4. Files, identifiers and values: paths, names, numbers, URLs, settings (only the latest value \
when one was corrected).
5. Errors and fixes: each error and what fixed it.
6. Current state: where the work stands.
7. Next step: what was about to happen.
Be brief and exact. Never invent anything. Output only the notes."""

EARLIER = "Notes on the conversation before this part (keep everything in them that still holds):\n\n"
CLOSING = "Write the notes for everything above, following the instructions."


def summary_request(
    model: str,
    messages: Sequence[Message],
    earlier: str | None,
    max_input_tokens: int,
    max_output_tokens: int,
) -> dict[str, Any]:
    """The chat request that summarizes `messages` (after `earlier`, a summary of what came before).

    The span is fitted to `max_input_tokens` by the same engine as any prompt
    (without digests: the summarizer reads the span itself), so the
    summarizer never overflows; raises ContextBudgetExceeded when even that fails.
    """
    head: list[Message] = [{"role": "system", "content": INSTRUCTIONS}]
    if earlier:
        head.append({"role": "user", "content": EARLIER + earlier})
    conversation = [*head, *messages, {"role": "user", "content": CLOSING}]
    fitted = fit(
        conversation,
        model=model,
        budget_tokens=max_input_tokens,
        options=CompressionOptions(digest_ratio=0.0),
    )
    return {
        "model": model,
        "messages": fitted.messages,
        "max_tokens": max_output_tokens,
        "temperature": 0,
    }
