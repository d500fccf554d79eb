"""A fake summarizer: an OpenAI-style chat-completions endpoint that counts calls and can misbehave.

Its summary is an "ideal" one: every distinct token carrying a digit (the ids,
values and canaries the conversation states), in order of appearance, so a
test or the benchmark sees which facts crossed. Modes, set on the instance:

    ok        200 with that summary
    slow      the same after `delay` seconds (unless the caller hangs up first)
    fail      500 with OpenAI's server_error body
    refuse    200 whose message is a refusal (content null)
    garbage   200 whose body is not JSON
    long      200 with a summary far longer than any span (to be discarded)
    pieces    200 with the `ok` answer written in several pieces, `delay` seconds apart
    redirect  307 to `redirect_to` (a URL that keeps the method and the body)
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.serve import serve_in_thread
from tests.fakes.tokens import count_text

FACT = re.compile(r"[\w\-./]*\d[\w\-./]*")


@dataclass
class FakeSummarizer:
    mode: str = "ok"
    delay: float = 0.0
    calls: int = 0
    answered: int = 0  # calls that got their answer (a slow call counts only once it is over)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    usage: list[dict[str, int]] = field(default_factory=list)  # what each answer reported
    base_url: str = ""
    redirect_to: str = ""
    reported_usage: dict[str, int] | None = None  # reported instead of the true usage
    lock: threading.Lock = field(default_factory=threading.Lock)


def ideal_summary(messages: list[Any], max_tokens: int) -> str:
    """Every fact seen; when they exceed `max_tokens` (its own count), the newest that fit."""
    seen: dict[str, None] = {}
    for message in messages[1:-1]:  # not the instructions, not the closing request
        for token in FACT.findall(orjson.dumps(message.get("content")).decode()):
            seen.setdefault(token.strip("./-"), None)
    kept: list[str] = []
    used = count_text("Notes:")
    for fact in reversed(seen):
        used += count_text(" " + fact)
        if used > max_tokens:
            break
        kept.append(fact)
    return "Notes: " + " ".join(reversed(kept))


def usage(messages: list[Any], answer: str) -> dict[str, int]:
    """What it read and wrote, counted as its own tokenizer would (close to the real APIs' usage)."""
    read = sum(count_text(orjson.dumps(message.get("content")).decode()) + 4 for message in messages) + 3
    wrote = count_text(answer)
    return {"prompt_tokens": read, "completion_tokens": wrote, "total_tokens": read + wrote}


def create_app(fake: FakeSummarizer) -> Starlette:
    async def completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
            return JSONResponse({"error": {"message": "bad request", "type": "invalid_request_error"}}, 400)
        with fake.lock:
            fake.calls += 1
            fake.bodies.append(body)
        if fake.mode == "redirect":
            return Response(status_code=307, headers={"location": fake.redirect_to})
        if fake.mode == "slow" and not await answer_after(request, fake.delay):
            return Response(status_code=499)  # the caller gave up: nobody reads this
        with fake.lock:
            fake.answered += 1
        if fake.mode == "fail":
            error = {
                "message": "The server had an error.",
                "type": "server_error",
                "param": None,
                "code": None,
            }
            return JSONResponse({"error": error}, 500)
        if fake.mode == "garbage":
            return Response(b"<html>oops</html>", 200, media_type="application/json")
        text = ideal_summary(body["messages"], int(body.get("max_tokens") or 1024))
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if fake.mode == "refuse":
            message = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
        if fake.mode == "long":
            message["content"] = "word " * 50_000
        spent = usage(body["messages"], message["content"] or "")
        with fake.lock:
            fake.usage.append(spent)
        answer = {
            "id": f"chatcmpl-{fake.calls}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": fake.reported_usage or spent,
        }
        if fake.mode == "pieces":
            pieces = in_pieces(orjson.dumps(answer), fake.delay)
            return StreamingResponse(pieces, media_type="application/json")
        return JSONResponse(answer)

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


async def answer_after(request: Request, seconds: float) -> bool:
    """Wait `seconds`; False as soon as the caller has hung up. Like a real API, it stops then:
    a hanging call ends with the gateway's timeout, not at server shutdown."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while loop.time() < until:
        if await request.is_disconnected():
            return False
        await asyncio.sleep(min(0.05, max(0.0, until - loop.time())))
    return True


async def in_pieces(data: bytes, pause: float, pieces: int = 4) -> AsyncIterator[bytes]:
    # Each piece is its own write (a chunk on the wire): the reader sees the body arrive in parts.
    size = -(-len(data) // pieces)
    for start in range(0, len(data), size):
        if start:
            await asyncio.sleep(pause)
        yield data[start : start + size]


@contextmanager
def serve_summarizer() -> Iterator[FakeSummarizer]:
    fake = FakeSummarizer()
    with serve_in_thread(create_app(fake)) as url:
        fake.base_url = f"{url}/v1"
        yield fake
