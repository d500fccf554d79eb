"""Edge cases of `fit` and cache stability on a growing conversation."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest

import gateway  # noqa: F401
from gateway.compress import CompressionOptions, ContextBudgetExceeded, fit
from gateway.compress.signed_thinking import unpinned
from gateway.tokens.counter import counter_for
from tests.fakes import anthropic_api
from tests.fakes.anthropic_api import final_thinking_error
from tests.fakes.validation import check_final_thinking, validate_chat_messages

MODEL = "gpt-4o"
COUNTER = counter_for(MODEL)


def log_text(seed: int, lines: int) -> str:
    return "\n".join(f"2024-05-01 12:{i % 60:02d}:00 INFO worker-{seed} step {i} ok" for i in range(lines))


def prose(words: int) -> str:
    return " ".join(f"word{i % 50}" for i in range(words)) + "."


def agent_turn(turn: int, result_lines: int = 400) -> list[dict[str, Any]]:
    call = f"call_{turn}"
    return [
        {"role": "user", "content": f"Task {turn}: please look at module {turn}."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call, "type": "function", "function": {"name": "run", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": call, "content": log_text(turn, result_lines)},
        {"role": "assistant", "content": f"Module {turn} looks fine. " + prose(150)},
    ]


def prefix_shares(outputs: list[list[dict[str, Any]]]) -> list[float]:
    """Per request, the share of its prompt (in tokens) that is an identical message prefix of the next."""
    shares = []
    for before, after in itertools.pairwise(outputs):
        same = 0
        for x, y in zip(before, after, strict=False):
            if x != y:
                break
            same += 1
        shares.append(COUNTER.messages(before[:same]) / COUNTER.messages(before))
    return shares


def test_empty_list_fits_or_refuses() -> None:
    assert fit([], model=MODEL, budget_tokens=100).messages == []
    with pytest.raises(ContextBudgetExceeded):
        fit([], model=MODEL, budget_tokens=1)


def test_only_a_system_message_is_trimmed_as_last_resort() -> None:
    messages = [{"role": "system", "content": prose(5_000)}]
    result = fit(messages, model=MODEL, budget_tokens=1_000)
    assert result.stages == ("protected",)
    assert result.tokens_after <= 1_000
    assert result.messages[0]["role"] == "system"
    assert "omitted by context-gateway" in result.messages[0]["content"]


def test_single_huge_user_message_keeps_head_and_tail() -> None:
    text = "BEGIN " + prose(50_000) + " END"
    result = fit([{"role": "user", "content": text}], model=MODEL, budget_tokens=2_000)
    content = result.messages[0]["content"]
    assert content.startswith("BEGIN") and content.endswith("END")
    assert result.tokens_after <= 2_000


def test_refuses_before_losing_the_latest_user_message() -> None:
    messages = [{"role": "system", "content": prose(3_000)}, {"role": "user", "content": prose(3_000)}]
    with pytest.raises(ContextBudgetExceeded) as refused:
        fit(messages, model=MODEL, budget_tokens=300)
    assert refused.value.budget == 300
    assert refused.value.tokens == COUNTER.messages(messages)
    assert refused.value.minimum > 300
    assert "300" in str(refused.value)


def test_old_tool_results_are_trimmed_before_anything_is_dropped() -> None:
    messages = [{"role": "system", "content": "Be brief."}]
    for turn in range(6):
        messages += agent_turn(turn)
    messages.append({"role": "user", "content": "Summarise."})
    result = fit(messages, model=MODEL, budget_tokens=COUNTER.messages(messages) // 2)
    assert result.stages == ("tool_results",)
    assert result.messages_dropped == 0
    trimmed = [
        m for m in result.messages if m["role"] == "tool" and "omitted by context-gateway" in m["content"]
    ]
    assert trimmed and all(m["content"].startswith("2024-05-01 12:00:00") for m in trimmed)


def test_parallel_calls_and_pending_calls_stay_paired() -> None:
    messages: list[dict[str, Any]] = [{"role": "developer", "content": "Use tools."}]
    for turn in range(8):
        ids = [f"c{turn}a", f"c{turn}b", f"c{turn}c"]
        messages.append({"role": "user", "content": prose(300)})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
                ],
            }
        )
        messages += [{"role": "tool", "tool_call_id": i, "content": log_text(turn, 200)} for i in ids]
    messages.append({"role": "user", "content": "go on"})
    pending = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "late", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    for budget in (20_000, 5_000, 1_000, 400):
        result = fit(messages, model=MODEL, budget_tokens=budget)
        assert validate_chat_messages(result.messages) is None
        assert result.messages[0]["role"] == "developer"
        with_pending = fit([*messages, pending], model=MODEL, budget_tokens=budget)
        assert with_pending.messages[-1] is pending and with_pending.messages[-2]["content"] == "go on"


def test_legacy_function_calls_stay_paired_and_their_answers_are_trimmed_as_tool_results() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use functions."},
        {"role": "user", "content": "Task: " + log_text(0, 20)},
    ]
    for step in range(8):
        arguments = json.dumps({"step": step, "command": log_text(step, 10)})
        messages.append(
            {"role": "assistant", "content": None, "function_call": {"name": "run", "arguments": arguments}}
        )
        messages.append({"role": "function", "name": "run", "content": log_text(step, 80)})
    size = COUNTER.messages(messages)
    for share in (0.1, 0.2, 0.3, 0.5):
        result = fit(messages, model=MODEL, budget_tokens=int(size * share))
        out = result.messages
        for index, message in enumerate(out):
            if message["role"] == "function":  # each answer right after its call
                assert "function_call" in out[index - 1], (share, index)
            if "function_call" in message:
                assert out[index + 1]["role"] == "function", (share, index)
        # Older answers become one-line notes naming the function, as tool results do.
        assert "tool_results" in result.stages
        assert any(m["role"] == "function" and "output of tool `run` omitted" in m["content"] for m in out)
        if share >= 0.3:  # the newest answer fits in half the budget: sent whole
            assert out[-1] is messages[-1]


def test_anthropic_blocks_keep_pairs_and_drop_old_thinking() -> None:
    messages: list[dict[str, Any]] = []
    for turn in range(6):
        messages.append({"role": "user", "content": [{"type": "text", "text": prose(400)}]})
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": prose(800), "signature": "s"},
                    {"type": "tool_use", "id": f"t{turn}", "name": "grep", "input": {"q": "x"}},
                ],
            }
        )
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{turn}", "content": "ok"}]}
        )
    messages.append({"role": "user", "content": [{"type": "text", "text": "next?"}]})
    result = fit(messages, model=MODEL, budget_tokens=COUNTER.messages(messages) - 500)
    assert "reasoning" in result.stages
    assert validate_chat_messages(result.messages) is None
    assert result.messages[-1] is messages[-1]


def test_unknown_fields_multimodal_and_non_string_content_survive() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": prose(3_000)}, image], "x_tag": 1},
        {"role": "assistant", "content": prose(3_000), "x_tag": 2, "refusal": None},
        {"role": "user", "content": "latest", "x_tag": 3},
    ]
    original = copy.deepcopy(messages)
    result = fit(messages, model=MODEL, budget_tokens=5_000)  # the image alone costs ~1.4k
    assert messages == original
    assert [m.get("x_tag") for m in result.messages] == [1, 2, 3]
    assert result.messages[0]["content"][1] == image
    assert isinstance(result.messages[1]["content"], str) and "refusal" in result.messages[1]
    assert result.stages == ("truncate",)


def test_turns_are_dropped_after_the_head_behind_one_user_marker() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for turn in range(30):
        messages += [
            {"role": "user", "content": f"q{turn} " + prose(100)},
            {"role": "assistant", "content": prose(100)},
        ]
    messages.append({"role": "user", "content": "last"})
    result = fit(messages, model=MODEL, budget_tokens=3_000)
    assert result.stages == ("drop_turns", "digest")
    assert validate_chat_messages(result.messages) is None
    assert result.messages[:2] == messages[:2]  # the opening of the conversation is kept
    markers = [
        m for m in result.messages if "x_id" not in m and "earlier messages omitted" in str(m["content"])
    ]
    assert len(markers) == 1 and markers[0]["role"] == "user"
    assert f"{result.messages_dropped} earlier messages omitted" in markers[0]["content"]
    after_marker = result.messages[result.messages.index(markers[0]) + 1]
    assert after_marker["role"] == "user"  # whole turns were removed


def test_growing_conversation_shares_long_prefixes() -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    budget = 12_000
    outputs = []
    for turn in range(40):
        history += agent_turn(turn, result_lines=150)[:-1]
        history.append({"role": "assistant", "content": prose(100)})
        request = [*history, {"role": "user", "content": f"next {turn}"}]
        outputs.append(fit(request, model=MODEL, budget_tokens=budget).messages)
    shares = prefix_shares(outputs)
    assert sum(shares) / len(shares) >= 0.9


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        CompressionOptions(cut_quantum=0)
    with pytest.raises(ValueError):
        CompressionOptions(truncate_caps=(1,))
    with pytest.raises(ValueError):
        CompressionOptions(tool_result_caps=(512, 2048))
    with pytest.raises(ValueError, match="rung_headroom"):
        CompressionOptions(rung_headroom=1.0)


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}  # costs ~1.4k tokens


def image_turn(turn: int, words: int = 100) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "text", "text": f"Turn {turn}: " + prose(words)}, IMAGE]},
        {"role": "assistant", "content": f"Seen {turn}. " + prose(200)},
    ]


def test_old_media_go_before_any_turn_and_the_latest_turn_keeps_its_own() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Describe screenshots."}]
    for turn in range(6):
        messages += image_turn(turn)
    messages.append({"role": "user", "content": [{"type": "text", "text": "And this one?"}, IMAGE]})
    result = fit(messages, model=MODEL, budget_tokens=6_000)
    assert result.stages == ("truncate",) and result.messages_dropped == 0
    assert validate_chat_messages(result.messages) is None
    old_parts = [
        part for m in result.messages[1:-1] if isinstance(m["content"], list) for part in m["content"]
    ]
    assert IMAGE not in old_parts
    assert {"type": "text", "text": "[image omitted by context-gateway]"} in old_parts
    assert all(any(str(p.get("text", "")).startswith(f"Turn {t}:") for p in old_parts) for t in range(6))
    assert result.messages[-1] is messages[-1]  # the latest turn's image is untouched


def test_the_kept_head_holds_the_first_turns_text_not_its_image() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    messages += image_turn(0)
    messages[1]["content"][0]["text"] += " My account reference is ACCT-44719."
    for turn in range(1, 30):
        messages += [
            {"role": "user", "content": f"q{turn} " + prose(100)},
            {"role": "assistant", "content": prose(100)},
        ]
    messages.append({"role": "user", "content": "last"})
    result = fit(messages, model=MODEL, budget_tokens=3_000)  # head room ~900 tokens: less than the image
    assert "drop_turns" in result.stages
    assert "ACCT-44719" in str(result.messages[1]["content"])
    assert validate_chat_messages(result.messages) is None


def test_a_rung_that_would_barely_fit_is_skipped_for_the_next() -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(16):
        messages += agent_turn(turn, result_lines=300)[:-1]
        reply = prose(260 if turn == 1 else 40)  # truncation shortens one reply: ~11% of the history
        messages.append({"role": "assistant", "content": f"Module {turn} looks fine. " + reply})
    messages.append({"role": "user", "content": "Summarise."})
    eager_options = CompressionOptions(rung_headroom=0)
    truncated = fit(messages, model=MODEL, budget_tokens=2_600, options=eager_options)
    assert truncated.stages == ("tool_results", "truncate")
    budget = int(truncated.tokens_after / 0.9)  # truncation would leave only ~10% free
    eager = fit(messages, model=MODEL, budget_tokens=budget, options=eager_options)
    assert eager.stages == ("tool_results", "truncate") and eager.messages_dropped == 0
    skipped = fit(messages, model=MODEL, budget_tokens=budget)
    assert "drop_turns" in skipped.stages and "truncate" not in skipped.stages
    assert skipped.tokens_after <= budget and validate_chat_messages(skipped.messages) is None
    # The head is the prefix the requests before the drop phase sent: placeholders, no truncation.
    earlier = fit([*messages[:41], {"role": "user", "content": "next"}], model=MODEL, budget_tokens=budget)
    assert earlier.stages == ("tool_results",) and skipped.messages[:5] == earlier.messages[:5]


def test_growing_conversation_with_images_never_moves_the_cut_back() -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "Describe screenshots."}]
    results = []
    for turn in range(30):
        user: dict[str, Any] = {"role": "user", "content": f"q{turn} " + prose(60)}
        if turn % 3 == 0:  # the latest turn is much bigger every third request
            user = {"role": "user", "content": [{"type": "text", "text": user["content"]}, IMAGE]}
        results.append(fit([*history, user], model=MODEL, budget_tokens=4_000))
        history += [user, {"role": "assistant", "content": prose(150)}]
    dropped = [result.messages_dropped for result in results]
    assert dropped == sorted(dropped) and dropped[-1] > 0
    shares = prefix_shares([r.messages for r in results])
    assert sum(shares) / len(shares) >= 0.65  # 0.61 when the cut follows the latest turn back


def _thinking(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": "sig-" + text[:8]}


def test_an_old_step_left_before_the_last_user_messages_keeps_the_thinking_rule() -> None:
    """Dropping turns can leave an old step, its thinking dropped, right before the last user
    messages: the Messages API would read its results as the final ones and refuse the request.
    The step goes on as text, its call and result still there, within the budget."""
    log = "\n".join(f"line {k}: value={k * 7} status=ok" for k in range(80))
    team = " ".join(f"Sentence {k} explains a detail of the build and its cache." for k in range(60))
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Look into the failing build."},
        {
            "role": "assistant",
            "content": [
                _thinking("I should read the log first."),
                {"type": "tool_use", "id": "toolu_1", "name": "run", "input": {"cmd": "make"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": log}]},
        {"role": "user", "content": "Here is what the team said: " + team},
        {"role": "assistant", "content": [_thinking("Let me weigh that."), {"type": "text", "text": team}]},
        {"role": "user", "content": "So what now?"},
    ]
    assert final_thinking_error(messages) is None
    result = fit(messages, model="gpt-4o", budget_tokens=840)
    out = list(result.messages)
    assert "drop_turns" in result.stages
    assert final_thinking_error(out) is None
    assert result.tokens_after == COUNTER.messages(out) <= 840
    assert out[1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": '[called run with {"cmd":"make"}]'}],
    }
    assert out[2]["content"][0]["text"].startswith("[run returned:]\n[context-gateway: output of tool `run`")
    # Without thinking in the history, the same: a request may switch it on for this one (found
    # by fuzzing: the step went as tool blocks, and Claude with thinking on refused it).
    plain = [
        {**m, "content": [b for b in m["content"] if b.get("type") != "thinking"]}
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]
    out = list(fit(plain, model="gpt-4o", budget_tokens=840).messages)
    assert final_thinking_error(out) is None and out[1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": '[called run with {"cmd":"make"}]'}],
    }
    # A step no drop moved there stays tool blocks: the client sent it last (its own request).
    answered = [*plain[:3], plain[-1]]
    result = fit(answered, model="gpt-4o", budget_tokens=COUNTER.messages(answered) - 100)
    assert "drop_turns" not in result.stages and result.messages[1]["content"][0]["type"] == "tool_use"


def test_a_step_turned_to_text_keeps_its_media_and_cache_breakpoint() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    mark = {"type": "ephemeral"}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "is_error": True,
                    "cache_control": mark,
                    "content": [{"type": "text", "text": "partial"}, image],
                }
            ],
        },
        {"role": "user", "content": "Why did it fail?"},
    ]
    thought = {**messages[1], "content": [_thinking("Shoot."), *messages[1]["content"]]}
    changed = unpinned(messages, [messages[0], thought, *messages[2:]], COUNTER.message)
    assert sorted(changed) == [1, 2]
    assert changed[2]["content"] == [
        {"type": "text", "text": "[shot failed:]"},
        {"type": "text", "text": "partial"},
        {**image, "cache_control": mark},
    ]
    assert final_thinking_error([*messages[:1], *changed.values(), messages[3]]) is None
    # An assistant turn that starts with its thinking is left as it is.
    kept = [messages[0], thought, *messages[2:]]
    assert unpinned(kept, kept, COUNTER.message) == {}


SEARCH_TOOL = "search_the_internal_knowledge_base_for_documents"


def _thirty_searches(results: list[Any]) -> list[dict[str, Any]]:
    """An old question and answer, then a thinking step of 30 searches (a long tool name) with
    `results`, answered by the last user messages."""
    ids = [f"t{i}" for i in range(30)]
    uses = [{"type": "tool_use", "id": i, "name": SEARCH_TOOL, "input": {}} for i in ids]
    return [
        {"role": "user", "content": "Earlier question " + "about the build config " * 600},
        {"role": "assistant", "content": "Earlier answer " + "with some details " * 600},
        {"role": "user", "content": "Look it up."},
        {"role": "assistant", "content": [_thinking("I should search."), *uses]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": i, "content": result}
                for i, result in zip(ids, results, strict=True)
            ],
        },
        {"role": "user", "content": "thanks"},
        {"role": "user", "content": "and now?"},
    ]


def test_a_step_turned_to_text_never_costs_more_than_its_blocks() -> None:
    """A long tool name in every result's heading made the text dearer than the blocks, and the
    fit, chosen for the blocks, came back over its budget: such a step takes the bare form."""
    name = SEARCH_TOOL
    messages = _thirty_searches(["" for _ in range(30)])
    result = fit(messages, model="gpt-4o", budget_tokens=895)
    out = list(result.messages)
    assert result.tokens_after == COUNTER.messages(out) <= 895
    assert final_thinking_error(out) is None
    call, results = out[3], out[4]
    assert call["content"][0] == {"type": "text", "text": f"[called {name} with {{}}]"}
    assert results["content"] == [{"type": "text", "text": "[result]"}] * 30  # no heading: bare


def test_a_step_turned_to_text_never_sends_a_text_block_of_whitespace_alone() -> None:
    """A command that printed a bare newline, its result taken to text in the bare form, became a
    text block of whitespace alone, which the Messages API refuses ("text content blocks must
    contain non-whitespace text"): such a result reads as `[result]`, and whitespace parts of a
    result's blocks stay behind."""
    outputs: list[Any] = ["\n", " \n ", [{"type": "text", "text": "\n"}, {"type": "text", "text": "found 2"}]]
    messages = _thirty_searches([outputs[k % 3] for k in range(30)])
    result = fit(messages, model="gpt-4o", budget_tokens=1000)
    out = list(result.messages)
    assert result.tokens_after == COUNTER.messages(out) <= 1000
    results = out[4]["content"]
    assert results[:3] == [
        {"type": "text", "text": "[result]"},
        {"type": "text", "text": "[result]"},
        {"type": "text", "text": "found 2"},
    ]
    body = {"model": "claude-sonnet-4-5", "max_tokens": 2048, "messages": out}
    assert anthropic_api.validate({**body, "thinking": {"type": "enabled", "budget_tokens": 1024}}) is None


def test_a_chat_step_answered_last_keeps_claudes_thinking_rule() -> None:
    """Claude with thinking on, through chat completions (litellm keeps its signed thinking as
    `thinking_blocks`): the tool results right before the latest question form the last user
    turn, and the assistant they answer must carry its thinking. It is an older turn's step, so
    stage 1 dropped that thinking and the request was refused ("Expected `thinking` or
    `redacted_thinking`, but found `tool_use`"). The step goes on as text, within the budget."""
    answer = " ".join(f"Sentence {k} explains a detail of the build and its cache." for k in range(80))

    def signed(text: str) -> list[dict[str, Any]]:
        return [{"type": "thinking", "thinking": text, "signature": "sig-" + text[:8]}]

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for turn in range(6):
        messages += [
            {"role": "user", "content": f"Question {turn}: {answer}"},
            {
                "role": "assistant",
                "content": f"Answer {turn}: {answer}",
                "thinking_blocks": signed("hm " * 200),
            },
        ]
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd":"pytest"}'}}
    messages += [
        {"role": "user", "content": "Run the tests."},
        {
            "role": "assistant",
            "content": None,
            "thinking_blocks": signed("run pytest " * 80),
            "tool_calls": [call],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "\n".join(f"test_{k} passed" for k in range(100)),
        },
        {"role": "user", "content": "Thanks. Now what is failing?"},
    ]
    assert check_final_thinking(messages) is None
    for budget in (9000, 3000):
        result = fit(messages, model="claude-sonnet-4-5", budget_tokens=budget)
        out = list(result.messages)
        assert "reasoning" in result.stages and check_final_thinking(out) is None
        assert result.tokens_after >= COUNTER.messages(out) and COUNTER.messages(out) <= budget
        assert validate_chat_messages(out) is None
        assert out[-3]["content"] == '[called bash with {"cmd":"pytest"}]' and "tool_calls" not in out[-3]
        assert out[-2]["role"] == "user" and out[-2]["content"].startswith("[bash returned:]\n")
        assert out[-1] == messages[-1]


def test_a_chat_step_taken_to_text_keeps_what_the_assistant_said_in_parts() -> None:
    """Found by fuzzing: an assistant's content given as parts was replaced by the call lines."""
    signed = [{"type": "thinking", "thinking": "hm " * 300, "signature": "sig"}]
    filler = " ".join(f"Sentence {k} explains a detail of the build and its cache." for k in range(80))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for turn in range(6):
        messages += [
            {"role": "user", "content": f"Q{turn} {filler}"},
            {"role": "assistant", "content": f"A{turn} {filler}", "thinking_blocks": signed},
        ]
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd":"pytest"}'}}
    said = [{"type": "text", "text": "I will run pytest now."}]
    messages += [
        {"role": "user", "content": "Run the tests."},
        {"role": "assistant", "content": said, "thinking_blocks": signed, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 failed"},
        {"role": "user", "content": "Now what?"},
    ]
    out = fit(messages, model="claude-sonnet-4-5", budget_tokens=3000).messages
    assert check_final_thinking(out) is None
    assert out[-3]["content"] == [*said, {"type": "text", "text": '[called bash with {"cmd":"pytest"}]'}]


def test_a_step_from_before_thinking_was_on_is_taken_to_text_where_dropping_leaves_it() -> None:
    """Found by fuzzing: the thinking step before the last question was dropped, which left an
    older step, from before thinking was switched on, answered by the last user turn; having no
    thinking to lose, it was left as tool calls, and Claude refused the prompt."""
    thought = [{"type": "reasoning.text", "text": "let me run the tests", "signature": "s"}]
    pytest_call = {
        "id": "call_2",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"cmd":"pytest"}'},
    }
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
        {"role": "user", "content": "Run the tests."},
        {
            "role": "assistant",
            "content": "Running. " * 8,
            "reasoning_details": thought,
            "tool_calls": [pytest_call],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "the network fixture failed " * 60},
        {"role": "user", "content": "Which fixture failed, and in which module?"},
    ]
    assert check_final_thinking(messages) is None
    for budget in range(120, 400, 10):
        out = list(fit(messages, model="claude-sonnet-4-5", budget_tokens=budget).messages)
        assert check_final_thinking(out) is None and validate_chat_messages(out) is None, budget


DEEP_JSON = "[" * 300 + ",".join(['"word"'] * 3000) + "]" * 300  # valid; deeper than orjson writes


@pytest.mark.parametrize(
    "odd",
    [
        {"role": "tool", "tool_call_id": "b", "content": DEEP_JSON},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "q", "arguments": DEEP_JSON}}
            ],
        },
        {
            "role": "assistant",
            "content": "x " * 3000,
            "x_note": "\ud800",
        },  # a lone surrogate, as json.loads reads one
        {"role": "assistant", "content": "x " * 3000, "x_counts": {1: "one", 2: "two"}},
    ],
    ids=["deep-json-output", "deep-json-arguments", "lone-surrogate", "non-string-keys"],
)
def test_values_orjson_cannot_write_are_compressed_like_any_other(odd: dict[str, Any]) -> None:
    """A fit returns or refuses, whatever the messages hold: JSON text nested deeper than orjson
    writes is condensed as text, and a span that orjson cannot serialize still gets its key."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "b", "type": "function", "function": {"name": "q", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "b", "content": "ok " * 3000},
        odd,
        *([{"role": "tool", "tool_call_id": "c", "content": "done"}] if odd.get("tool_calls") else []),
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "next question"},
    ]
    if odd.get("x_note"):
        odd["x_note"] = json.loads('"\\ud800"')
    for budget in (1500, 600, 200):
        try:
            result = fit(messages, model="gpt-4o", budget_tokens=budget)
        except ContextBudgetExceeded:
            continue
        assert result.tokens_after <= budget


def nested(depth: int, into: Any = list) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value] if into is list else {"a": value}
    return value


LONG_TALK = [
    {"role": "user" if turn % 2 == 0 else "assistant", "content": f"turn {turn}: " + prose(400)}
    for turn in range(12)
]


@pytest.mark.parametrize(
    ("arguments", "error", "named"),
    [
        ({"budget_tokens": float("nan")}, TypeError, "budget_tokens must be an int, got float"),
        ({"budget_tokens": float("-inf")}, TypeError, "budget_tokens must be an int, got float"),
        ({"budget_tokens": 2000.5}, TypeError, "budget_tokens must be an int, got float"),
        ({"budget_tokens": None}, TypeError, "budget_tokens must be an int, got NoneType"),
        ({"budget_tokens": "2000"}, TypeError, "budget_tokens must be an int, got str"),
        ({"budget_tokens": True}, TypeError, "budget_tokens must be an int, got bool"),
        ({"messages": "hello"}, TypeError, "messages must be a list of dicts, got str"),
        (
            {"messages": {"role": "user", "content": "hi"}},
            TypeError,
            "messages must be a list of dicts, got dict",
        ),
        ({"messages": [*LONG_TALK, None]}, TypeError, "messages[12] must be a dict, got NoneType"),
        ({"model": None}, TypeError, "model must be a str, got NoneType"),
        ({"tools": "abc"}, TypeError, "tools must be a list of dicts, got str"),
        ({"aggressive": "yes"}, TypeError, "aggressive must be a bool, got str"),
        ({"options": {"digest_ratio": 0}}, TypeError, "options must be a CompressionOptions, got dict"),
        (
            {"summaries": ["a summary"]},
            TypeError,
            "summaries must be a mapping of span keys to str, got list",
        ),
        ({"summaries": {"key": 5}}, TypeError, "summaries must map span keys (str) to summaries (str)"),
        (
            {"messages": [{"role": "user", "content": nested(5000)}, *LONG_TALK]},
            ValueError,
            "messages: a message nests values too deeply",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": nested(5000, dict)}}]},
            ValueError,
            "tools: a tool definition nests values too deeply",
        ),
    ],
)
def test_fit_names_the_argument_a_library_caller_got_wrong(
    arguments: dict[str, Any], error: type[Exception], named: str
) -> None:
    call: dict[str, Any] = {"messages": LONG_TALK, "model": MODEL, "budget_tokens": 2000, **arguments}
    with pytest.raises(error) as raised:
        fit(**call)
    assert str(raised.value).startswith(named)
    assert fit(LONG_TALK, model=MODEL, budget_tokens=2000).stages  # the same call, well formed, fits


def test_compact_json_refuses_what_it_cannot_write_cleanly() -> None:
    from gateway.tokens.formats import NestedTooDeeply, compact_json

    assert compact_json(nested(600)) == "[" * 600 + '"x"' + "]" * 600  # past orjson's 254, within json's
    with pytest.raises(NestedTooDeeply):
        compact_json(nested(5000))
