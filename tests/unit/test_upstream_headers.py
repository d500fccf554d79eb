"""Pure header logic: hop-by-hop stripping, Retry-After parsing, URL mapping, request ids."""

from __future__ import annotations

import email.utils
import time

import pytest
from starlette.datastructures import Headers

from gateway.proxy.headers import request_id_for, to_client, to_upstream
from gateway.proxy.upstream import Upstream, forward_headers, retry_after_seconds
from gateway.settings import UpstreamSettings


def test_forward_headers_drops_hop_by_hop_and_connection_named() -> None:
    kept = forward_headers(
        [
            ("Connection", "close, X-Private"),
            ("X-Private", "1"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("Content-Length", "12"),
            ("Host", "example"),
            ("TE", "trailers"),
            ("Upgrade", "h2c"),
            ("OpenAI-Organization", "org-1"),
            ("X-Ratelimit-Remaining-Tokens", "99"),
        ]
    )
    assert kept == [("OpenAI-Organization", "org-1"), ("X-Ratelimit-Remaining-Tokens", "99")]


@pytest.mark.parametrize(("value", "expected"), [("3", 3.0), ("0.25", 0.25), ("-4", 0.0), ("soon", None)])
def test_retry_after_seconds(value: str, expected: float | None) -> None:
    assert retry_after_seconds([("Retry-After", value)]) == expected


def test_retry_after_http_date() -> None:
    in_ten = email.utils.formatdate(time.time() + 10, usegmt=True)
    seconds = retry_after_seconds([("retry-after", in_ten)])
    assert seconds is not None and 8 <= seconds <= 10.5
    assert retry_after_seconds([("x-other", "1")]) is None


@pytest.mark.parametrize(
    ("base", "path", "query", "expected"),
    [
        ("http://up:9/v1", "/v1/models", "", "http://up:9/v1/models"),
        ("http://up:9/v1/", "/v1/files/a%2Fb", "limit=2", "http://up:9/v1/files/a%2Fb?limit=2"),
        (
            "https://gw.example/openai/v1",
            "/v1/chat/completions",
            "",
            "https://gw.example/openai/v1/chat/completions",
        ),
    ],
)
def test_url_mapping_keeps_encoding(base: str, path: str, query: str, expected: str) -> None:
    upstream = Upstream(UpstreamSettings(base_url=base))
    assert str(upstream.url_for(path, query)) == expected


def test_to_upstream_replaces_key_only_when_configured() -> None:
    headers = Headers({"authorization": "Bearer caller", "accept-encoding": "gzip", "x-request-id": "r1"})
    passed = dict(to_upstream(headers, api_key=None, request_id="r1"))
    assert passed["authorization"] == "Bearer caller" and passed["accept-encoding"] == "gzip"
    replaced = dict(to_upstream(headers, api_key="sk-conf", request_id="r1", identity_encoding=True))
    assert replaced["authorization"] == "Bearer sk-conf"
    assert "accept-encoding" not in replaced
    assert replaced["x-request-id"] == "r1"


def test_to_client_prefers_upstream_request_id_and_drops_server_headers() -> None:
    out = dict(to_client([("X-Request-Id", "req_up"), ("Date", "x"), ("Server", "y")], request_id="gw1"))
    assert out == {b"x-request-id": b"req_up", b"x-gateway-request-id": b"gw1"}
    own = dict(to_client([], request_id="gw2", extra=[("x-gateway-compression", "none")]))
    assert own[b"x-request-id"] == b"gw2" and own[b"x-gateway-compression"] == b"none"


def test_request_id_rejects_unprintable_or_huge() -> None:
    assert request_id_for(Headers({"x-request-id": "abc-1"})) == "abc-1"
    assert len(request_id_for(Headers({"x-request-id": "a" * 500}))) == 32
    assert len(request_id_for(Headers({}))) == 32
