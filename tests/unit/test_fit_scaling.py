"""fit's work grows linearly with the input: measured in messages read, never in seconds.

Stage 5 weighs a marker at every candidate cut; when each weighing listed the
dropped messages, the reads grew with the square of the conversation (100k
short messages took minutes). Reads are deterministic, so doubling the input
must about double them; a quadratic step would quadruple them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import pytest

import gateway  # noqa: F401
from gateway.compress import fit, transforms
from gateway.compress.fit import _Fitter

MODEL = "gpt-4o"
Message = dict[str, Any]


class CountingMessages(Sequence[Message]):
    """A message list that counts every message handed out, by index, slice or iteration."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.reads = 0

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Iterator[Message]:
        for message in self.messages:
            self.reads += 1
            yield message

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            items = self.messages[index]
            self.reads += len(items)
            return items
        self.reads += 1
        return self.messages[index]


def chat(count: int) -> list[Message]:
    """A long chat of short messages, ending on a user question."""
    messages: list[Message] = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"Message {i}: the cache for order {i * 7} is warm."})
    messages.append({"role": "user", "content": "Which order is still cold?"})
    return messages


def tiny_steps(count: int) -> list[Message]:
    """One task answered by many one-line tool steps."""
    messages: list[Message] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Find the stale worker."},
    ]
    for i in range(count):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"worker_{i}.py ok"})
    return messages


def reads(build: Callable[[int], list[Message]], count: int, budget: int) -> int:
    messages = CountingMessages(build(count))
    result = fit(messages, model=MODEL, budget_tokens=budget)
    assert "drop_turns" in result.stages  # the stage whose search went quadratic is exercised
    return messages.reads


@pytest.mark.parametrize(("build", "count", "budget"), [(chat, 2000, 1000), (tiny_steps, 1000, 1000)])
def test_doubling_the_input_about_doubles_the_messages_read(
    build: Callable[[int], list[Message]], count: int, budget: int
) -> None:
    single, double = reads(build, count, budget), reads(build, 2 * count, budget)
    assert double <= 2.5 * single, (single, double)


@pytest.mark.parametrize(("build", "count", "budget"), [(chat, 2000, 1000), (tiny_steps, 1000, 1000)])
def test_doubling_the_input_about_doubles_the_units_weighed(
    build: Callable[[int], list[Message]], count: int, budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The room of a marker's account (half the tokens of the run it stands for) was summed unit by
    unit at every candidate cut: reads of the messages stayed linear, the sums went quadratic
    (100k short messages took 23 s to fit, against 0.7 s to count them)."""
    weighed = 0
    unit_size = _Fitter._unit_size

    def counting(self: Any, unit: Any) -> int:
        nonlocal weighed
        weighed += 1
        return unit_size(self, unit)

    monkeypatch.setattr(_Fitter, "_unit_size", counting)
    sizes = []
    for n in (count, 2 * count):
        weighed = 0
        assert "drop_turns" in fit(build(n), model=MODEL, budget_tokens=budget).stages
        sizes.append(weighed)
    assert sizes[1] <= 2.5 * sizes[0], sizes


@pytest.fixture
def condensed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every text condensed (transforms.condense) while the test runs."""
    lengths: list[int] = []
    real = transforms.condense

    def counting(text: str, max_chars: int, *args: Any, **kwargs: Any) -> str:
        lengths.append(len(text))
        return real(text, max_chars, *args, **kwargs)

    monkeypatch.setattr(transforms, "condense", counting)
    return lengths


def test_a_huge_protected_message_is_condensed_a_few_times_not_once_per_halving(condensed: list[int]) -> None:
    """A protected trim tried every cap from three quarters of the message down, each a condense of
    the whole text: a latest message of 2 MB of distinct short lines into 4k tokens was condensed
    nine times (2.4 s in fit, 0.8 s now). The scan starts at the cap the room allows."""
    rng = random.Random(7)
    for lines in (20_000, 80_000):
        text = "\n".join(f"job {rng.randrange(10**9)} done" for _ in range(lines))
        messages = [{"role": "system", "content": "Summarize the log."}, {"role": "user", "content": text}]
        condensed.clear()
        result = fit(messages, model=MODEL, budget_tokens=2000)
        assert result.stages == ("protected",) and result.tokens_after <= 2000
        kept = result.messages[-1]["content"]
        assert kept.startswith(text[:40]) and kept.endswith(text[-40:])
        assert 1 <= condensed.count(len(text)) <= 3, condensed


def test_a_huge_older_step_is_condensed_a_few_times_not_once_per_halving(condensed: list[int]) -> None:
    """An older step too big for the recent window keeps its result cut to the room left: the cap
    is found from estimates, and only the caps about it are condensed, not every halving of a
    log of megabytes."""
    rng = random.Random(11)
    log = "\n".join(f"job {rng.randrange(10**9)} done" for _ in range(80_000))
    call = {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "Run the jobs."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": log},
        {"role": "assistant", "content": None, "tool_calls": [{**call, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
    ]
    result = fit(messages, model=MODEL, budget_tokens=20_000)
    assert result.tokens_after <= 20_000
    kept = next(m["content"] for m in result.messages if m.get("tool_call_id") == "call_1")
    assert kept.startswith(log[:40]) and kept.endswith(log[-40:])  # cut, not a note
    assert 1 <= condensed.count(len(log)) <= 4, condensed
