"""POST /v1/responses through the gateway with the real `openai` SDK, against the fake Responses API.

The fake pairs function calls and outputs by call_id, keeps reasoning items with what they
produced, stores responses for previous_response_id and has a small window: long
conversations only succeed if the gateway fitted them, or had the upstream truncate.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.policy.keys import hash_key
from tests.conftest import GatewayFactory
from tests.fakes import responses_api
from tests.fakes.images import png_data_url
from tests.fakes.responses_api import ResponsesState
from tests.fakes.upstream import FakeUpstream

MODEL = "gpt-4o"
WINDOW = 3_000
TOOL: Any = {"type": "function", "name": "run", "parameters": {"type": "object"}}


def windowed(start_gateway: GatewayFactory, window: int = WINDOW, **environ: str) -> str:
    return start_gateway(GATEWAY_MODELS=orjson.dumps({MODEL: {"context_window": window}}).decode(), **environ)


@pytest.fixture
def sdk(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> Iterator[openai.OpenAI]:
    fake_upstream.window = WINDOW
    with openai.OpenAI(base_url=windowed(start_gateway), api_key="sk-caller", max_retries=0) as client:
        yield client


def log_line(turn: int) -> str:
    return "\n".join(f"line {k} of step {turn}: value={turn * k} status=ok" for k in range(60))


def test_long_stateless_tool_conversation_stays_valid(
    fake_upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    """The client keeps the history (store=false, as Codex does): the gateway fits it, pairs intact."""
    items: list[Any] = [{"role": "user", "content": "Investigate the build. CALL_TOOL"}]
    compressed = 0
    for turn in range(12):
        asked = items[-1]
        raw = sdk.responses.with_raw_response.create(
            model=MODEL,
            input=items,
            tools=[TOOL],
            instructions="Be terse.",
            store=False,
            max_output_tokens=500,
        )
        reply = raw.parse()
        compressed += raw.headers["x-gateway-compression"] != "none"
        call = reply.output[-1]
        assert call.type == "function_call"
        items.append(call.model_dump(exclude_none=True))
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": log_line(turn)})
        items.append({"role": "user", "content": f"Step {turn} done. CALL_TOOL"})
    assert compressed >= 6
    sent = fake_upstream.requests_to("/v1/responses")[-1].json
    assert responses_api.validate(sent, ResponsesState()) is None
    assert responses_api.count_input(sent["instructions"], sent["input"], sent["tools"]) + 500 <= WINDOW
    assert sent["input"][-1] == asked


def test_a_reasoning_models_history_stays_valid_when_its_reasoning_is_dropped(
    fake_upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    """A reasoning model's answers come back with ids, and the API refuses an item sent with its
    id but without the reasoning item it followed ("Item 'msg_…' of type 'message' was provided
    without its required 'reasoning' item"). Compressing drops old reasoning: the items it
    leaves go without their ids, as plain input, and every request is accepted."""
    items: list[Any] = []
    compressed = 0
    for turn in range(14):
        items.append({"role": "user", "content": f"Step {turn}: {log_line(turn)[:1500]} CALL_TOOL"})
        raw = sdk.responses.with_raw_response.create(
            model=MODEL, input=items, tools=[TOOL], reasoning={"effort": "low"}, max_output_tokens=300
        )
        reply = raw.parse()
        compressed += "reasoning" in raw.headers["x-gateway-compression"]
        items += [item.model_dump(exclude_none=True) for item in reply.output]
        call = reply.output[-1]
        assert call.type == "function_call" and items[-2]["type"] == "reasoning"
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "ok"})
    assert compressed >= 4
    sent = fake_upstream.requests_to("/v1/responses")[-1].json
    assert not any(item.get("type") == "function_call" and "id" in item for item in sent["input"][:-4])


def test_an_agent_on_built_in_shell_and_patch_tools_is_fitted_step_by_step(
    fake_upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    """Codex-style: the Responses API's own `shell` and `apply_patch` tools, the client running them
    and sending back their outputs. The loop outgrows the window; each request is fitted step by
    step and accepted as the API would, the newest step and the task whole."""
    task = {"role": "user", "content": "Make the failing test pass."}
    items: list[Any] = [task]
    compressed = 0
    for step in range(16):
        if step % 2 == 0:
            call = {
                "type": "shell_call",
                "call_id": f"call_{step}",
                "action": {"commands": ["pytest -q"], "timeout_ms": 60_000},
                "status": "completed",
            }
            chunk = {"stdout": log_line(step), "stderr": "", "outcome": {"type": "exit", "exit_code": 1}}
            output = {"type": "shell_call_output", "call_id": f"call_{step}", "output": [chunk]}
        else:
            diff = "\n".join(f"-old line {k}\n+new line {k} of step {step}" for k in range(40))
            operation = {"type": "update_file", "path": "src/app.py", "diff": diff}
            call = {"type": "apply_patch_call", "call_id": f"call_{step}", "operation": operation}
            call["status"] = "completed"
            output = {"type": "apply_patch_call_output", "call_id": f"call_{step}", "status": "completed"}
        items += [call, output]
        tools: Any = [{"type": "shell"}, {"type": "apply_patch"}]
        raw = sdk.responses.with_raw_response.create(
            model=MODEL, input=items, tools=tools, max_output_tokens=300
        )
        assert raw.parse().status == "completed"
        compressed += raw.headers["x-gateway-compression"] != "none"
    assert compressed >= 8
    sent = fake_upstream.requests_to("/v1/responses")[-1].json
    assert responses_api.validate(sent, ResponsesState()) is None
    assert responses_api.count_input(None, sent["input"], sent["tools"]) + 300 <= WINDOW
    assert sent["input"][0] == task and sent["input"][-2:] == items[-2:]
    kept = [item for item in sent["input"] if item.get("type") in ("shell_call", "apply_patch_call")]
    assert len(kept) >= 8, "older steps keep their calls"


def test_a_computer_use_agent_is_fitted_step_by_step(fake_upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    """A computer-use agent with a reasoning model: each answer a reasoning item and a
    `computer_call`, each step's result a screenshot. Before, the loop was one run nothing could
    shrink, and once it outgrew the window every request was refused. Now older steps go as
    text, and every request of the loop is accepted by the strict fake (pairs, screenshots,
    and the reasoning each remaining call needs)."""
    screenshot = {"type": "computer_screenshot", "image_url": png_data_url(1024, 768)}
    tools: Any = [{"type": "computer_use_preview", "display_width": 1024, "display_height": 768}]
    items: list[Any] = [{"role": "user", "content": "Find the cheapest flight to Paris. CALL_TOOL"}]
    compressed = 0
    for _ in range(10):
        asked = items[-1]
        raw = sdk.responses.with_raw_response.create(
            model=MODEL, input=items, tools=tools, reasoning={"effort": "low"}, max_output_tokens=300
        )
        reply = raw.parse()
        compressed += raw.headers["x-gateway-compression"] != "none"
        call = reply.output[-1]
        assert call.type == "computer_call"
        items += [item.model_dump(exclude_none=True) for item in reply.output]
        items.append({"type": "computer_call_output", "call_id": call.call_id, "output": screenshot})
    assert compressed >= 6
    sent = fake_upstream.requests_to("/v1/responses")[-1].json
    assert responses_api.count_input(None, sent["input"], sent["tools"]) + 300 <= WINDOW
    assert sent["input"][0] == items[0] and sent["input"][-1] == asked, "the task and newest screenshot"
    actions = [item for item in sent["input"] if str(item.get("content")).startswith("[called computer")]
    assert len(actions) >= 5, "older steps keep their actions, as text"


def test_stream_and_byte_identical_relay(fake_upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    events = list(sdk.responses.create(model=MODEL, input="hello there", stream=True))
    assert events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "echo: hello there"
    body = orjson.dumps(
        {"model": MODEL, "input": [{"role": "user", "content": "hi"}], "metadata": {"k": "v"}}
    )
    answer = httpx.post(
        str(sdk.base_url) + "responses", content=body, headers={"authorization": "Bearer sk-caller"}
    )
    assert answer.status_code == 200 and answer.headers["x-gateway-compression"] == "none"
    assert fake_upstream.requests_to("/v1/responses")[-1].body == body


def test_long_streamed_conversation_is_fitted(fake_upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    items: list[Any] = []
    for turn in range(10):
        items.append({"role": "user", "content": log_line(turn)})
        stream = sdk.responses.create(model=MODEL, input=items, stream=True)
        last = list(stream)[-1]
        assert last.type == "response.completed"
        final = last.response
        items.append({"role": "assistant", "content": final.output_text})
    assert final.output_text.startswith("echo: line 0 of step 9")


def test_overflow_recovery(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    fake_upstream.window = WINDOW
    items = [{"role": "user" if n % 2 == 0 else "assistant", "content": log_line(n)} for n in range(9)]
    with openai.OpenAI(base_url=windowed(start_gateway, window=20_000), api_key="k", max_retries=0) as client:
        raw = client.responses.with_raw_response.create(model=MODEL, input=items)
        assert raw.headers["x-gateway-retry"] == "overflow"
        assert raw.parse().output_text.startswith("echo: line 0 of step 8")
        streamed = list(client.responses.create(model=MODEL, input=items, stream=True))
    assert streamed[-1].type == "response.completed", "the in-stream response.failed was retried"


def test_previous_response_id_pass_relays_the_upstreams_overflow(
    fake_upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    previous = sdk.responses.create(model=MODEL, input=log_line(0)).id
    for turn in range(1, 6):
        try:
            previous = sdk.responses.create(
                model=MODEL, input=log_line(turn), previous_response_id=previous
            ).id
        except openai.BadRequestError as refused:
            assert refused.code == "context_length_exceeded"
            assert "truncation" not in fake_upstream.requests_to("/v1/responses")[-1].json
            return
    pytest.fail("the server-side history never overflowed")


def test_previous_response_id_truncate_auto(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """truncate_auto: measured with input_tokens; over budget, the upstream is asked to truncate."""
    fake_upstream.window = WINDOW
    url = windowed(start_gateway, GATEWAY_COMPRESSION_RESPONSES_SERVER_STATE="truncate_auto")
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as client:
        previous = client.responses.create(model=MODEL, input=log_line(0)).id
        stages = []
        for turn in range(1, 8):
            raw = client.responses.with_raw_response.create(
                model=MODEL, input=f"{log_line(turn)}\nCALL_TOOL", previous_response_id=previous, tools=[TOOL]
            )
            stages.append(raw.headers["x-gateway-compression"])
            reply = raw.parse()
            call = reply.output[-1]
            assert call.type == "function_call"
            done = client.responses.create(
                model=MODEL,
                previous_response_id=reply.id,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "ok"}],
            )
            previous = done.id
    assert "server_truncation" in stages
    assert fake_upstream.requests_to("/v1/responses/input_tokens")
    truncated = [
        r.json for r in fake_upstream.requests_to("/v1/responses") if r.json.get("truncation") == "auto"
    ]
    assert truncated and all(r["previous_response_id"] for r in truncated)


def test_streamed_server_state_overflow_is_retried_with_truncation(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """The gateway does not know the window; the upstream's in-stream failure triggers truncation."""
    fake_upstream.window = WINDOW
    url = start_gateway(GATEWAY_COMPRESSION_RESPONSES_SERVER_STATE="truncate_auto")
    with openai.OpenAI(base_url=url, api_key="k", max_retries=0) as client:
        previous = client.responses.create(model=MODEL, input=log_line(0)).id
        for turn in range(1, 6):
            events = list(
                client.responses.create(
                    model=MODEL, input=log_line(turn), previous_response_id=previous, stream=True
                )
            )
            assert events[-1].type == "response.completed"
            previous = events[-1].response.id
    assert any(r.json.get("truncation") == "auto" for r in fake_upstream.requests_to("/v1/responses"))


def test_gateway_errors_name_the_field(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.responses.create(model=MODEL, input=[{"type": "function_call", "call_id": 3}])  # type: ignore[list-item]
    assert bad.value.param == "input[0].call_id"
    # A chat completions field on a message item: the compression (this one needs it) took it for
    # calls and failed with a 500. OpenAI answers such a field as an unknown parameter.
    foreign = {"role": "user", "content": "hi", "tool_calls": 1}
    with pytest.raises(openai.BadRequestError) as chat_field:
        sdk.responses.create(model=MODEL, max_output_tokens=2_950, input=[foreign])  # type: ignore[list-item]
    assert chat_field.value.param == "input[0].tool_calls" and chat_field.value.code == "unknown_parameter"
    with pytest.raises(openai.BadRequestError) as truncation:
        sdk.responses.create(model=MODEL, input="x", truncation="sometimes")  # type: ignore[arg-type]
    assert truncation.value.param == "truncation"
    # The built-in tools' items: the fields the gateway reads to pair and cut them.
    shell = {"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"]}}
    printed = {"type": "shell_call_output", "call_id": "c1"}
    for items, param in (
        ([{**shell, "action": "ls"}], "input[0].action"),
        ([shell, {**printed, "output": "ok"}], "input[1].output"),
        ([shell, {**printed, "output": [{"stdout": 1}]}], "input[1].output[0].stdout"),
        ([{"type": "local_shell_call_output", "output": "{}"}], "input[0].id"),
        ([{"type": "apply_patch_call", "call_id": "c2", "operation": []}], "input[0].operation"),
    ):
        with pytest.raises(openai.BadRequestError) as built_in:
            sdk.responses.create(model=MODEL, input=items)
        assert built_in.value.param == param


def test_broken_stream_ends_with_a_responses_error_event(sdk: openai.OpenAI) -> None:
    """An upstream that drops the stream midway: it ends with the Responses API's own `error` event."""
    events = list(
        sdk.responses.create(
            model=MODEL, input="hello", stream=True, extra_headers={"x-fake-fault": "half_stream"}
        )
    )
    assert events[-1].type == "error" and events[-1].code == "upstream_broken"  # type: ignore[union-attr]
    answer = httpx.post(
        str(sdk.base_url) + "responses",
        json={"model": MODEL, "input": "hello there", "stream": True},
        headers={"x-fake-fault": "half_stream"},
        timeout=30,
    )
    last = answer.text.rstrip("\n").split("\n\n")[-1]
    assert last.startswith("event: error\ndata: ")
    assert orjson.loads(last.split("data: ", 1)[1])["code"] == "upstream_broken"


def test_unfittable_layout_is_forwarded_unchanged(fake_upstream: FakeUpstream, sdk: openai.OpenAI) -> None:
    """A call answered only after a later user message cannot be fitted pair-safe: sent as it is, once."""
    items: Any = [
        {"role": "user", "content": "start"},
        {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
        {"role": "user", "content": log_line(1) + log_line(2) + log_line(4) + log_line(5)},
        {"type": "function_call_output", "call_id": "c1", "output": log_line(3)},
        {"role": "user", "content": "go on"},
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL, input=items)
    assert refused.value.code == "context_length_exceeded"  # the upstream's own answer, relayed
    sent = fake_upstream.requests_to("/v1/responses")
    assert len(sent) == 1 and sent[0].json["input"] == items


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_an_overflow_inside_a_stream_that_cannot_be_retried_reaches_the_client(
    sdk: openai.OpenAI, fake_upstream: FakeUpstream, mode: str
) -> None:
    """Found by fuzzing: a stream failing inside with context_length_exceeded (Responses: a 200,
    then `response.failed`), for a prompt the gateway cannot fit better (compression off, or a
    prompt far under any budget), was closed after its head was read, then read again: 502."""
    events = list(
        sdk.responses.create(
            model=MODEL,
            input="hi",
            stream=True,
            extra_headers={"x-fake-fault": "overflow", "x-gateway-compression": mode},
        )
    )
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None  # type: ignore[union-attr]
    assert events[-1].response.error.code == "context_length_exceeded"  # type: ignore[union-attr]
    assert len(fake_upstream.requests_to("/v1/responses")) == 1


def test_shapes_the_sdk_allows_reach_the_upstream_as_sent(
    fake_upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    """An item reference or message without `type`, a program's function output without `call_id`, a
    developer item adding tools: the SDK's types allow each; the gateway forwards them untouched."""
    first = sdk.responses.create(model=MODEL, input="Remember the number 7.")
    said = first.output[0].id
    items: Any = [
        {"role": "user", "content": "Remember the number 7."},
        {"id": said},  # an item reference, type left out
        {"id": said, "type": None},
        {"role": "developer", "tools": [TOOL]},
        {"type": "function_call_output", "output": "42"},  # made by a program: no call id
        {"role": "user", "content": "What was the number?", "type": None},
    ]
    answer = sdk.responses.create(model=MODEL, input=items)
    assert answer.status == "completed"
    assert fake_upstream.requests_to("/v1/responses")[-1].json["input"] == items
    # Only a developer adds tools that way: anyone else's item without content is the gateway's 400.
    sent = len(fake_upstream.requests_to("/v1/responses"))
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL, input=[{"role": "user", "tools": [TOOL]}])  # type: ignore[list-item]
    assert refused.value.param == "input[0].content"
    assert len(fake_upstream.requests_to("/v1/responses")) == sent


def test_a_stored_prompt_without_a_model_is_forwarded_uncompressed(
    fake_upstream: FakeUpstream, sdk: openai.OpenAI
) -> None:
    prompt: Any = {"id": "pmpt_abc", "version": "2", "variables": {"city": "Paris"}}
    long_input = [{"role": "user", "content": log_line(turn)} for turn in range(8)]  # over the window
    fake_upstream.window = None  # the stored prompt's model is the upstream's business
    reply = sdk.responses.with_raw_response.create(prompt=prompt, input=long_input)
    assert reply.status_code == 200 and reply.parse().model == "prompt:pmpt_abc"
    assert reply.headers["x-gateway-compression"] == "none"
    assert int(reply.headers["x-gateway-prompt-tokens-before"]) > WINDOW  # counted, not fitted
    sent = fake_upstream.requests_to("/v1/responses")[-1]
    assert sent.json == {"prompt": prompt, "input": long_input}
    # Without a model and without a stored prompt it is still the client's mistake.
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(input="hi")  # type: ignore[call-overload]
    assert refused.value.param == "model"


def test_a_team_limited_to_some_models_must_name_the_model(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    teams = {"research": {"keys": [hash_key("sk-team-research")], "models": ["gpt-4o*"]}}
    url = start_gateway(GATEWAY_TEAMS=orjson.dumps(teams).decode(), GATEWAY_WINDOWS_DISCOVERY="false")
    with openai.OpenAI(base_url=url, api_key="sk-team-research", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(prompt={"id": "pmpt_abc"}, input="hi")
        assert refused.value.param == "model" and "name the model" in refused.value.message
        named = client.responses.create(model=MODEL, prompt={"id": "pmpt_abc"}, input="hi")
        assert named.status == "completed"
    assert [r.json.get("model") for r in fake_upstream.requests_to("/v1/responses")] == [MODEL]
    # The same on the routes relayed as they are (input_tokens, compact …).
    headers = {"authorization": "Bearer sk-team-research"}
    stored: Any = {"prompt": {"id": "pmpt_abc"}, "input": "hi"}
    for path in ("/responses/input_tokens", "/responses/compact"):
        refused_too = httpx.post(url + path, headers=headers, json=stored)
        assert refused_too.status_code == 400 and refused_too.json()["error"]["param"] == "model"
        assert not fake_upstream.requests_to("/v1" + path)


def test_an_input_the_gateway_cannot_fit_is_still_counted_whole_and_held_to_a_team_cap(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """A program's output (no call id) answers no call the gateway can see, so the items cannot be
    fitted pair-safe: they go as they are, but counted in full, and not past a team's cap."""
    fake_upstream.window = None
    items: Any = [{"role": "user", "content": log_line(turn)} for turn in range(6)]
    call = {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"}
    paired = [*items, call, {"type": "function_call_output", "call_id": "c1", "output": log_line(7)}]
    unpaired = [*items, {"type": "function_call_output", "output": log_line(7)}]
    url = windowed(start_gateway, 100_000)
    with openai.OpenAI(base_url=url, api_key="sk-caller", max_retries=0) as client:
        counted = {
            name: int(
                client.responses.with_raw_response.create(model=MODEL, input=body).headers[
                    "x-gateway-prompt-tokens-before"
                ]
            )
            for name, body in (("paired", paired), ("unpaired", unpaired))
        }
    assert counted["unpaired"] > 0.9 * counted["paired"]  # not the instructions alone (3 tokens)
    teams = {"small": {"keys": [hash_key("sk-team-small")], "limits": {"max_context_tokens": 1_000}}}
    capped = windowed(start_gateway, 100_000, GATEWAY_TEAMS=orjson.dumps(teams).decode())
    sent_before = len(fake_upstream.requests_to("/v1/responses"))
    with openai.OpenAI(base_url=capped, api_key="sk-team-small", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=MODEL, input=unpaired)
        assert refused.value.code == "context_length_exceeded" and refused.value.param == "input"
        fitted = client.responses.with_raw_response.create(model=MODEL, input=paired)
        assert int(fitted.headers["x-gateway-prompt-tokens-after"]) <= 1_000
    assert len(fake_upstream.requests_to("/v1/responses")) == sent_before + 1  # the fitted one only


def test_a_team_cap_holds_for_a_history_kept_upstream(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """A chain of `previous_response_id`s grows on the upstream, where the gateway cannot compress
    it: measured whole with input_tokens, a request over the team's cap is refused, not sent."""
    fake_upstream.window = None
    teams = {"small": {"keys": [hash_key("sk-team-small")], "limits": {"max_context_tokens": 2_000}}}
    url = windowed(start_gateway, 100_000, GATEWAY_TEAMS=orjson.dumps(teams).decode())
    answered = 0
    with openai.OpenAI(base_url=url, api_key="sk-team-small", max_retries=0) as client:
        previous = client.responses.create(model=MODEL, input=log_line(0)).id
        answered += 1
        with pytest.raises(openai.BadRequestError) as refused:
            for turn in range(1, 8):
                chained = {"input": log_line(turn), "previous_response_id": previous}
                reply = client.responses.create(model=MODEL, **chained)
                previous, answered = reply.id, answered + 1
    assert refused.value.code == "context_length_exceeded" and "team's context cap" in refused.value.message
    assert 1 < answered < 8  # the chain grew past the cap after a few turns
    measured = fake_upstream.requests_to("/v1/responses/input_tokens")
    assert len(measured) == answered  # every chained request measured, the refused one included
    assert len(fake_upstream.requests_to("/v1/responses")) == answered  # the refused one never sent


def test_a_team_cap_holds_for_a_stored_prompt_and_a_slow_count_does_not_fail_the_request(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """The cap holds whether the body names the model or a stored prompt does; and input_tokens is
    a probe: one that does not answer in windows.discovery_timeout leaves the request to go on."""
    fake_upstream.window = None
    teams = {"small": {"keys": [hash_key("sk-team-small")], "limits": {"max_context_tokens": 2_000}}}
    url = windowed(start_gateway, 100_000, GATEWAY_TEAMS=orjson.dumps(teams).decode())
    with openai.OpenAI(base_url=url, api_key="sk-team-small", max_retries=0) as client:
        first = client.responses.create(model=MODEL, input=log_line(0)).id
        fake_upstream.faults = ["hang"]  # the next upstream request: the count
        fake_upstream.hang_seconds = 30
        started = time.monotonic()
        quick = client.responses.create(model=MODEL, input="and then?", previous_response_id=first)
        assert quick.status == "completed" and time.monotonic() - started < 20
        previous = quick.id
        with pytest.raises(openai.BadRequestError):  # the chain grows to the cap
            for turn in range(1, 8):
                chained = {"input": log_line(turn), "previous_response_id": previous}
                previous = client.responses.create(model=MODEL, **chained).id
        with pytest.raises(openai.BadRequestError) as refused:  # the same, the model named by a prompt
            client.responses.create(  # type: ignore[call-overload]
                prompt={"id": "pmpt_abc"}, input=log_line(9), previous_response_id=previous
            )
    assert "team's context cap" in refused.value.message
