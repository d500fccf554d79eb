"""Credential hygiene: when the gateway supplies the upstream key, no client credential crosses,
and a rejected gateway key is the operator's problem, never shown to the client."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream

GATEWAY_KEY = "sk-org-upstream-key-7777aaaa"
CALLER_SECRET = "caller-secret-0123456789"
MESSAGES = [{"role": "user", "content": "hello"}]
CLIENT_CREDENTIALS = {
    "Authorization": f"Bearer {CALLER_SECRET}",
    "api-key": CALLER_SECRET,
    "x-api-key": CALLER_SECRET,
    "x-goog-api-key": CALLER_SECRET,
    "Ocp-Apim-Subscription-Key": CALLER_SECRET,
    "Cookie": f"session={CALLER_SECRET}",
}


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings"])
def test_no_client_credential_crosses_when_the_gateway_supplies_the_key(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory, path: str
) -> None:
    fake_upstream.required_api_key = GATEWAY_KEY
    url = start_gateway(GATEWAY_UPSTREAM_API_KEY=GATEWAY_KEY)
    body = {"model": "gpt-4o", "messages": MESSAGES, "input": "x"}
    answer = httpx.post(
        f"{url}{path}?api-version=2024-10-21&api-key={CALLER_SECRET}&KEY={CALLER_SECRET}",
        json=body,
        headers={**CLIENT_CREDENTIALS, "X-Custom-Trace": "t-1"},
    )
    assert answer.status_code == 200
    seen = fake_upstream.received[-1]
    assert seen.headers["authorization"] == f"Bearer {GATEWAY_KEY}"
    assert CALLER_SECRET not in repr(seen.headers) and CALLER_SECRET not in seen.query
    # Everything that is not a credential still crosses.
    assert seen.headers["x-custom-trace"] == "t-1"
    assert seen.query == "api-version=2024-10-21"


def test_client_credentials_pass_through_when_the_gateway_has_no_key(
    fake_upstream: FakeUpstream, gateway_url: str
) -> None:
    answer = httpx.post(
        f"{gateway_url}/chat/completions?api-version=1",
        json={"model": "gpt-4o", "messages": MESSAGES},
        headers={"Authorization": "Bearer sk-callers-own", "api-key": "azure-own"},
    )
    assert answer.status_code == 200
    seen = fake_upstream.received[-1]
    assert seen.headers["authorization"] == "Bearer sk-callers-own"
    assert seen.headers["api-key"] == "azure-own"
    assert seen.query == "api-version=1"


@pytest.mark.parametrize("route", ["chat", "passthrough"])
def test_rejected_gateway_key_is_an_operator_error_without_key_material(
    fake_upstream: FakeUpstream,
    start_gateway: GatewayFactory,
    caplog: pytest.LogCaptureFixture,
    route: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    fake_upstream.required_api_key = "sk-the-key-the-upstream-wants"
    url = start_gateway(GATEWAY_UPSTREAM_API_KEY=GATEWAY_KEY)
    client = openai.OpenAI(base_url=url, api_key=CALLER_SECRET, max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        if route == "chat":
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES)  # type: ignore[arg-type]
        else:
            client.models.list()
    error = caught.value
    # Not a 401: the caller's own key is not what is wrong, and SDKs must not tell them so.
    assert error.status_code == 502
    assert isinstance(error.body, dict) and error.body.get("code") == "upstream_auth_failed"
    text = error.response.text
    # The upstream's 401 quotes a masked form of the key ("sk-org-u…aaaa"): none of it may show.
    for fragment in (GATEWAY_KEY, GATEWAY_KEY[:8], GATEWAY_KEY[-4:], "Incorrect API key"):
        assert fragment not in text
    assert error.response.headers["x-gateway-request-id"]
    assert "rejected the gateway's configured API key" in caplog.text
    assert GATEWAY_KEY not in caplog.text and CALLER_SECRET not in caplog.text
