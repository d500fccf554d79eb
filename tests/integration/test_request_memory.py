"""A finished request leaves no reference cycles behind: all it held is freed when it ends.

Garbage in cycles waits for CPython's cyclic collector, whose collections then run every few
requests and walk everything the requests left (and, now and then, all that older generations
hold); what reference counting frees costs nothing of that.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import httpx
import pytest
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.request_log import RequestRecord

ANTHROPIC = {"x-api-key": "sk-test", "anthropic-version": "2023-06-01"}
Ask = Callable[[httpx.Client, str, int], httpx.Response]


def _chat(stream: bool) -> Ask:
    def ask(client: httpx.Client, url: str, n: int) -> httpx.Response:
        messages = [{"role": "user", "content": f"question {n}"}]
        return client.post(
            f"{url}/chat/completions", json={"model": "gpt-4o", "stream": stream, "messages": messages}
        )

    return ask


def _messages(stream: bool) -> Ask:
    def ask(client: httpx.Client, url: str, n: int) -> httpx.Response:
        body: dict[str, Any] = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 16,
            "stream": stream,
            "messages": [{"role": "user", "content": f"question {n}"}],
        }
        return client.post(f"{url}/messages", headers=ANTHROPIC, json=body)

    return ask


def _responses(stream: bool) -> Ask:
    def ask(client: httpx.Client, url: str, n: int) -> httpx.Response:
        return client.post(
            f"{url}/responses", json={"model": "gpt-4o", "stream": stream, "input": f"question {n}"}
        )

    return ask


def _compressed(client: httpx.Client, url: str, n: int) -> httpx.Response:
    messages = [{"role": "user", "content": "word " * 150_000 + str(n)}]  # over gpt-4o's window
    return client.post(f"{url}/chat/completions", json={"model": "gpt-4o", "messages": messages})


def _passthrough(client: httpx.Client, url: str, n: int) -> httpx.Response:
    return client.get(f"{url}/models")


def _refused(client: httpx.Client, url: str, n: int) -> httpx.Response:
    return client.post(f"{url}/chat/completions", json={"model": "gpt-4o", "messages": f"not a list {n}"})


ROUTES: dict[str, tuple[Ask, int]] = {
    "chat": (_chat(False), 200),
    "chat stream": (_chat(True), 200),
    "messages": (_messages(False), 200),
    "messages stream": (_messages(True), 200),
    "responses": (_responses(False), 200),
    "responses stream": (_responses(True), 200),
    "compressed": (_compressed, 200),
    "passthrough": (_passthrough, 200),
    "refused": (_refused, 400),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_finished_requests_leave_nothing_to_the_cyclic_collector(gateway_url: str, route: str) -> None:
    ask, status = ROUTES[route]
    with httpx.Client(timeout=60) as client:
        for n in range(4):  # pools, caches and first-use state settle
            assert ask(client, gateway_url, n).status_code == status
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable lands in gc.garbage
        try:
            for n in range(4, 14):
                assert ask(client, gateway_url, n).status_code == status
            gc.collect()
            left = Counter(type(thing).__qualname__ for thing in gc.garbage if _the_gateways(thing))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert left == Counter()


def _the_gateways(thing: object) -> bool:
    """Whether `thing` served a request of the gateway: the fake upstream and the test's client run
    in this process too, and what they leave is not under test."""
    if isinstance(thing, RequestResponseCycle):  # the fake upstream's too: only those with a record
        return "record" in thing.scope.get("state", {})
    return isinstance(thing, RequestRecord | aiohttp.ClientResponse | aiohttp.StreamReader)
