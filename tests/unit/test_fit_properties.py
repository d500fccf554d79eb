"""Property tests of `fit` over random conversations in OpenAI and Anthropic-style shapes.

Texts are built from a drawn seed and length (cheap to generate even when
huge) out of English words, Chinese, numbers, identifiers and log-like lines.
Every message carries an unknown field `x_id` (its input position), which
lets tests check that unknown fields survive and that order is preserved.
Whether a result fits is judged by an independent counter (the fake
upstream's, and the cookbook's arithmetic for tool definitions), not by the
gateway's own; tool definitions count against the budget.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gateway  # noqa: F401  (offline tiktoken)
from gateway.compress import CompressionOptions, ContextBudgetExceeded, FitResult, fit
from gateway.compress.transforms import placeholder, text_chars, tool_names
from gateway.compress.units import group_units, is_user_input
from gateway.tokens.counter import counter_for
from tests.fakes.anthropic_api import final_thinking_error
from tests.fakes.tokens import REPLY_PRIMING, count_message, count_text
from tests.fakes.validation import validate_chat_messages
from tests.unit.test_tokens_counter import cookbook_function_tokens

WORDS = [
    "the",
    "build",
    "failed",
    "because",
    "config",
    "value",
    "user",
    "order",
    "we",
    "deploy",
    "服务",
    "配置",
    "错误",
    "用户",
    "订单",
    "因为",
    "部署",
    "成功",
    "ERROR",
    "ok",
    "id=4471",
    "AB-1234",
    "12.5",
    "2024-05-01",
    "{",
    "}",
    '"key":',
    "timeout",
    "的",
    "。",
]


def make_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(words):
        out.append(rng.choice(WORDS))
        out.append("\n" if i % 12 == 11 else " ")
    return "".join(out)


Texts = st.SearchStrategy[str]
texts: Texts = st.builds(
    make_text,
    st.integers(0, 10_000),
    st.one_of(st.integers(1, 40), st.integers(40, 600), st.integers(2_000, 6_000)),
)
# Many turns of short texts: the drop phase does the work, on a fine grid of turns.
short_texts: Texts = st.builds(make_text, st.integers(0, 10_000), st.integers(1, 300))


@st.composite
def user_content(draw: st.DrawFn, texts: Texts = texts) -> Any:
    text = draw(texts)
    kind = draw(st.sampled_from(["str", "str", "parts", "image"]))
    if kind == "str":
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if kind == "image":
        parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
    return parts


@st.composite
def openai_round(draw: st.DrawFn, turn: int, answered: bool, texts: Texts = texts) -> list[dict[str, Any]]:
    calls = draw(st.integers(1, 3))
    ids = [f"call_{turn}_{draw(st.integers(0, 10**6))}_{i}" for i in range(calls)]
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": draw(st.sampled_from([None, "Let me look."])),
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
            for i in ids
        ],
    }
    if not answered:
        return [assistant]
    answers = [{"role": "tool", "tool_call_id": i, "content": draw(texts)} for i in ids]
    return [assistant, *answers]


@st.composite
def anthropic_round(draw: st.DrawFn, turn: int, answered: bool, texts: Texts = texts) -> list[dict[str, Any]]:
    calls = draw(st.integers(1, 3))
    ids = [f"toolu_{turn}_{draw(st.integers(0, 10**6))}_{i}" for i in range(calls)]
    blocks: list[dict[str, Any]] = []
    if draw(st.booleans()):
        blocks.append({"type": "thinking", "thinking": draw(texts), "signature": "sig"})
    blocks.append({"type": "text", "text": "Checking."})
    blocks += [{"type": "tool_use", "id": i, "name": "grep", "input": {"pattern": "x"}} for i in ids]
    assistant = {"role": "assistant", "content": blocks}
    if not answered:
        return [assistant]
    results = [{"type": "tool_result", "tool_use_id": i, "content": draw(texts)} for i in ids]
    return [assistant, {"role": "user", "content": results}]


@st.composite
def legacy_round(draw: st.DrawFn, turn: int, answered: bool, texts: Texts = texts) -> list[dict[str, Any]]:
    """The legacy functions API: one `function_call`, answered by a `role: function` message."""
    call = {"name": "read_file", "arguments": f'{{"path": "f{turn}.py"}}'}
    assistant = {"role": "assistant", "content": None, "function_call": call}
    if not answered:
        return [assistant]
    return [assistant, {"role": "function", "name": "read_file", "content": draw(texts)}]


ROUNDS = {"openai": openai_round, "anthropic": anthropic_round, "legacy": legacy_round}


def legacy_pairing_error(messages: list[dict[str, Any]]) -> str | None:
    """Where a `role: function` answer does not directly follow its `function_call`, or a call
    before the last message goes unanswered."""
    for index, message in enumerate(messages):
        before = messages[index - 1] if index else {}
        if message["role"] == "function" and not (
            before.get("role") == "assistant" and "function_call" in before
        ):
            return f"messages[{index}]: a function answer without its call"
        answered = index + 1 < len(messages) and messages[index + 1]["role"] == "function"
        if "function_call" in message and index + 1 < len(messages) and not answered:
            return f"messages[{index}]: a function call without its answer"
    return None


@st.composite
def conversations(draw: st.DrawFn, max_turns: int = 8, texts: Texts = texts) -> list[dict[str, Any]]:
    style = draw(st.sampled_from(sorted(ROUNDS)))
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts)})
    if draw(st.booleans()):
        messages.append({"role": "developer", "content": "Answer briefly."})
    turns = draw(st.integers(0, max_turns))
    for turn in range(turns):
        messages.append({"role": "user", "content": draw(user_content(texts))})
        for _ in range(draw(st.integers(0, 2))):
            messages += draw(ROUNDS[style](turn, answered=True, texts=texts))
        reply: dict[str, Any] = {"role": "assistant", "content": draw(texts)}
        if draw(st.booleans()):
            reply["reasoning_content"] = draw(texts)
        messages.append(reply)
    if draw(st.booleans()):
        results_last = (
            len(messages) > 2 and messages[-2]["role"] == "user" and messages[-3]["role"] == "assistant"
        )
        if style == "anthropic" and results_last and draw(st.booleans()):
            messages.pop()  # the last round's results, then the question in a user message of its own
        messages.append({"role": "user", "content": draw(user_content(texts))})
        if draw(st.integers(0, 4)) == 0:  # tool calls with no answer yet
            messages += draw(ROUNDS[style](turns, answered=False, texts=texts))
    for position, message in enumerate(messages):
        message["x_id"] = position
    return messages


@st.composite
def tool_definitions(draw: st.DrawFn) -> list[dict[str, Any]] | None:
    """None, or flat function tools with drawn names, descriptions and parameters."""
    if draw(st.booleans()):
        return None
    tools = []
    for k in range(draw(st.integers(1, 4))):
        properties = {
            f"arg{p}": {
                "type": draw(st.sampled_from(["string", "integer"])),
                "description": draw(short_texts),
            }
            for p in range(draw(st.integers(0, 3)))
        }
        function = {"name": f"tool_{k}", "description": draw(short_texts), "parameters": {}}
        if properties:
            function["parameters"] = {"type": "object", "properties": properties}
        tools.append({"type": "function", "function": function})
    return tools


@st.composite
def agent_loops(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A conversation (maybe empty) followed by a task and 1–25 tool steps answering it."""
    messages = draw(conversations(max_turns=3))
    while messages and not (
        messages[-1]["role"] == "assistant"
        and not messages[-1].get("tool_calls")
        and "function_call" not in messages[-1]
    ):
        messages.pop()  # end on a finished turn: the loop's task is the latest user message
    style = draw(st.sampled_from(sorted(ROUNDS)))
    messages.append({"role": "user", "content": draw(user_content())})
    for step in range(draw(st.integers(1, 25))):
        messages += draw(ROUNDS[style](100 + step, answered=True))
    for position, message in enumerate(messages):
        message["x_id"] = position
    return messages


# -- properties ----------------------------------------------------------------

MODEL = "gpt-4o"
COUNTER = counter_for(MODEL)
# A fixed profile: enough examples to reach the drop and protected stages, no deadline (CI is shared).
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The tiny-budget and aggressive properties are narrower: fewer examples cover them (CI time).
NARROW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """The prompt's tokens by the independent counter (it leaves images and reasoning out: a lower bound)."""
    total = sum(count_message(m) for m in messages) + REPLY_PRIMING
    if tools:
        total += sum(cookbook_function_tokens(t["function"], count_text, 7) for t in tools) + 12
    return total


def fit_or_refuse(
    messages: list[dict[str, Any]],
    budget: int,
    tools: list[dict[str, Any]] | None = None,
    options: CompressionOptions = CompressionOptions(),  # noqa: B008 - frozen
) -> FitResult | None:
    try:
        return fit(messages, model=MODEL, budget_tokens=budget, tools=tools, options=options)
    except ContextBudgetExceeded as refused:
        assert refused.budget == budget
        assert refused.minimum > budget
        return None


def latest_user_id(messages: list[dict[str, Any]]) -> int | None:
    ids = [m["x_id"] for m in messages if is_user_input(m)]
    return ids[-1] if ids else None


@SETTINGS
@given(
    st.one_of(conversations(), agent_loops()),
    st.floats(0.02, 1.2),
    tool_definitions(),
    # The default, and the fill on a fine grid (off by default; its units change form most often).
    st.sampled_from([CompressionOptions(), CompressionOptions(fill_quantum=0.0625)]),
)
def test_fit_invariants(
    messages: list[dict[str, Any]],
    share: float,
    tools: list[dict[str, Any]] | None,
    options: CompressionOptions,
) -> None:
    original = copy.deepcopy(messages)
    size = COUNTER.messages(messages) + COUNTER.tools(tools)
    budget = max(1, int(size * share))
    result = fit_or_refuse(messages, budget, tools, options)
    assert messages == original, "input mutated"
    if result is None:
        return

    # Fits by an independent count, and the reported count is the gateway's real one.
    assert reference_tokens(result.messages, tools) <= budget
    assert result.tokens_after == COUNTER.messages(result.messages) + COUNTER.tools(tools) <= budget
    # Strict API validity: no new error (a pending tool call at the end is invalid on input too).
    if validate_chat_messages(messages) is None:
        assert validate_chat_messages(result.messages) is None
    # Legacy function calls stay paired with their answers as tool calls do.
    if legacy_pairing_error(messages) is None:
        assert legacy_pairing_error(result.messages) is None
    # The Messages API's rule on signed thinking holds whenever it held on input.
    if final_thinking_error(dialogue(messages)) is None:
        assert final_thinking_error(dialogue(result.messages)) is None
    # Order preserved and unknown fields kept: every non-marker message carries its x_id.
    ids = [m["x_id"] for m in result.messages if "x_id" in m]
    assert ids == sorted(set(ids))
    assert sum("x_id" not in m for m in result.messages) <= 2  # the markers: older turns, older steps
    # System/developer messages and the latest user message are present.
    for message in messages:
        if message["role"] in ("system", "developer"):
            assert message["x_id"] in ids
    latest = latest_user_id(messages)
    if latest is not None:
        assert latest in ids
    # Untouched unless compression was needed.
    if size <= budget:
        assert result.messages == messages and result.stages == ()
    else:
        assert result.stages
    # A trimmed protected message keeps at least the floor (or its whole size).
    floor = CompressionOptions().protected_floor_tokens
    by_id = {m["x_id"]: m for m in messages}
    for message in result.messages:
        if "x_id" in message and message != by_id[message["x_id"]]:
            unit = _unit_of(messages, message["x_id"])
            if unit is not None and unit.protected and not unit.step:
                assert COUNTER.message(message) >= floor
    # Idempotent and deterministic.
    again = fit(result.messages, model=MODEL, budget_tokens=budget, tools=tools, options=options)
    assert again.messages == result.messages and again.stages == ()
    twice = fit(copy.deepcopy(messages), model=MODEL, budget_tokens=budget, tools=tools, options=options)
    assert orjson.dumps(twice.messages) == orjson.dumps(result.messages)


def dialogue(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user and assistant messages: what the Messages API reads as its turns."""
    return [message for message in messages if message["role"] in ("user", "assistant")]


def _unit_of(messages: list[dict[str, Any]], index: int) -> Any:
    return next((u for u in group_units(messages) if u.start <= index < u.end), None)


@NARROW
@given(conversations(max_turns=3), st.integers(1, 60))
def test_tiny_budgets_refuse_or_fit(messages: list[dict[str, Any]], budget: int) -> None:
    result = fit_or_refuse(messages, budget)
    if result is not None:
        assert result.tokens_after <= budget


@NARROW
@given(
    st.one_of(conversations(), conversations(max_turns=30, texts=short_texts)),
    st.one_of(st.floats(0.02, 1.2), st.just(0.5)),
)
def test_aggressive_never_keeps_more_than_auto(messages: list[dict[str, Any]], share: float) -> None:
    """Both modes climb the same rungs and cut on the same grid: aggressive only goes further."""
    budget = max(1, int(COUNTER.messages(messages) * share))
    auto = fit_or_refuse(messages, budget)
    if auto is None:
        with pytest.raises(ContextBudgetExceeded):
            fit(messages, model=MODEL, budget_tokens=budget, aggressive=True)
        return
    result = fit(messages, model=MODEL, budget_tokens=budget, aggressive=True)
    assert result.tokens_after == COUNTER.messages(result.messages)
    assert result.tokens_after <= auto.tokens_after <= budget
    # What the plain fit keeps whole is never trimmed for headroom.
    if "protected" not in auto.stages:
        assert "protected" not in result.stages
    # The headroom is reached whenever it can be without that; else the plain budget is the fallback.
    headroom = int(budget * CompressionOptions().aggressive_ratio)
    to_headroom = fit_or_refuse(messages, headroom)
    reachable = to_headroom is not None and (
        "protected" in auto.stages or "protected" not in to_headroom.stages
    )
    assert result.tokens_after <= headroom or not reachable
    if validate_chat_messages(messages) is None:
        assert validate_chat_messages(result.messages) is None
    latest = latest_user_id(messages)
    if latest is not None:
        assert latest in [m["x_id"] for m in result.messages if "x_id" in m]


def _steps(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The messages of each step of the latest turn, oldest first."""
    return [messages[u.start : u.end] for u in group_units(messages) if u.step]


def _result_texts(message: dict[str, Any]) -> list[str]:
    return [text for _, text in _results(message)]


def _results(message: dict[str, Any]) -> list[tuple[str, str]]:
    """(call id, text) of each tool result a message holds (a legacy function answer: its name)."""
    if message["role"] == "tool":
        return [(message["tool_call_id"], message["content"])]
    if message["role"] == "function":
        return [(message["name"], message["content"])]
    content = message.get("content")
    if message["role"] == "user" and isinstance(content, list):
        return [(p["tool_use_id"], p["content"]) for p in content if p.get("type") == "tool_result"]
    return []


def _no_placeholder_is_shorter(
    message: dict[str, Any], call_id: str, text: str, names: dict[str, str]
) -> bool:
    """A result whose one-line placeholder would be no shorter is never replaced (transforms.py)."""
    chars_per_token = max(0.5, text_chars(message) / max(1, COUNTER.message(message)))
    return placeholder(text, names.get(call_id, "tool"), chars_per_token) == text


@SETTINGS
@given(agent_loops(), st.floats(0.05, 1.0), tool_definitions())
def test_agent_loops_keep_the_newest_step_and_compress_oldest_first(
    messages: list[dict[str, Any]], share: float, tools: list[dict[str, Any]] | None
) -> None:
    budget = max(1, int((COUNTER.messages(messages) + COUNTER.tools(tools)) * share))
    result = fit_or_refuse(messages, budget, tools)
    steps = _steps(messages)
    newest = steps[-1]
    others = [
        m for u in group_units(messages) if u.protected and not u.step for m in messages[u.start : u.end]
    ]
    newest_size = sum(COUNTER.message(m) for m in newest)
    rest = COUNTER.messages(others) + COUNTER.tools(tools) + 100  # + the two markers
    if newest_size <= budget / 2 and rest <= budget / 2:
        # Never refused, and the newest step is sent byte for byte (the very same objects).
        assert result is not None
        assert all(any(m is out for out in result.messages) for m in newest)
    if result is None:
        return
    kept = {m["x_id"]: m for m in result.messages if "x_id" in m}
    # Steps go oldest first: a kept step has every newer step kept.
    present = [all(m["x_id"] in kept for m in step) for step in steps]
    assert present == sorted(present)
    # No step's result is cut while an older one at least 1.5 times its size is left whole.
    cut_sizes = []
    names = tool_names(messages) | {m["name"]: m["name"] for m in messages if m["role"] == "function"}
    for step in reversed(steps):
        for message in step:
            if message["x_id"] not in kept:
                continue
            results = zip(_results(message), _result_texts(kept[message["x_id"]]), strict=True)
            for (call_id, text), new in results:
                tokens = count_text(text)
                if new != text:
                    cut_sizes.append(tokens)
                elif not _no_placeholder_is_shorter(message, call_id, text, names):
                    assert all(tokens < 1.5 * size for size in cut_sizes), "an older result left whole"
