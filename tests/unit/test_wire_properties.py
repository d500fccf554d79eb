"""Property tests of fitting native requests (Anthropic Messages, OpenAI Responses) through gateway.wire.

Random conversations in each API's own shape — system blocks, signed thinking,
tool pairs, parallel calls, reasoning items, images, cache_control markers —
are fitted to random budgets and must come out: within budget (or refused
with ContextBudgetExceeded), accepted by the fake upstream's strict validator
of that API, with every thinking block and reasoning item byte-identical to
one sent, markers on the blocks that carried them, deterministic, and with
the input untouched. Unchanged requests round-trip exactly.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gateway  # noqa: F401  (offline tiktoken)
from gateway.compress import CompressionOptions, ContextBudgetExceeded
from gateway.tokens.counter import counter_for
from gateway.wire.anthropic import ANTHROPIC
from gateway.wire.base import WireFormat
from gateway.wire.fitting import fit_request
from gateway.wire.responses import ORIGIN, RESPONSES
from tests.fakes import anthropic_api, responses_api
from tests.fakes.images import png_data_url
from tests.fakes.responses_api import ResponsesState

CLAUDE = "claude-haiku-4-5"
GPT = "gpt-4o"
WORDS = ["the", "build", "failed", "config", "服务", "错误", "id=4471", "ERROR", "12.5", "timeout", "ok"]
PIXEL_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
SCREENSHOT = png_data_url(1024, 768)


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def size(rng: random.Random) -> int:
    return rng.choice([3, 20, 200, 1500])


# --- Anthropic ---------------------------------------------------------------------------------


def anthropic_body(seed: int, turns: int, thinking: bool, marks: int) -> dict[str, Any]:
    rng = random.Random(seed)
    counter = 0

    def block(value: str) -> dict[str, Any]:
        return {"type": "text", "text": value}

    def thought() -> dict[str, Any]:
        value = text(rng, size(rng))
        return {"type": "thinking", "thinking": value, "signature": anthropic_api.sign(value)}

    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        content: list[dict[str, Any]] = [block(text(rng, size(rng)))]
        if rng.random() < 0.15:
            content.append(
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL_PNG}}
            )
        messages.append({"role": "user", "content": content if rng.random() < 0.7 else content[0]["text"]})
        for _ in range(rng.choice([0, 0, 1, 2])):  # tool rounds
            counter += 1
            ids = [f"toolu_{counter}_{k}" for k in range(rng.choice([1, 1, 2]))]
            answer: list[dict[str, Any]] = [thought()] if thinking else []
            if rng.random() < 0.5:
                answer.append(block(text(rng, size(rng))))
            answer += [
                {"type": "tool_use", "id": i, "name": "run", "input": {"cmd": text(rng, 5)}} for i in ids
            ]
            messages.append({"role": "assistant", "content": answer})
            results = [
                {"type": "tool_result", "tool_use_id": i, "content": text(rng, size(rng) * 2)} for i in ids
            ]
            messages.append({"role": "user", "content": results})
        if turn < turns - 1:
            final: list[dict[str, Any]] = [thought()] if thinking else []
            if thinking and rng.random() < 0.2:
                final = [{"type": "redacted_thinking", "data": anthropic_api.redacted(text(rng, 5))}]
            final.append(block(text(rng, size(rng))))
            messages.append({"role": "assistant", "content": final})
    body: dict[str, Any] = {"model": CLAUDE, "max_tokens": 2048, "messages": messages}
    if rng.random() < 0.7:
        body["system"] = [block(text(rng, 40))] if rng.random() < 0.5 else text(rng, 40)
    if thinking:
        body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    # cache_control markers (tagged so the test can follow them) on up to `marks` text blocks.
    candidates = [
        b for m in messages if isinstance(m["content"], list) for b in m["content"] if b["type"] == "text"
    ]
    for number, marked in enumerate(rng.sample(candidates, min(marks, len(candidates)))):
        marked["cache_control"] = {"type": "ephemeral"}
        marked["x_mark"] = number
    return body


def marked_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        b
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if "cache_control" in b or "x_mark" in b
    ]


def thinking_blocks(body: dict[str, Any]) -> list[bytes]:
    return [
        orjson.dumps(b, option=orjson.OPT_SORT_KEYS)
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] in ("thinking", "redacted_thinking")
    ]


def fitted(
    wire: WireFormat, body: dict[str, Any], model: str, budget: int
) -> tuple[dict[str, Any] | None, int]:
    view = wire.view(body)
    tokens = counter_for(model).request(view.counted)
    out, _, _ = fit_request(
        wire, body, view, model=model, budget=budget, tokens=tokens, options=CompressionOptions()
    )
    return out, tokens


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    turns=st.integers(1, 12),
    thinking=st.booleans(),
    marks=st.integers(0, 4),
    share=st.floats(0.05, 1.2),
)
# The kept head ended on a tool step whose thinking stage 1 had dropped; the marker and the
# latest question joined its results into the final user turn, which the API rejects.
@example(seed=204, turns=8, thinking=True, marks=0, share=0.0625)
def test_anthropic_fit_is_valid_within_budget_and_keeps_signed_blocks(
    seed: int, turns: int, thinking: bool, marks: int, share: float
) -> None:
    body = anthropic_body(seed, turns, thinking, marks)
    assert anthropic_api.validate(body) is None, "the generator makes valid requests"
    pristine = copy.deepcopy(body)
    total = counter_for(CLAUDE).request(ANTHROPIC.view(body).counted)
    budget = max(300, int(total * share))
    try:
        out, _ = fitted(ANTHROPIC, body, CLAUDE, budget)
    except ContextBudgetExceeded:
        return
    assert body == pristine, "the input is never mutated"
    if out is None:
        assert total <= budget
        return
    assert counter_for(CLAUDE).request(ANTHROPIC.view(out).counted) <= budget
    assert anthropic_api.validate(out) is None, anthropic_api.validate(out)
    assert set(thinking_blocks(out)) <= set(thinking_blocks(body)), "thinking kept byte-identical or dropped"
    # The assistant turn the final tool results answer keeps its thinking (the API requires it).
    last = body["messages"][-1]["content"]
    if thinking and isinstance(last, list) and any(b["type"] == "tool_result" for b in last):
        assert out["messages"][-2]["content"][0] == body["messages"][-2]["content"][0]
    # Markers: never more than sent, each still on the block that carried it.
    assert anthropic_api.cache_control_count(out) <= anthropic_api.cache_control_count(body)
    for marked in marked_blocks(out):
        assert "cache_control" in marked and "x_mark" in marked
    again, _ = fitted(ANTHROPIC, copy.deepcopy(pristine), CLAUDE, budget)
    assert orjson.dumps(again) == orjson.dumps(out), "deterministic"
    assert out.get("system") == body.get("system") or isinstance(out.get("system"), type(body.get("system")))


def test_anthropic_round_trip_is_lossless() -> None:
    body = anthropic_body(7, 5, True, 3)
    body["metadata"] = {"user_id": "u1"}
    body["messages"][0]["x_unknown"] = [1, 2]
    view = ANTHROPIC.view(body)
    assert ANTHROPIC.emit(body, view, view.messages) == body
    no_system = {k: v for k, v in body.items() if k != "system"}
    view = ANTHROPIC.view(no_system)
    assert ANTHROPIC.emit(no_system, view, view.messages) == no_system


# --- Responses ---------------------------------------------------------------------------------


TOOL_KINDS = (
    "function_call",
    "custom_tool_call",
    "shell_call",
    "local_shell_call",
    "apply_patch_call",
    "computer_call",
)


def tool_step(rng: random.Random, kind: str, call_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A call of a client-run tool of `kind` and its output item, as an agent sends them back."""
    result = text(rng, size(rng) * 2)
    if kind == "custom_tool_call":
        return (
            {"type": kind, "call_id": call_id, "name": "patch", "input": text(rng, size(rng))},
            {"type": "custom_tool_call_output", "call_id": call_id, "output": result},
        )
    if kind == "shell_call":
        action = {"commands": [text(rng, 4), "pytest -q"], "timeout_ms": 60_000}
        failed = {"type": "exit", "exit_code": 1}
        chunks = [
            {"stdout": result, "stderr": text(rng, rng.choice([0, 3])), "outcome": failed}
            for _ in range(rng.choice([1, 2]))
        ]
        return (
            {"type": kind, "call_id": call_id, "action": action, "status": "completed"},
            {"type": "shell_call_output", "call_id": call_id, "output": chunks},
        )
    if kind == "local_shell_call":
        action = {"type": "exec", "command": ["bash", "-lc", text(rng, 4)], "env": {}}
        output = orjson.dumps({"output": result}).decode()
        call = {"type": kind, "id": f"lsh_{call_id}", "call_id": call_id, "action": action}
        call["status"] = "completed"
        return call, {"type": "local_shell_call_output", "id": call_id, "output": output}
    if kind == "apply_patch_call":
        operation = {"type": "update_file", "path": "src/app.py", "diff": text(rng, size(rng) * 2)}
        return (
            {"type": kind, "call_id": call_id, "operation": operation, "status": "completed"},
            {"type": "apply_patch_call_output", "call_id": call_id, "status": "completed", "output": result},
        )
    if kind == "computer_call":
        typed = {"type": "type", "text": text(rng, size(rng))}
        clicked = {"type": "click", "button": "left", "x": rng.randrange(1024), "y": rng.randrange(768)}
        action = typed if rng.random() < 0.3 else clicked
        screenshot = {"type": "computer_screenshot", "image_url": SCREENSHOT}
        return (
            {
                "type": kind,
                "call_id": call_id,
                "action": action,
                "pending_safety_checks": [],
                "status": "completed",
            },
            {"type": "computer_call_output", "call_id": call_id, "output": screenshot},
        )
    arguments = orjson.dumps({"cmd": text(rng, 5)}).decode()
    return (
        {"type": "function_call", "call_id": call_id, "name": "run", "arguments": arguments},
        {"type": "function_call_output", "call_id": call_id, "output": result},
    )


def responses_body(
    seed: int, turns: int, reasoning: bool, string_parts: bool, builtin_tools: bool = False
) -> dict[str, Any]:
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    serial = 0
    for turn in range(turns):
        words = text(rng, size(rng))
        if string_parts:
            items.append({"role": "user", "content": words})
        else:
            parts: list[dict[str, Any]] = [{"type": "input_text", "text": words}]
            if rng.random() < 0.15:
                parts.append({"type": "input_image", "image_url": f"data:image/png;base64,{PIXEL_PNG}"})
            items.append({"type": "message", "role": "user", "content": parts})
        for _ in range(rng.choice([0, 0, 1, 2])):
            serial += 1
            if reasoning:
                items.append(
                    {"type": "reasoning", "id": f"rs_{serial}", "summary": [], "encrypted_content": "e" * 40}
                )
            calls = [f"call_{serial}_{k}" for k in range(rng.choice([1, 1, 2]))]
            steps = [
                tool_step(rng, rng.choice(TOOL_KINDS) if builtin_tools else "function_call", call_id)
                for call_id in calls
            ]
            # As the API returns them: each call with an id of its own (a local shell call has one).
            items += [
                {"id": f"fc_{call['call_id']}", **call} if "id" not in call else call for call, _ in steps
            ]
            items += [output for _, output in steps]
        if turn < turns - 1:
            serial += 1
            if reasoning:
                items.append(
                    {
                        "type": "reasoning",
                        "id": f"rs_{serial}",
                        "summary": [{"type": "summary_text", "text": "s"}],
                    }
                )
            answer = text(rng, size(rng))
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "id": f"msg_{serial}",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": answer, "annotations": []}],
                }
            )
    body: dict[str, Any] = {"model": GPT, "input": items, "max_output_tokens": 1024}
    if rng.random() < 0.6:
        body["instructions"] = text(rng, 40)
    return body


def reasoning_items(body: dict[str, Any]) -> list[bytes]:
    items = body["input"] if isinstance(body["input"], list) else []
    return [orjson.dumps(i, option=orjson.OPT_SORT_KEYS) for i in items if i.get("type") == "reasoning"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    turns=st.integers(1, 12),
    reasoning=st.booleans(),
    string_parts=st.booleans(),
    builtin_tools=st.booleans(),
    share=st.floats(0.05, 1.2),
)
def test_responses_fit_is_valid_within_budget_and_keeps_items_whole(
    seed: int, turns: int, reasoning: bool, string_parts: bool, builtin_tools: bool, share: float
) -> None:
    body = responses_body(seed, turns, reasoning, string_parts, builtin_tools)
    # The server that answered these turns: items it produced after reasoning need that reasoning.
    server = ResponsesState()
    server.remember_reasoning(body["input"])
    assert responses_api.validate(body, server) is None, "the generator makes valid requests"
    pristine = copy.deepcopy(body)
    total = counter_for(GPT).request(RESPONSES.view(body).counted)
    budget = max(300, int(total * share))
    try:
        out, _ = fitted(RESPONSES, body, GPT, budget)
    except ContextBudgetExceeded:
        return
    assert body == pristine, "the input is never mutated"
    if out is None:
        assert total <= budget
        return
    assert ORIGIN.encode() not in orjson.dumps(out), "bookkeeping never leaks upstream"
    assert counter_for(GPT).request(RESPONSES.view(out).counted) <= budget
    assert responses_api.validate(out, server) is None, responses_api.validate(out, server)
    assert set(reasoning_items(out)) <= set(reasoning_items(body)), "reasoning kept whole or dropped"
    users = [
        i for i in out["input"] if i.get("role") == "user" and "context-gateway:" not in str(i["content"])
    ]
    assert users, "the latest user message is never lost"
    again, _ = fitted(RESPONSES, copy.deepcopy(pristine), GPT, budget)
    assert orjson.dumps(again) == orjson.dumps(out), "deterministic"


def test_responses_round_trip_is_lossless() -> None:
    body = responses_body(11, 6, True, False, builtin_tools=True)
    body["input"].insert(1, {"type": "item_reference", "id": "msg_old"})
    view = RESPONSES.view(body)
    assert RESPONSES.emit(body, view, view.messages) == body
    string_input = {"model": GPT, "input": "hello", "instructions": "be brief"}
    view = RESPONSES.view(string_input)
    assert RESPONSES.emit(string_input, view, view.messages) == string_input


def test_responses_unpaired_layout_is_left_alone() -> None:
    items = [
        {"role": "user", "content": "a"},
        {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
        {"role": "user", "content": "interjection"},
        {"type": "function_call_output", "call_id": "c1", "output": "x " * 4000},
        {"role": "user", "content": "b"},
    ]
    view = RESPONSES.view({"model": GPT, "input": items})
    assert not view.fittable


def test_a_loop_of_built_in_tools_is_compressed_step_by_step() -> None:
    """An agent on the Responses API's own shell and apply_patch tools sends calls and outputs that
    are not function calls. Read as one opaque run, a loop of them was one message nothing could
    cut: a request a third over its budget was refused. Each call and its output are a step."""
    rng = random.Random(5)
    items: list[dict[str, Any]] = [{"role": "user", "content": "Make the failing test pass."}]
    for step in range(40):
        kind = ("shell_call", "apply_patch_call", "local_shell_call")[step % 3]
        items += tool_step(rng, kind, f"call_{step}")
    body = {"model": GPT, "input": items, "instructions": "You are a coding agent."}
    total = counter_for(GPT).request(RESPONSES.view(body).counted)
    out, _ = fitted(RESPONSES, body, GPT, total // 3)
    assert out is not None and responses_api.validate(out, ResponsesState()) is None
    assert counter_for(GPT).request(RESPONSES.view(out).counted) <= total // 3
    assert out["input"][-2:] == items[-2:], "the newest step goes whole"
    assert out["input"][0] == items[0], "the task goes whole"
    calls = [item for item in out["input"] if item.get("type") in TOOL_KINDS]
    assert len(calls) >= 30, "older steps keep their calls (their outputs become notes)"
    outputs = [item for item in out["input"] if item.get("type", "").endswith("_call_output")]
    whole = [item for item in outputs if item in items]
    assert len(outputs) == len(calls) and items[-1] in whole and len(whole) < len(outputs) / 2


def test_a_computer_use_loop_is_compressed_step_by_step() -> None:
    """A computer-use agent: each step a `computer_call` (with the reasoning it followed) and its
    screenshot. Read as one opaque run, the loop was one message nothing could cut, and a request
    over its budget was refused. The API takes nothing but a screenshot in a computer call's
    output, so an older step goes as text, the action and a note for its screenshot, without
    the reasoning its call needed; the newest steps go whole, with their reasoning."""
    rng = random.Random(8)
    items: list[dict[str, Any]] = [{"role": "user", "content": "Book the cheapest flight to Paris."}]
    for step in range(24):
        call, output = tool_step(rng, "computer_call", f"call_{step}")
        reasoning = {"type": "reasoning", "id": f"rs_{step}", "summary": [], "encrypted_content": "e" * 80}
        items += [reasoning, {"id": f"cu_{step}", **call}, output]
    body = {"model": GPT, "input": items, "tools": [{"type": "computer_use_preview"}]}
    server = ResponsesState()
    server.remember_reasoning(items)
    total = counter_for(GPT).request(RESPONSES.view(body).counted)
    out, _ = fitted(RESPONSES, body, GPT, total // 3)
    assert out is not None and responses_api.validate(out, server) is None
    assert counter_for(GPT).request(RESPONSES.view(out).counted) <= total // 3
    assert out["input"][-3:] == items[-3:], "the newest step goes whole, its reasoning beside it"
    assert out["input"][0] == items[0], "the task goes whole"
    as_text = [item for item in out["input"] if str(item.get("content")).startswith("[called computer with")]
    calls = [item for item in out["input"] if item.get("type") == "computer_call"]
    assert len(as_text) >= 12 and len(as_text) + len(calls) == 24, "every action is still there"
    assert all("[image omitted by context-gateway]" in item["content"] for item in as_text)
    reasoning = {item["id"] for item in out["input"] if item.get("type") == "reasoning"}
    assert reasoning == {f"rs_{call['id'][3:]}" for call in calls}, "reasoning goes with its call"


def test_computer_steps_are_told_apart_by_item_and_their_screenshots_follow_the_outputs() -> None:
    """Found by fuzzing. Steps were matched by call id, which a client may give twice: every step
    of a loop reusing one went as text, each with the newest screenshot, twice over the budget.
    And a screenshot kept whole, sent as a user image where its call was (a batch of actions cut
    goes as text), landed between another call of the run and that call's output."""
    click = {"type": "click", "button": "left", "x": 1, "y": 1}
    same: list[dict[str, Any]] = [{"role": "user", "content": "Book the flight."}]
    for k in range(6):
        call = {"type": "computer_call", "id": f"cu_{k}", "call_id": "call_same", "action": click}
        shot = {"type": "computer_screenshot", "image_url": png_data_url(1024 - k, 768)}
        same += [
            {**call, "pending_safety_checks": [], "status": "completed"},
            {"type": "computer_call_output", "call_id": "call_same", "output": shot},
        ]
    typed = {"type": "type", "text": "lorem ipsum dolor sit amet " * 400}
    shot = {"type": "computer_screenshot", "image_url": f"data:image/png;base64,{PIXEL_PNG}"}
    mixed: list[dict[str, Any]] = [
        {"role": "user", "content": "Fill in the form."},
        {"type": "function_call", "id": "fc_2", "call_id": "f2", "name": "run", "arguments": '{"cmd":"ls"}'},
        {
            "type": "computer_call",
            "id": "cu_1",
            "call_id": "c1",
            "actions": [typed],
            "pending_safety_checks": [],
        },
        {"type": "computer_call_output", "call_id": "c1", "output": shot},
        {"type": "function_call_output", "call_id": "f2", "output": "a.txt"},
    ]
    mixed[2]["status"] = "completed"
    for items, share in ((same, 2), (mixed, 3)):
        body = {"model": GPT, "input": items}
        total = counter_for(GPT).request(RESPONSES.view(body).counted)
        out, _ = fitted(RESPONSES, body, GPT, total // share)
        assert out is not None and responses_api.validate(out, ResponsesState()) is None
        view = RESPONSES.view(out)
        assert view.fittable, "no message between a call and its output"
        assert counter_for(GPT).request(view.counted) <= total // share
    assert out["input"][-1]["role"] == "user", "the kept screenshot follows the run's outputs"
    assert out["input"][-2] == mixed[-1]


def test_a_computer_action_cut_alone_stays_a_call() -> None:
    """The newest step's long typed text, cut by the last-resort trim while its screenshot stays
    whole: the call goes back with its action cut, as a shell call's does, its reasoning and
    screenshot with it, rather than as text."""
    typed = {"type": "type", "text": "quarterly revenue grew " * 300}
    shot = {"type": "computer_screenshot", "image_url": png_data_url(1024, 768)}
    call = {"type": "computer_call", "id": "cu_1", "call_id": "c1", "action": typed}
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "Write the report."},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e" * 80},
        {**call, "pending_safety_checks": [], "status": "completed"},
        {"type": "computer_call_output", "call_id": "c1", "output": shot},
    ]
    server = ResponsesState()
    server.remember_reasoning(items)
    body = {"model": GPT, "input": items}
    total = counter_for(GPT).request(RESPONSES.view(body).counted)
    out, _ = fitted(RESPONSES, body, GPT, int(total * 0.9))
    assert out is not None and responses_api.validate(out, server) is None
    sent = out["input"][2]
    assert sent["type"] == "computer_call" and sent["action"]["type"] == "type"
    assert len(sent["action"]["text"]) < len(typed["text"])
    assert out["input"][1] == items[1] and out["input"][3] == items[3], "its reasoning and screenshot"


def test_a_client_field_named_like_the_bookkeeping_is_kept() -> None:
    """A client's item carrying the key the view marks its own items with was dropped once compress
    changed it (the task went missing). User-side items are the client's, whatever their keys."""
    items = [
        {"role": "user", "content": "task " * 3000, ORIGIN: 1},
        {"role": "assistant", "content": "ok " * 200},
        {"role": "user", "content": "next " * 50},
    ]
    body = {"model": GPT, "input": items}
    total = counter_for(GPT).request(RESPONSES.view(body).counted)
    out, _ = fitted(RESPONSES, body, GPT, total // 4)
    assert out is not None and len(out["input"]) == 3 and out["input"][0][ORIGIN] == 1


def test_reasoning_stays_beside_an_item_that_cannot_go_without_its_id() -> None:
    """A server-run tool's call (web search) cannot be sent without its id, and with its id it needs
    the reasoning it followed: that reasoning is dropped only with its whole turn."""
    searched = [
        {"role": "user", "content": "What changed in the release? " + text(random.Random(1), 400)},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e" * 400},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"query": "release"}},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "content": [{"type": "output_text", "text": "x"}],
        },
    ]
    body = {"model": GPT, "input": [*searched, *responses_body(3, 8, True, True)["input"]]}
    server = ResponsesState()
    server.remember_reasoning(body["input"])
    total = counter_for(GPT).request(RESPONSES.view(body).counted)
    for share in (0.9, 0.6, 0.3):
        out, _ = fitted(RESPONSES, body, GPT, int(total * share))
        assert out is not None
        ids = [item.get("id") for item in out["input"]]
        assert ("ws_1" in ids) == ("rs_1" in ids), (share, ids[:6])
        assert "msg_1" not in ids or "rs_1" in ids


def test_a_cut_built_in_action_keeps_its_kind_and_the_budget() -> None:
    """Fuzzed: a tight cut keeps an object's first members and counts the rest, and the rest went
    back whole (a long command list: requests several times their budget) or, for a text, empty
    (a patch whose `type` came last lost it: refused). Members now go smallest first; those left
    out go empty, but a short word (a kind) stays."""
    rng = random.Random(9)
    items: list[dict[str, Any]] = [{"role": "user", "content": "Refactor the parser."}]
    for step in range(24):
        command = ["bash", "-lc", *(f"sed -i 's/old_{n}/new_{n}/' src/parser_{n}.py" for n in range(40))]
        shell = {
            "type": "local_shell_call",
            "id": f"lsh_{step}",
            "call_id": f"ls_{step}",
            "status": "completed",
        }
        shell["action"] = {"command": command, "env": {}, "timeout_ms": 1000, "type": "exec"}
        output = {"type": "local_shell_call_output", "id": f"ls_{step}", "output": text(rng, 200)}
        operation = {
            "path": f"src/deeply/nested/module_{step}.py",
            "diff": text(rng, 300),
            "type": "update_file",
        }
        patch = {
            "type": "apply_patch_call",
            "call_id": f"ap_{step}",
            "operation": operation,
            "status": "completed",
        }
        result = {"type": "apply_patch_call_output", "call_id": f"ap_{step}", "status": "completed"}
        items += [shell, output, patch, result]
    body = {"model": GPT, "input": items}
    assert responses_api.validate(body, ResponsesState()) is None
    total = counter_for(GPT).request(RESPONSES.view(body).counted)
    for share in (0.05, 0.1, 0.3):
        budget = int(total * share)
        out, _ = fitted(RESPONSES, body, GPT, budget)
        assert out is not None and counter_for(GPT).request(RESPONSES.view(out).counted) <= budget
        assert responses_api.validate(out, ResponsesState()) is None
        cut = [i["operation"] for i in out["input"] if i.get("type") == "apply_patch_call"]
        assert cut and all(operation["type"] == "update_file" for operation in cut)


def test_a_kept_item_reference_keeps_the_reasoning_it_followed() -> None:
    """Fuzzed: an `item_reference` is all id, so dropping its run's reasoning left a reference the
    API refuses ("Item 'msg_1' of type 'item_reference' was provided without its required
    'reasoning' item"). It pins its run's reasoning like any item that cannot go without its id."""
    filler = text(random.Random(2), 600)
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "First: " + filler},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "item_reference", "id": "msg_1"},
        {"role": "user", "content": "Second: " + filler},
        {"type": "reasoning", "id": "rs_2", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_2",
            "content": [{"type": "output_text", "text": "ok"}],
        },
        {"role": "user", "content": "Third?"},
    ]
    server = ResponsesState()
    server.remember_reasoning(items)
    body = {"model": GPT, "input": items}
    assert responses_api.validate(body, server) is None
    total = counter_for(GPT).request(RESPONSES.view(body).counted)
    for share in (0.95, 0.8, 0.6):
        out, _ = fitted(RESPONSES, body, GPT, int(total * share))
        assert out is not None and responses_api.validate(out, server) is None
