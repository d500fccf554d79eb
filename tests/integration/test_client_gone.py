"""A client that hangs up while the gateway counts and fits its request: the upstream is never called."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httpx
import orjson

from gateway.app import create_app
from gateway.settings import load_settings
from tests.fakes.serve import serve_in_thread
from tests.fakes.upstream import FakeUpstream


def test_no_upstream_call_after_the_client_left_during_fitting(
    fake_upstream: FakeUpstream, gateway_url: str
) -> None:
    _leave_during_fitting(gateway_url)
    # The same request from a client that stays is answered (compressed) within this time.
    time.sleep(8)
    assert fake_upstream.requests_to("/v1/chat/completions") == []


def test_under_another_asgi_server_the_hang_up_is_noticed_too(fake_upstream: FakeUpstream) -> None:
    # Plain uvicorn (not the gateway's protocol): the app asks through starlette instead.
    settings = load_settings(None, {"GATEWAY_UPSTREAM_BASE_URL": fake_upstream.base_url})
    with serve_in_thread(create_app(settings)) as url:
        _leave_during_fitting(f"{url}/v1")
        time.sleep(8)
    assert fake_upstream.requests_to("/v1/chat/completions") == []


def _leave_during_fitting(gateway_url: str) -> None:
    # Far over gpt-4o's window: counting and fitting take a good fraction of a second at least.
    body = orjson.dumps(
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "many words here " * 400_000}]}
    )
    parts = urlsplit(gateway_url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body
        )


def test_the_same_request_from_a_client_that_stays_is_forwarded(
    fake_upstream: FakeUpstream, gateway_url: str
) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "many words here " * 400_000}]}
    reply = httpx.post(f"{gateway_url}/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200
    assert len(fake_upstream.requests_to("/v1/chat/completions")) == 1
