"""Markers joined to the user message beside them (`compression.markers: merged`), for chat
templates that need user and assistant messages to alternate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway  # noqa: F401
from gateway.compress import CompressionOptions, ContextBudgetExceeded, fit
from gateway.compress.markers import join_user_runs
from gateway.settings import ConfigError, load_settings
from gateway.tokens.counter import counter_for
from gateway.wire.fitting import fit_request
from gateway.wire.responses import RESPONSES
from tests.fakes import responses_api
from tests.fakes.responses_api import ResponsesState
from tests.fakes.validation import alternates, validate_chat_messages

MODEL = "gpt-4o"
COUNTER = counter_for(MODEL)


def conversation(turns: int, steps: int, words: int, parts: bool) -> list[dict[str, Any]]:
    """A chat of `turns` turns, then a task answered by `steps` tool steps: roles alternate."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        text = f"Question {turn}: " + "the cache is warm again " * words
        content: Any = [{"type": "text", "text": text}] if parts and turn % 2 else text
        messages += [
            {"role": "user", "content": content},
            {"role": "assistant", "content": f"Answer {turn}: " + "it was cold " * words},
        ]
    messages.append({"role": "user", "content": "Task: find the stale worker."})
    for step in range(steps):
        call = {"id": f"c{step}", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{step}", "content": f"worker_{step}.py ok\n" * words},
        ]
    return messages


@settings(max_examples=80, deadline=None)
@given(
    turns=st.integers(1, 20),
    steps=st.integers(0, 20),
    words=st.integers(5, 60),
    parts=st.booleans(),
    share=st.floats(0.1, 0.9),
)
def test_merged_markers_keep_the_roles_alternating_within_budget(
    turns: int, steps: int, words: int, parts: bool, share: float
) -> None:
    messages = conversation(turns, steps, words, parts)
    assert alternates(messages)
    budget = max(400, int(COUNTER.messages(messages) * share))
    try:
        result = fit(messages, model=MODEL, budget_tokens=budget)
    except ContextBudgetExceeded:
        return
    merged = join_user_runs(result.messages)
    assert alternates(merged), [m["role"] for m in merged]
    assert validate_chat_messages(merged) is None
    assert COUNTER.messages(merged) <= result.tokens_after <= budget
    text = str(merged)
    assert all(str(result.messages[span.index]["content"])[:60] in text for span in result.spans)


def test_a_message_of_tool_results_is_never_joined_and_parts_keep_their_kind() -> None:
    """Anthropic's tool results open their user message: a marker before one stays apart. Joined
    text becomes a part of the wire's kind (Responses: `input_text`)."""
    results = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}
    marker = {"role": "user", "content": "[context-gateway: 4 earlier messages omitted]"}
    assistant = {"role": "assistant", "content": "done"}
    assert join_user_runs([assistant, marker, results]) == [assistant, marker, results]
    # Fuzzed: an image-only Responses item took a chat-style `text` part, which the API refuses.
    item = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}
    joined = join_user_runs([marker, item], "input_text")
    assert joined == [
        {**marker, "content": [{"type": "input_text", "text": marker["content"]}, *item["content"]]}
    ]


def test_merged_markers_on_the_responses_api_take_its_text_parts() -> None:
    """Fuzzed: joined to a user item of only an image or a file, the marker became a chat-style
    `text` part, which the Responses API refuses ("Invalid value: 'text'")."""
    items: list[dict[str, Any]] = []
    for turn in range(16):
        items += [
            {"role": "user", "content": f"Question {turn}: " + "why is it slow? " * 60},
            {"role": "assistant", "content": f"Answer {turn}: " + "the cache. " * 60},
        ]
    items.append({"role": "user", "content": [{"type": "input_file", "file_id": "file-abc"}]})
    body = {"model": MODEL, "input": items}
    view = RESPONSES.view(body)
    tokens = COUNTER.request(view.counted)
    options = CompressionOptions(markers="merged")
    out, result, _ = fit_request(
        RESPONSES, body, view, model=MODEL, budget=tokens // 3, tokens=tokens, options=options
    )
    assert out is not None and "drop_turns" in result.stages
    assert responses_api.validate(out, ResponsesState()) is None


@pytest.mark.parametrize("value", ["", "Merged", "both", "merged\x00", "m" * 10_000, "[merged]", "1"])
def test_the_markers_option_refuses_hostile_values_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match="markers"):
        load_settings(None, {"GATEWAY_COMPRESSION_MARKERS": value})


def test_the_markers_option_is_read_from_yaml(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("compression:\n  markers: merged\n")
    assert load_settings(config, {}).compression.markers == "merged"
    assert load_settings(None, {}).compression.markers == "separate"
    for hostile in ("{deep: [[[merged]]]}", "7", "[merged, separate]"):
        config.write_text(f"compression:\n  markers: {hostile}\n")
        with pytest.raises(ConfigError, match="markers"):
            load_settings(config, {})
