"""Fuzzing the JSON surface of POST /v1/messages and POST /v1/responses through the real server.

Any body, well-formed or not in any field, answers below 500 with the route's own error shape
(Anthropic's on /v1/messages, OpenAI's on /v1/responses) naming a field, never a traceback;
small windows send most bodies through the compression engine too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream
from tests.integration.test_hostile_input import compression_headers, ids, json_values, maybe, parts, texts

MODELS = '{"claude-haiku-4-5": {"context_window": 900}, "gpt-4o": {"context_window": 700}}'
FUZZ = settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

anthropic_messages = st.fixed_dictionaries(
    {
        "role": maybe(st.sampled_from(["user", "assistant"])),
        "content": maybe(texts | st.lists(parts, max_size=3)),
    }
)
anthropic_bodies = st.fixed_dictionaries(
    {
        "model": maybe(st.sampled_from(["claude-haiku-4-5", "unknown-x"])),
        "max_tokens": maybe(st.integers(0, 800)),
        "messages": maybe(st.lists(anthropic_messages, max_size=8)),
    },
    optional={
        "system": maybe(texts | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}))),
        "stream": maybe(st.booleans()),
        "tools": maybe(
            st.lists(st.fixed_dictionaries({"name": texts, "input_schema": json_values}), max_size=2)
        ),
        "thinking": maybe(st.just({"type": "enabled", "budget_tokens": 1024})),
    },
)

response_parts = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": maybe(texts)}),
    st.fixed_dictionaries(
        {"type": st.just("input_image"), "image_url": maybe(st.just("data:image/png;base64,iVB"))}
    ),
    json_values,
)
BUILT_IN_CALLS = ["shell_call", "local_shell_call", "apply_patch_call"]
shell_chunks = st.fixed_dictionaries({"stdout": maybe(texts), "stderr": maybe(texts)})
response_items = st.one_of(
    st.fixed_dictionaries(
        {
            "role": maybe(st.sampled_from(["user", "assistant", "system", "developer"])),
            "content": maybe(texts | st.lists(response_parts, max_size=3)),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": maybe(ids),
            "name": maybe(texts),
            "arguments": maybe(texts),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call_output"),
            "call_id": maybe(ids),
            "output": maybe(texts | st.lists(response_parts)),
        }
    ),
    st.fixed_dictionaries({"type": st.just("reasoning"), "id": maybe(ids), "summary": maybe(st.just([]))}),
    # The built-in tools the client runs: their calls carry objects, a shell output its chunks.
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(BUILT_IN_CALLS),
            "call_id": maybe(ids),
            "id": maybe(ids),
            "action": maybe(json_values | st.fixed_dictionaries({"commands": st.lists(texts, max_size=2)})),
            "operation": maybe(json_values),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from([f"{kind}_output" for kind in BUILT_IN_CALLS]),
            "call_id": maybe(ids),
            "id": maybe(ids),
            "output": maybe(texts | json_values | st.lists(shell_chunks, max_size=2)),
        }
    ),
    # A computer call holds its action, or a batch of them; its output is a screenshot.
    st.fixed_dictionaries(
        {"type": st.just("computer_call"), "call_id": maybe(ids)},
        optional={
            "id": maybe(ids),
            "action": maybe(json_values),
            "actions": maybe(json_values | st.lists(json_values, max_size=2)),
            "pending_safety_checks": maybe(json_values),
        },
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("computer_call_output"),
            "call_id": maybe(ids),
            "output": maybe(
                json_values
                | st.fixed_dictionaries(
                    {"type": st.just("computer_screenshot")},
                    optional={"image_url": maybe(texts), "file_id": maybe(texts), "detail": maybe(texts)},
                )
            ),
        }
    ),
    json_values,
)
responses_bodies = st.fixed_dictionaries(
    {
        "model": maybe(st.sampled_from(["gpt-4o", "unknown-x"])),
        "input": maybe(texts | st.lists(response_items, max_size=8)),
    },
    optional={
        "instructions": maybe(texts),
        "stream": maybe(st.booleans()),
        "max_output_tokens": maybe(st.integers(0, 600)),
        "previous_response_id": maybe(ids),
        "conversation": maybe(ids | st.fixed_dictionaries({"id": maybe(ids)})),
        "truncation": maybe(st.sampled_from(["auto", "disabled"])),
        "tools": maybe(
            st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": texts}), max_size=2)
        ),
    },
)


@pytest.fixture
def fuzz_client(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> Iterator[tuple[httpx.Client, str]]:
    fake_upstream.window = 2_000
    url = start_gateway(GATEWAY_MODELS=MODELS, GATEWAY_COMPRESSION_RESPONSES_SERVER_STATE="truncate_auto")
    with httpx.Client(timeout=30) as client:
        yield client, url


@FUZZ
@given(body=anthropic_bodies, mode=compression_headers)
def test_no_messages_body_makes_the_gateway_fail(
    fuzz_client: tuple[httpx.Client, str], body: dict[str, Any], mode: str
) -> None:
    client, url = fuzz_client
    answer = client.post(
        f"{url}/messages",
        content=orjson.dumps(body),
        headers={"x-gateway-compression": mode, "anthropic-version": "2023-06-01"},
    )
    assert answer.status_code < 500, answer.text
    assert "Traceback" not in answer.text
    if answer.status_code >= 400 and "text/event-stream" not in answer.headers.get("content-type", ""):
        error = answer.json()
        assert error["type"] == "error" and error["error"]["type"] and error["error"]["message"]


@FUZZ
@given(body=responses_bodies, mode=compression_headers)
def test_no_responses_body_makes_the_gateway_fail(
    fuzz_client: tuple[httpx.Client, str], body: dict[str, Any], mode: str
) -> None:
    client, url = fuzz_client
    answer = client.post(
        f"{url}/responses", content=orjson.dumps(body), headers={"x-gateway-compression": mode}
    )
    assert answer.status_code < 500, answer.text
    assert "Traceback" not in answer.text
    if answer.status_code >= 400:
        error = answer.json()["error"]
        assert error["message"] and error["type"]
