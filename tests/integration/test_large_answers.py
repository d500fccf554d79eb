"""Answers the upstream makes too large to read whole: relayed as they come, never held.

The upstream's answers are evidence, not truth (DESIGN, trust boundaries). A non-streamed
answer is read whole for its usage, an error for what it says about the prompt; an upstream
that sends hundreds of megabytes (a broken or hostile server) took a worker past its memory
limit (300 MB: +990 MB as a 200, +600 MB as a 400).
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from gateway.proxy.upstream import MAX_READ_ANSWER_BYTES, MAX_READ_ERROR_BYTES, Upstream
from gateway.settings import UpstreamSettings
from tests.conftest import GatewayFactory
from tests.fakes.serve import serve_in_thread

CHUNK = b" " * (1 << 20)  # one buffer sent again and again: the upstream itself holds 1 MB
HELLO = {"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


def _answer(status: int, size: int) -> StreamingResponse:
    """A JSON object of `size` bytes, mostly spaces: what a client can parse when it is whole."""

    async def body() -> AsyncIterator[bytes]:
        yield b'{"id": "chatcmpl-big", "object": "chat.completion", "padding": "'
        for _ in range(size // len(CHUNK)):
            yield CHUNK
        yield b'"}'

    return StreamingResponse(body(), status_code=status, media_type="application/json")


@pytest.fixture
def gateway(start_gateway: GatewayFactory) -> Iterator[str]:
    """A gateway before an upstream answering POST /v1/chat/completions with the status and size
    the request's `model` names: `status-MB`."""

    async def completions(request: Request) -> StreamingResponse:
        status, megabytes = (await request.json())["model"].split("-")
        return _answer(int(status), int(megabytes) << 20)

    app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
    with serve_in_thread(app) as upstream:
        yield start_gateway(GATEWAY_UPSTREAM_BASE_URL=upstream + "/v1", GATEWAY_WINDOWS_DISCOVERY="false")


def _streamed_size(url: str, model: str) -> tuple[int, int, int]:
    """(status, bytes received, peak bytes this process allocated meanwhile): the client reads in
    pieces, so what is held is the gateway's (it serves in a thread here) and the fake's."""
    tracemalloc.start()
    try:
        received = 0
        with httpx.stream(
            "POST", url + "/chat/completions", json={**HELLO, "model": model}, timeout=60
        ) as answer:
            for piece in answer.iter_bytes():
                received += len(piece)
            status = answer.status_code
        return status, received, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_answer_too_large_to_read_goes_through_without_being_held(gateway: str) -> None:
    size = 3 * MAX_READ_ANSWER_BYTES
    status, received, held = _streamed_size(gateway, f"200-{size >> 20}")
    assert status == 200 and received == size + len(
        b'{"id": "chatcmpl-big", "object": "chat.completion", "padding": ""}'
    )
    assert held < 2 * MAX_READ_ANSWER_BYTES  # read whole, it was held twice over: 6x this bound


def test_an_error_too_large_to_read_is_relayed_and_a_retryable_one_refused(gateway: str) -> None:
    size = 8 * MAX_READ_ERROR_BYTES
    status, received, held = _streamed_size(gateway, f"400-{size >> 20}")
    assert status == 400 and received > size  # the upstream's own answer, whole
    assert held < size
    # A status the gateway retries (its body kept for the client if every attempt fails): such a
    # body is not read past the bound, and the client gets the gateway's own 502 instead.
    answer = httpx.post(
        gateway + "/chat/completions", json={**HELLO, "model": f"503-{size >> 20}"}, timeout=60
    )
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["code"] == "upstream_broken" and "error body over" in error["message"]
    # Small answers are still read: an ordinary error comes back whole and parsed by the client.
    small = httpx.post(gateway + "/chat/completions", json={**HELLO, "model": "400-0"}, timeout=60)
    assert small.status_code == 400 and json.loads(small.content)["id"] == "chatcmpl-big"


def test_a_look_up_answer_past_its_bound_is_no_answer() -> None:
    """Window discovery reads a model listing of at most `max_bytes` (OpenRouter's is hundreds of
    KB): one larger is not read on, and counts as no answer."""

    async def listing(request: Request) -> StreamingResponse:
        return _answer(200, int(request.query_params["mb"]) << 20)

    async def fetch(base: str) -> tuple[Any, Any]:
        upstream = Upstream(UpstreamSettings(base_url=base))
        await upstream.start()
        try:
            small = await upstream.fetch_json("GET", base + "/models?mb=1", {}, None, max_bytes=2 << 20)
            large = await upstream.fetch_json("GET", base + "/models?mb=3", {}, None, max_bytes=2 << 20)
        finally:
            await upstream.close()
        return small, large

    with serve_in_thread(Starlette(routes=[Route("/v1/models", listing)])) as url:
        small, large = asyncio.run(fetch(url + "/v1"))
    assert small["id"] == "chatcmpl-big" and large is None
