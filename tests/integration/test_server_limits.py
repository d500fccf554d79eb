"""Server limits through the real server: raw sockets against uvicorn on 127.0.0.1.

Each test lowers one limit (``server.*``) so that hostile clients — huge or endless headers,
slowloris headers and bodies, floods of connections — are cut off in a fraction of a second.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from gateway.server.run import RESERVED_FDS, connection_cap, raise_open_file_limit
from tests.conftest import GatewayFactory
from tests.fakes.upstream import FakeUpstream
from tests.metrics import metric

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
# Long enough for any refusal on a loaded machine, far below the defaults being replaced.
WAIT = 10.0


def _address(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


@contextmanager
def _connect(base_url: str) -> Iterator[socket.socket]:
    sock = socket.create_connection(_address(base_url), timeout=WAIT)
    try:
        yield sock
    finally:
        sock.close()


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (raises on timeout)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def _chat_request(extra_headers: bytes = b"") -> bytes:
    body = orjson.dumps(CHAT)
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
        + extra_headers
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )


def test_unfinished_huge_header_is_431_without_buffering_it(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    base = start_gateway(GATEWAY_SERVER_MAX_HEADER_BYTES="8192")
    with _connect(base) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nx-padding: ")
        sent = 0
        # Keep sending a header that never ends; the gateway must answer long before 100 MB.
        with pytest.raises(OSError):
            while sent < 100 * 1024 * 1024:
                sock.sendall(b"a" * 65536)
                sent += 65536
        response = _read_until_closed(sock)
    assert sent < 4 * 1024 * 1024
    assert _status(response) == 431
    assert b"headers are larger" in response
    assert fake_upstream.received == []


def test_complete_huge_header_is_431_and_never_forwarded(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    base = start_gateway()  # the default limit (64 KiB)
    with _connect(base) as sock:
        with suppress(OSError):  # the gateway may close before the last byte is written
            sock.sendall(_chat_request(b"x-padding: " + b"a" * 10_000_000 + b"\r\n"))
        response = _read_until_closed(sock)
    assert _status(response) == 431
    assert fake_upstream.received == []


def test_header_just_under_the_limit_is_served(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    base = start_gateway(GATEWAY_SERVER_MAX_HEADER_BYTES="8192")
    reply = httpx.post(f"{base}/chat/completions", json=CHAT, headers={"x-padding": "a" * 7000}, timeout=WAIT)
    assert reply.status_code == 200
    assert fake_upstream.requests_to("/v1/chat/completions")[0].headers["x-padding"] == "a" * 7000
    too_big = httpx.post(
        f"{base}/chat/completions", json=CHAT, headers={"x-padding": "a" * 9000}, timeout=WAIT
    )
    assert too_big.status_code == 431
    assert too_big.json()["error"]["code"] == "request_rejected"


def test_slowloris_headers_answer_408_after_the_header_timeout(start_gateway: GatewayFactory) -> None:
    base = start_gateway(GATEWAY_SERVER_HEADER_TIMEOUT="0.5")
    with _connect(base) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: gateway\r\n")
        # One header line a little at a time, as a slowloris client does: never idle for long.
        with pytest.raises(OSError):
            for _ in range(100):
                sock.sendall(b"x-a: b\r\n")
                time.sleep(0.1)
        response = _read_until_closed(sock)
    assert _status(response) == 408
    assert time.monotonic() - started < WAIT


def test_connection_that_never_sends_is_closed_after_the_header_timeout(
    start_gateway: GatewayFactory,
) -> None:
    base = start_gateway(GATEWAY_SERVER_HEADER_TIMEOUT="0.3")
    with _connect(base) as sock:
        assert _read_until_closed(sock) == b""


def test_stalled_body_answers_408_and_the_request_is_not_forwarded(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    base = start_gateway(GATEWAY_SERVER_BODY_TIMEOUT="0.5")
    body = orjson.dumps(CHAT)
    with _connect(base) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body[:10]
        )
        response = _read_until_closed(sock)
    assert _status(response) == 408
    assert b"body stalled" in response
    assert fake_upstream.received == []


def test_a_body_dripped_below_the_minimum_rate_answers_408(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """A byte every 0.1 s is never silent for the body timeout: 20 such connections held every
    slot of a gateway for as long as they liked. Past the timeout a body must keep a rate."""
    base = start_gateway(GATEWAY_SERVER_BODY_TIMEOUT="0.5", GATEWAY_SERVER_BODY_MIN_RATE="100")
    body = orjson.dumps({**CHAT, "user": "x" * 500})
    with _connect(base) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body)
        )
        sock.settimeout(0.1)
        response = b""
        for byte in body:  # sent whole, this takes 50 s
            try:
                sock.sendall(bytes([byte]))
                response += sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if response:
                break
    assert _status(response) == 408
    assert b"too slowly" in response
    assert fake_upstream.received == []


def test_slow_but_steady_body_is_served(fake_upstream: FakeUpstream, start_gateway: GatewayFactory) -> None:
    base = start_gateway(GATEWAY_SERVER_BODY_TIMEOUT="0.5", GATEWAY_SERVER_BODY_MIN_RATE="50")
    request = _chat_request()
    head, body = request.split(b"\r\n\r\n", 1)
    with _connect(base) as sock:
        sock.sendall(head + b"\r\n\r\n")
        # Longer in all than the timeout, never silent for that long.
        for start in range(0, len(body), 10):
            sock.sendall(body[start : start + 10])
            time.sleep(0.1)
        response = sock.recv(65536)
    assert _status(response) == 200


def test_idle_keep_alive_connection_is_closed_after_its_timeout(start_gateway: GatewayFactory) -> None:
    base = start_gateway(GATEWAY_SERVER_KEEP_ALIVE_TIMEOUT="0.3")
    with _connect(base) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: gateway\r\n\r\n")
        response = _read_until_closed(sock)
        # Closed after the answer well before uvicorn's own 5 s or the header timeout.
        assert time.monotonic() - started < 3
    assert _status(response) == 200 and response.endswith(b"}")


def test_idle_connections_beyond_the_cap_make_room_for_new_clients(start_gateway: GatewayFactory) -> None:
    base = start_gateway(GATEWAY_SERVER_MAX_CONNECTIONS="8")
    with ExitStack() as stack:
        idle = [stack.enter_context(_connect(base)) for _ in range(50)]
        # Every new client is served: the oldest idle connections were closed for it.
        for _ in range(5):
            assert httpx.get(base.removesuffix("/v1") + "/healthz", timeout=WAIT).status_code == 200
        closed = 0
        for sock in idle:
            sock.settimeout(0.2)
            try:
                closed += sock.recv(1) == b""
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
        assert closed >= 50 - 8


def test_connections_mid_request_beyond_the_cap_refuse_new_ones(start_gateway: GatewayFactory) -> None:
    base = start_gateway(GATEWAY_SERVER_MAX_CONNECTIONS="4")
    with ExitStack() as stack:
        for _ in range(4):
            busy = stack.enter_context(_connect(base))
            busy.sendall(b"GET /healthz HTTP/1.1\r\nhost: gateway\r\n")  # headers never finished
        time.sleep(0.2)
        with _connect(base) as extra:
            with suppress(OSError):
                extra.sendall(b"GET /healthz HTTP/1.1\r\nhost: gateway\r\n\r\n")
            assert _read_until_closed(extra) == b""


def test_connection_cap_fits_under_the_open_file_limit() -> None:
    assert connection_cap(4096, 1024) == (1024 - RESERVED_FDS) // 2
    assert connection_cap(100, 1_000_000) == 100
    limit = raise_open_file_limit()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard == limit or hard == resource.RLIM_INFINITY


def _json_body(response: bytes) -> dict[str, object]:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    parsed = orjson.loads(body)
    assert isinstance(parsed, dict)
    return parsed


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /v1/models HTTP/1.1\r\nhost: gateway\r\nx-bad: a\x01b\r\n\r\n",  # control byte in a value
        b"GET /v1/models HTTP/1.1\r\nhost: gateway\r\ncontent-length: -1\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}",
        b"GET /v1/mo\xffdels HTTP/1.1\r\nhost: gateway\r\n\r\n",
    ],
    ids=["control-byte", "negative-length", "two-lengths", "raw-0xff-path"],
)
def test_malformed_http_answers_json_400(start_gateway: GatewayFactory, request_bytes: bytes) -> None:
    """What the HTTP parser refuses is answered like every other gateway error: JSON, not text."""
    base = start_gateway()
    with _connect(base) as sock:
        sock.sendall(request_bytes)
        response = _read_until_closed(sock)
    assert _status(response) == 400
    assert _json_body(response)["error"] == {
        "message": "The request is not valid HTTP/1.1.",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_rejected",
    }


def test_refusals_on_anthropic_paths_are_in_anthropic_shape(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    base = start_gateway(GATEWAY_SERVER_BODY_TIMEOUT="0.5", GATEWAY_SERVER_MAX_HEADER_BYTES="2048")
    with _connect(base) as sock:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: gateway\r\ncontent-length: 50\r\n\r\n{")
        stalled = _read_until_closed(sock)
    with _connect(base) as sock:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: gateway\r\nx-big: " + b"a" * 4096 + b"\r\n\r\n")
        too_large = _read_until_closed(sock)
    assert (_status(stalled), _status(too_large)) == (408, 431)
    assert _json_body(stalled) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "The request body stalled: nothing arrived for too long.",
        },
    }
    assert _json_body(too_large) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "The request's headers are larger than the gateway accepts.",
        },
    }
    assert fake_upstream.received == []


def test_an_upgrade_offer_with_a_body_is_refused_by_name(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """curl --http2 on http:// offers h2c: the parser would read the body as the new protocol's
    bytes and hand the app an empty body. Without a body the offer is ignored and served."""
    base = start_gateway()
    offer = (
        b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
    )
    with _connect(base) as sock:
        sock.sendall(_chat_request(offer))
        refused = _read_until_closed(sock)
    assert _status(refused) == 400
    assert "`Upgrade`" in str(_json_body(refused)["error"])
    assert fake_upstream.received == []
    with _connect(base) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: gateway\r\n" + offer + b"connection: close\r\n\r\n")
        served = _read_until_closed(sock)
    assert _status(served) == 200


def test_a_pipelined_request_refused_behind_another_never_answers_in_its_place(
    fake_upstream: FakeUpstream, start_gateway: GatewayFactory
) -> None:
    """Two requests sent at once on one connection, the second with headers too large: the
    431 meant for the second went out while the first was still with the upstream, and the
    client read it as the first one's answer. The connection closes instead (pipelining is rare:
    no common client uses it), and the refusal is counted as a request of its own."""
    fake_upstream.hang_seconds = 1.0
    base = start_gateway(GATEWAY_SERVER_MAX_HEADER_BYTES="8192")
    before = metric(base, "gateway_requests_total", status="4xx")
    first = _chat_request(b"x-fake-fault: hang\r\n")
    second = _chat_request(b"x-padding: " + b"a" * 9000 + b"\r\n")
    with _connect(base) as sock:
        sock.sendall(first + second)
        response = _read_until_closed(sock)
    assert not response.startswith(b"HTTP/1.1 431")
    # The refusal, and the first request, cut with the connection (499): two, each its own.
    assert metric(base, "gateway_requests_total", status="4xx") - before == 2
