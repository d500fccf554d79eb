"""`upcoming_spans`: what a conversation that still fits will drop first, known before it drops."""

from __future__ import annotations

import random
from typing import Any

from gateway.compress.fit import fit, upcoming_spans
from gateway.tokens.counter import counter_for

MODEL = "gpt-4o"
BUDGET = 6_000


def chat_turns(seed: int, turns: int) -> list[dict[str, Any]]:
    """Turns of uneven sizes, some with a tool call, like a support or coding chat."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You help with the billing service."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + "detail " * rng.randint(20, 260)})
        if rng.random() < 0.4:
            call = f"call_{turn}"
            messages += [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": call, "type": "function", "function": {"name": "grep", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": call, "content": "hit.py:1: x\n" * rng.randint(5, 150)},
            ]
        messages.append({"role": "assistant", "content": f"Answer {turn}. " + "text " * rng.randint(10, 200)})
    return messages


def ask(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [*history, {"role": "user", "content": "And now?"}]


def first_drop_and_spans_ahead(seed: int) -> tuple[str, set[str]]:
    """The key of the first span a growing conversation drops, and the keys named ahead of it."""
    counter = counter_for(MODEL)
    ahead: set[str] = set()
    for turns in range(1, 200):
        messages = ask(chat_turns(seed, turns))
        result = fit(messages, model=MODEL, budget_tokens=BUDGET)
        if result.spans:
            return result.spans[0].key, ahead
        if counter.messages(messages) >= 0.8 * BUDGET:
            ahead |= {span.key for span in upcoming_spans(messages, model=MODEL, budget_tokens=BUDGET)}
    raise AssertionError("the conversation never outgrew its budget")


def test_the_first_drop_removes_a_span_known_ahead() -> None:
    checked = hits = 0
    for seed in range(12):
        dropped, ahead = first_drop_and_spans_ahead(seed)
        if not ahead:
            continue  # one turn took it from below the share to past the budget: nothing to know ahead
        checked += 1
        hits += dropped in ahead
    assert checked >= 8
    assert hits == checked


def test_nothing_is_upcoming_before_a_grid_cut_or_without_history() -> None:
    small = ask(chat_turns(0, 2))
    assert upcoming_spans(small, model=MODEL, budget_tokens=BUDGET) == ()
    huge_question = [{"role": "user", "content": "word " * 20_000}]
    assert upcoming_spans(huge_question, model=MODEL, budget_tokens=BUDGET) == ()
