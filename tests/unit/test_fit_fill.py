"""The fill: room one rung leaves unused goes to the newest old turns, on a grid that only moves forward."""

from __future__ import annotations

import random
from typing import Any

from gateway.compress import CompressionOptions, fit
from gateway.tokens.counter import counter_for

MODEL = "gpt-4o"
COUNTER = counter_for(MODEL)
PLACEHOLDER = "[context-gateway: output of tool"
FILL = CompressionOptions(fill_quantum=0.25)


def tool_chat(turns: int, seed: int = 0) -> list[dict[str, Any]]:
    """A support agent's chat: each turn a question, a lookup and its (long) result, an answer."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You answer questions about orders."}]
    for turn in range(turns):
        call = f"call_{turn}"
        rows = "\n".join(
            f"order {turn}-{i}: status={rng.choice(['shipped', 'held', 'open'])} total={rng.randint(1, 999)}"
            for i in range(rng.randint(20, 60))
        )
        messages += [
            {"role": "user", "content": f"What about customer C-{turn:03d}? " + "Please check. " * 5},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {"name": "orders", "arguments": f'{{"customer": "C-{turn:03d}"}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call, "content": rows},
            {"role": "assistant", "content": f"Customer C-{turn:03d} has {rows.count(chr(10)) + 1} orders."},
        ]
    return [*messages, {"role": "user", "content": "Summarize the held orders."}]


def outputs(messages: list[Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m.get("role") == "tool"}


def test_the_room_a_rung_leaves_goes_to_the_newest_outputs() -> None:
    messages = tool_chat(35)
    budget = 8_000
    off = fit(messages, model=MODEL, budget_tokens=budget)  # the default: off
    on = fit(messages, model=MODEL, budget_tokens=budget, options=FILL)
    assert all(text.startswith(PLACEHOLDER) for text in outputs(off.messages).values())  # the old way
    filled = outputs(on.messages)
    assert not filled["call_34"].startswith(PLACEHOLDER)  # the newest output is kept (trimmed at most)
    assert filled["call_0"].startswith(PLACEHOLDER)  # the oldest still gives way
    # Newer outputs keep at least as much as older ones: the boundary is one point in the history.
    kept = [not text.startswith(PLACEHOLDER) for text in filled.values()]
    assert kept == sorted(kept)
    assert off.tokens_after < 0.4 * budget < 0.6 * budget < on.tokens_after <= budget
    finer = fit(messages, model=MODEL, budget_tokens=budget, options=CompressionOptions(fill_quantum=0.125))
    assert 0.85 * budget < finer.tokens_after <= budget


def test_on_a_growing_conversation_the_boundary_only_moves_forward() -> None:
    budget = 8_000
    forms: dict[str, str] = {}
    moves = 0
    previous: list[Any] | None = None
    for turns in range(20, 60):
        result = fit(tool_chat(turns), model=MODEL, budget_tokens=budget, options=FILL)
        assert result.tokens_after <= budget
        if "drop_turns" in result.stages:
            break
        now = outputs(result.messages)
        for call, text in forms.items():
            # Once given way, an output never comes back larger (that would break the prefix twice).
            assert len(now[call]) <= len(text), call
        moves += any(now[call] != text for call, text in forms.items())
        if previous is not None and not any(now[call] != text for call, text in forms.items()):
            # No move: the previous prompt, bar its question, is a prefix of this one.
            assert result.messages[: len(previous) - 1] == previous[:-1]
        forms, previous = now, result.messages
    assert moves >= 2  # it did move over the run


def test_the_fill_steps_back_one_level_of_the_ladder_not_to_the_rung_climbed_from() -> None:
    """After skipped rungs the rung climbed from is often the raw output, so large that no unit
    could take it back: the room then stayed unused, every output a placeholder."""
    messages = tool_chat(35)
    budget = int(0.9 * COUNTER.messages(messages))
    skipping = CompressionOptions(fill_quantum=0.25, rung_headroom=0.5)  # the cap rungs are skipped
    plain = fit(messages, model=MODEL, budget_tokens=budget, options=CompressionOptions(rung_headroom=0.5))
    assert all(text.startswith(PLACEHOLDER) for text in outputs(plain.messages).values())
    filled = fit(messages, model=MODEL, budget_tokens=budget, options=skipping)
    newest = list(outputs(filled.messages).values())[-10:]
    assert not any(text.startswith(PLACEHOLDER) for text in newest)  # at the cap one level back
    assert filled.tokens_after > 0.5 * budget > 2 * plain.tokens_after
