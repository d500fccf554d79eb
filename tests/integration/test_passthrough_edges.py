"""Pass-through routes under hostile paths, large uploads, broken bodies and vanishing clients."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.conftest import GatewayFactory
from tests.fakes.upstream import FAULT_HEADER, FakeUpstream


def _traceback(record: logging.LogRecord) -> str:
    assert record.exc_info is not None
    return logging.Formatter().formatException(record.exc_info)


def _raw_request(base_url: str, request_line: bytes, extra: bytes = b"") -> tuple[int, bytes]:
    """Send one request exactly as written (httpx would normalise the path); status and body."""
    parts = urlsplit(base_url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request_line + b"\r\nhost: gateway\r\nconnection: close\r\n" + extra + b"\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(
    "path",
    [
        b"/v1/../admin",
        b"/v1/./models",
        b"/v1/%2e%2e/admin",
        b"/v1/.%2E/admin",
        b"/v1/..%2fadmin",
        b"/v1/models%2F..%2Fadmin",
        b"/v1/models%5c..%5cadmin",
        b"/v1/models/..",
        b"/v1/models/%00",
        b"/v1/models/a%0d%0aX-Injected:%20yes",
        b"/v1/models/%7f",
    ],
)
def test_unsafe_paths_answer_400_naming_the_path(
    fake_upstream: FakeUpstream, gateway_url: str, path: bytes
) -> None:
    status, body = _raw_request(gateway_url, b"GET " + path + b" HTTP/1.1")
    assert status == 400
    error = orjson.loads(body)["error"]
    assert error["param"] == "path" and error["code"] == "invalid_path"
    assert "Invalid URL path" in error["message"] and "\r" not in error["message"]
    assert fake_upstream.received == []


def test_escaped_space_stays_escaped_in_the_upstream_request_line(
    fake_upstream: FakeUpstream, gateway_url: str
) -> None:
    status, body = _raw_request(gateway_url, b"GET /v1/models/my%20model HTTP/1.1")
    # The fake decodes the path and names it in its 404; a request line with a raw space would
    # have been refused as malformed before reaching its routes.
    assert status == 404, body
    assert "The model `my model` does not exist" in orjson.loads(body)["error"]["message"]
    assert fake_upstream.received[0].path == "/v1/models/my model"


def test_lone_percent_is_escaped_not_forwarded_raw(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    status, body = _raw_request(gateway_url, b"GET /v1/models/100%zz HTTP/1.1")
    assert status == 404, body
    assert "The model `100%zz` does not exist" in orjson.loads(body)["error"]["message"]


def test_bare_v1_is_not_redirected_to_the_clients_host(fake_upstream: FakeUpstream, gateway_url: str) -> None:
    status, body = _raw_request(
        gateway_url.removesuffix("/v1"), b"GET /v1 HTTP/1.1", b"host: evil.example\r\n"
    )
    assert status == 404
    assert b"evil.example" not in body
    assert orjson.loads(body)["error"]["message"] == "Invalid URL (GET /v1)"


def test_upload_above_the_chat_limit_reaches_the_upstream(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway(GATEWAY_SERVER_MAX_BODY_BYTES="1000000")
    upload = b"x" * 3_000_000
    reply = httpx.post(f"{url}/files", content=upload, headers={"content-type": "application/octet-stream"})
    # The fake has no /v1/files upload route: its 404 proves the whole body went through.
    assert reply.status_code == 404
    assert fake_upstream.received[0].body == upload
    chat = httpx.post(f"{url}/chat/completions", content=b"{" + b" " * 1_000_000 + b"}")
    assert chat.status_code == 413


def test_upload_above_the_pass_through_limit_is_413(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway(GATEWAY_SERVER_MAX_PASSTHROUGH_BODY_BYTES="2000000")
    reply = httpx.post(f"{url}/files", content=b"x" * 3_000_000)
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "request_too_large"
    assert fake_upstream.received == []


@pytest.mark.parametrize("fault", ["reset", "half_stream"])
def test_body_broken_midway_reaches_the_client_as_a_broken_transfer(
    fake_upstream: FakeUpstream, gateway_url: str, fault: str
) -> None:
    # A sized JSON answer cut short by the upstream. (Streams are relayed by the prompt routes,
    # which end a broken one with the API's own error event: see their tests.)
    payload = {"model": "text-embedding-3-small", "input": ["hello " * 200] * 50}
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{gateway_url}/embeddings", json=payload, headers={FAULT_HEADER: fault}, timeout=10)


def test_client_leaving_during_an_upload_logs_one_line_without_traceback(
    fake_upstream: FakeUpstream, gateway_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    parts = urlsplit(gateway_url)
    assert parts.hostname is not None and parts.port is not None
    caplog.set_level(logging.INFO)
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        # Larger than the retry buffer, so it streams upstream as it arrives; then the client leaves.
        sock.sendall(
            b"POST /v1/files HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/octet-stream\r\n"
            b"content-length: 50000000\r\n\r\n" + b"x" * 3_000_000
        )
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while not any("disconnected" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.05)
    # The fake upstream serves from this process too: its own records (it saw the upload cut) are not ours.
    gateway_records = [
        r
        for r in caplog.records
        if r.name.startswith(("gateway", "uvicorn")) and not (r.exc_info and "tests/fakes" in _traceback(r))
    ]
    assert any("disconnected" in r.getMessage() for r in gateway_records)
    assert all(r.exc_info is None and r.levelno < logging.ERROR for r in gateway_records), [
        (r.levelname, r.getMessage()) for r in gateway_records
    ]


def test_streamed_upload_past_the_limit_is_413_not_502(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    url = start_gateway(GATEWAY_SERVER_MAX_PASSTHROUGH_BODY_BYTES="2000000")

    def chunks() -> Iterator[bytes]:  # chunked: no declared length to refuse up front
        for _ in range(30):
            yield b"x" * 100_000

    reply = httpx.post(f"{url}/files", content=chunks(), timeout=10)
    assert reply.status_code == 413
    assert reply.json()["error"]["code"] == "request_too_large"
