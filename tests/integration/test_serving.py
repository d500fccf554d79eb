"""The real `context-gateway serve` as operators run it: several workers, probes, logs, drain.

Each gateway is a child process (``python -m gateway.cli serve``) in front of the fake upstream;
the workers share a real Redis. What the tests read is what an operator sees: HTTP answers,
/metrics scrapes, and the process's log lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench import servers
from tests.fakes.upstream import FakeUpstream
from tests.metrics import metric

GATEWAY_KEY = "sk-gateway-own-key-" + "7" * 24
CLIENT_KEY = "sk-client-key-" + "3" * 24
CANARY = "CANARY-PROMPT-CONTENT-5e1d"


def _serve(
    logs: Path, upstream: FakeUpstream, *args: str, health: str = "/readyz", **environ: str
) -> servers.Server:
    env = {**servers.bench_environment(), "GATEWAY_UPSTREAM_BASE_URL": upstream.base_url, **environ}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return servers.start("gateway", ["-m", "gateway.cli", "serve", *args], health=health, env=env, logs=logs)


def _log_lines(server: servers.Server) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.log.read_text().splitlines() if line.strip()]


def _request_lines(server: servers.Server, **match: Any) -> list[dict[str, Any]]:
    lines = [line for line in _log_lines(server) if line["logger"] == "gateway.requests"]
    return [line for line in lines if all(line.get(k) == v for k, v in match.items())]


def _long_conversation(model: str) -> dict[str, Any]:
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "lorem ipsum dolor " * 150}
        for i in range(12)
    ]
    return {"model": model, "messages": [*history, {"role": "user", "content": "latest question"}]}


def _post_fresh(origin: str, body: dict[str, Any]) -> httpx.Response:
    # A new connection each time, so the kernel hands requests to whichever worker accepts first.
    with httpx.Client(timeout=30) as client:
        return client.post(f"{origin}/v1/chat/completions", json=body)


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory, fake_upstream_server: FakeUpstream, redis_url: str
) -> Iterator[servers.Server]:
    """`serve --workers 2` sharing a real Redis, logging JSON, supplying its own upstream key."""
    server = _serve(
        tmp_path_factory.mktemp("workers"),
        fake_upstream_server,
        "--workers",
        "2",
        GATEWAY_REDIS_URL=redis_url,
        GATEWAY_SERVER_LOG_FORMAT="json",
        GATEWAY_UPSTREAM_API_KEY=GATEWAY_KEY,
    )
    try:
        yield server
    finally:
        servers.stop(server)


def test_workers_share_a_learned_window_through_redis(
    workers: servers.Server, fake_upstream: FakeUpstream
) -> None:
    model = f"shared-window-{uuid.uuid4().hex[:8]}"
    fake_upstream.window = 3000
    body = _long_conversation(model)
    learned = _post_fresh(workers.origin, body)
    assert learned.status_code == 200 and learned.headers["x-gateway-retry"] == "overflow"
    # Until both workers have answered: each one fits the prompt ahead of time, never overflowing.
    overflows_before = len(fake_upstream.requests_to("/v1/chat/completions"))
    with ThreadPoolExecutor(8) as pool:
        for _ in range(25):
            answers = list(pool.map(lambda _: _post_fresh(workers.origin, body), range(8)))
            for answer in answers:
                assert answer.status_code == 200
                assert "x-gateway-retry" not in answer.headers
                assert answer.headers["x-gateway-compression"] != "none"
            if len({line["pid"] for line in _request_lines(workers, model=model)}) >= 2:
                break
    time.sleep(0.2)  # a line is written just after its answer's last byte
    pids = {line["pid"] for line in _request_lines(workers, model=model)}
    assert len(pids) == 2, "every request went to one worker"
    sent = len(fake_upstream.requests_to("/v1/chat/completions")) - overflows_before
    answered = len(_request_lines(workers, model=model)) - 1
    assert sent == answered  # one upstream call each: no overflow, no retry


def test_metrics_add_up_every_worker(workers: servers.Server, fake_upstream: FakeUpstream) -> None:
    model = f"metrics-{uuid.uuid4().hex[:8]}"
    before = metric(workers.origin, "gateway_requests_total", route="chat_completions", status="2xx")
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _post_fresh(workers.origin, body), range(40)))
    assert all(answer.status_code == 200 for answer in answers)
    assert len({line["pid"] for line in _request_lines(workers, model=model)}) == 2
    # Whichever worker answers a scrape, it reports both workers' requests.
    for _ in range(6):
        with httpx.Client() as fresh:
            scrape = fresh.get(f"{workers.origin}/metrics").text
        line = next(
            line
            for line in scrape.splitlines()
            if line.startswith('gateway_requests_total{route="chat_completions",status="2xx"}')
        )
        assert float(line.split()[-1]) - before == 40
    assert "gateway_upstream_duration_seconds_bucket" in scrape
    assert "gateway_requests_in_flight" in scrape


def test_one_json_line_per_request_without_content_or_keys(
    workers: servers.Server, fake_upstream: FakeUpstream
) -> None:
    model = f"logged-{uuid.uuid4().hex[:8]}"
    fake_upstream.window = 3000
    headers = {"authorization": f"Bearer {CLIENT_KEY}", "x-request-id": f"req-{model}"}
    with httpx.Client(base_url=workers.origin, headers=headers, timeout=30) as client:
        plain = {"model": model, "messages": [{"role": "user", "content": f"say {CANARY}"}]}
        assert client.post("/v1/chat/completions", json=plain).status_code == 200
        streamed = {**plain, "stream": True}
        assert CANARY in client.post("/v1/chat/completions", json=streamed).text
        long = _long_conversation(model)
        long["messages"][0]["content"] += CANARY
        assert client.post("/v1/chat/completions", json=long).status_code == 200
        assert (
            client.post("/v1/chat/completions", content=b'{"model": "' + CANARY.encode()).status_code == 400
        )
        assert client.get("/v1/models").status_code == 200
    time.sleep(0.2)  # the last line is written after the last byte is sent

    text = workers.log.read_text()
    assert CANARY not in text and CLIENT_KEY not in text and GATEWAY_KEY not in text
    lines = _log_lines(workers)  # every line of the process is JSON, uvicorn's own included
    assert all({"time", "level", "logger", "pid"} <= line.keys() for line in lines)
    ours = _request_lines(workers, request_id=f"req-{model}")
    assert [(line["route"], line["status"]) for line in ours] == [
        ("chat_completions", 200),
        ("chat_completions", 200),
        ("chat_completions", 200),
        ("chat_completions", 400),
        ("passthrough", 200),
    ]
    plain_line, stream_line, compressed_line = ours[:3]
    assert plain_line["stream"] is False and stream_line["stream"] is True
    assert plain_line["compression"] == ["none"] and plain_line["overflow_retry"] is False
    assert plain_line["tokens_before"] == plain_line["tokens_after"] > 0
    assert plain_line["upstream_attempts"] == 1 and plain_line["upstream_ms"] > 0
    assert 0 < plain_line["overhead_ms"] < plain_line["duration_ms"]
    assert compressed_line["tokens_after"] < compressed_line["tokens_before"]
    assert compressed_line["compression"] != ["none"]
    assert compressed_line["overflow_retry"] is True and compressed_line["upstream_attempts"] == 2


def _refused(origin: str) -> bool:
    host, port = origin.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


@pytest.mark.parametrize("worker_count", ["1", "2"])
def test_sigterm_lets_a_long_stream_finish_and_refuses_new_connections(
    tmp_path: Path, fake_upstream: FakeUpstream, worker_count: str
) -> None:
    fake_upstream.chunk_delay = 0.25
    grace = 20
    server = _serve(
        tmp_path, fake_upstream, "--workers", worker_count, GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS=str(grace)
    )
    words = " ".join(f"word{i}" for i in range(12))  # echoed back one word a chunk: ~3.5 s
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": words}]}
    received: list[str] = []
    refused_while_streaming = threading.Event()
    try:
        with httpx.stream("POST", f"{server.origin}/v1/chat/completions", json=body, timeout=30) as stream:
            lines = stream.iter_lines()
            received.append(next(lines))
            terminated = time.monotonic()
            server.process.send_signal(signal.SIGTERM)  # as the kubelet does: to the main process only
            for line in lines:
                received.append(line)
                if not refused_while_streaming.is_set() and _refused(server.origin):
                    refused_while_streaming.set()
        streamed_until = time.monotonic()
        server.process.wait(timeout=grace)
        exited = time.monotonic()
    finally:
        servers.stop(server)
    assert "data: [DONE]" in received
    content = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in received
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert content.endswith("word11")
    assert streamed_until - terminated > 2  # the stream really was in flight for seconds
    assert refused_while_streaming.is_set()
    # uvicorn re-raises the signal once drained: the process ends "terminated by SIGTERM", not killed.
    assert server.process.returncode in (0, -signal.SIGTERM)
    assert exited - terminated < grace


def test_a_stream_longer_than_the_grace_is_cut_and_the_process_exits(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.chunk_delay = 1.0
    server = _serve(tmp_path, fake_upstream, GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS="1")
    words = " ".join(f"word{i}" for i in range(30))
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": words}]}
    try:
        with (
            pytest.raises(httpx.RemoteProtocolError),
            httpx.stream("POST", f"{server.origin}/v1/chat/completions", json=body, timeout=30) as stream,
        ):
            lines = stream.iter_lines()
            next(lines)
            terminated = time.monotonic()
            server.process.send_signal(signal.SIGTERM)  # as the kubelet does: to the main process only
            for _ in lines:
                pass
        server.process.wait(timeout=15)
        assert time.monotonic() - terminated < 10
    finally:
        servers.stop(server)


def test_probes_alive_and_ready(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    server = _serve(tmp_path, fake_upstream, health="/healthz", GATEWAY_REDIS_URL="redis://127.0.0.1:1/0")
    try:
        alive = httpx.get(f"{server.origin}/healthz")
        ready = httpx.get(f"{server.origin}/readyz")
    finally:
        servers.stop(server)
    # Alive whatever Redis does (a liveness probe must not restart pods for someone else's outage);
    # ready too, with the outage reported: without teams failing closed nothing needs the store
    # (tests/integration/test_store.py has the case where it is not ready).
    assert alive.status_code == 200 and alive.json() == {"status": "ok"}
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "store": "unreachable"}


def _collections(origin: str) -> dict[str, float]:
    """python_gc_collections_total by generation, as a scrape of a one-process gateway reports it."""
    counts = {}
    for line in httpx.get(f"{origin}/metrics").text.splitlines():
        if line.startswith("python_gc_collections_total{"):
            counts[line.split('generation="')[1].split('"')[0]] = float(line.split()[-1])
    return counts


def test_serving_leaves_the_cyclic_collector_idle(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    # At CPython's defaults a young collection ran every ~10 requests and, now and then, a full one
    # over everything start-up loaded: tens of milliseconds with every request in flight stalled.
    server = _serve(tmp_path, fake_upstream)
    try:
        with httpx.Client(base_url=f"{server.origin}/v1", timeout=30) as client:
            history = _long_conversation("gpt-4o")["messages"]

            def ask(n: int) -> None:
                stream = n % 2 == 1
                body = {
                    "model": "gpt-4o",
                    "stream": stream,
                    "messages": [*history[:-1], {"role": "user", "content": f"question {n}"}],
                }
                assert client.post("/chat/completions", json=body).status_code == 200
                answer = client.post(
                    "/responses", json={"model": "gpt-4o", "stream": stream, "input": f"question {n}"}
                )
                assert answer.status_code == 200

            for n in range(10):  # pools and first-use state settle
                ask(n)
            before = _collections(server.origin)
            for n in range(10, 310):
                ask(n)
            after = _collections(server.origin)
    finally:
        servers.stop(server)
    assert set(before) == {"0", "1", "2"}
    assert after["2"] == before["2"], "a full collection ran while serving"
    assert after["0"] - before["0"] <= 2, f"{after['0'] - before['0']:.0f} young collections in 600 requests"


def _ready(origin: str) -> bool:
    try:
        return httpx.get(f"{origin}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _workers_of(server: servers.Server) -> set[int]:
    """The worker processes (multiprocessing's own helper, its resource tracker, left out)."""
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text()
    workers = set()
    for pid in map(int, children.split()):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                workers.add(pid)
        except OSError:  # gone meanwhile
            pass
    return workers


def test_a_worker_killed_outright_leaves_no_requests_in_flight_behind(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    """An out-of-memory kill ends a worker mid-stream with no chance to retire its gauges: the
    supervisor does it when it replaces the worker, so the in-flight gauge drains back to 0."""
    fake_upstream.chunk_delay = 0.25
    server = _serve(tmp_path, fake_upstream, "--workers", "2")
    words = " ".join(f"word{i}" for i in range(40))
    body = {"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": words}]}
    try:
        killed = _workers_of(server)
        assert len(killed) == 2
        assert metric(server.origin, "gateway_requests_in_flight") == 0  # a scrape is no load
        with httpx.stream("POST", f"{server.origin}/v1/chat/completions", json=body, timeout=30) as stream:
            lines = stream.iter_lines()
            next(lines)  # the stream is in flight on one of the workers
            assert metric(server.origin, "gateway_requests_in_flight") == 1
            for pid in killed:
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(httpx.HTTPError):
                for _ in lines:
                    pass
        deadline = time.monotonic() + 20
        while len(_workers_of(server) - killed) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_workers_of(server) - killed) == 2  # both replaced
        while not _ready(server.origin) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert metric(server.origin, "gateway_requests_in_flight") == 0
    finally:
        servers.stop(server)


def _raw_exchange(origin: str, request: bytes, then: bytes = b"") -> bytes:
    """Send `request` (then, after a pause, `then`) on a fresh connection; all the server answers."""
    host, port = origin.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        if then:
            time.sleep(1.0)
            with contextlib.suppress(OSError):
                sock.sendall(then)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


def test_requests_the_server_refuses_are_counted_logged_and_identified(
    tmp_path: Path, fake_upstream: FakeUpstream
) -> None:
    """Headers too large, HTTP that cannot be parsed, headers too slow and a body that stalls
    are answered by the server before (or beside) the app: they went uncounted, unlogged and
    without a request id, and the stalled body was logged as the client's hang-up (499). An
    operator under attack saw nothing. Each line is timed from the request's first byte, and a
    refusal on another spelling of Anthropic's route answers in Anthropic's shape."""
    server = _serve(
        tmp_path,
        fake_upstream,
        GATEWAY_SERVER_LOG_FORMAT="json",
        GATEWAY_SERVER_MAX_HEADER_BYTES="8192",
        GATEWAY_SERVER_BODY_TIMEOUT="0.5",
        GATEWAY_SERVER_HEADER_TIMEOUT="0.5",
    )
    try:
        before = metric(server.origin, "gateway_requests_total", status="4xx")
        chat = b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n"
        padded = b"x-pad: " + b"a" * 9000 + b"\r\ncontent-length: 2\r\n\r\n{}"
        answers = [
            _raw_exchange(server.origin, chat + padded),
            _raw_exchange(server.origin, b"GARBAGE / HTTP/1.1\r\n\r\n"),
            _raw_exchange(server.origin, chat + b"content-length: 100\r\n\r\n{", then=b'"model"'),
            _raw_exchange(server.origin, chat),  # headers never finished
            _raw_exchange(server.origin, chat.replace(b"/chat/completions", b"/Messages") + padded),
        ]
        statuses = [int(answer.split(b" ", 2)[1]) for answer in answers]
        assert statuses == [431, 400, 408, 408, 431]
        assert answers[4].endswith(b"}") and b'"type":"error"' in answers[4]  # Anthropic's shape
        ids = [re.search(rb"x-gateway-request-id: (\w+)", answer) for answer in answers]
        assert all(found is not None for found in ids)
        assert metric(server.origin, "gateway_requests_total", status="4xx") - before == 5
        deadline = time.monotonic() + 10
        while len(lines := _request_lines(server)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        logged = {line["request_id"]: line for line in lines}
        found_lines = [logged.get(found.group(1).decode(), {}) for found in ids if found]
        assert [line.get("status") for line in found_lines] == [431, 400, 408, 408, 431]
        assert found_lines[3]["duration_ms"] >= 400  # the headers' 0.5 s, not the refusal's instant
        # Scrapes are not load: at rest, nothing is in flight.
        assert metric(server.origin, "gateway_requests_in_flight") == 0
    finally:
        servers.stop(server)
