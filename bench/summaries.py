"""The LLM summarizer on a growing conversation: calls, cache hits, hop latency, prefix stability.

    python -m bench.summaries [--turns 100] [--window 16000] [--delay 0.5]

A conversation grows turn by turn (bench/conversations.py `growing`, with the
user-stated facts of `stated` planted in it); each request goes through the
gateway's real planning (gateway/planning.py `plan_request`, with its
summarizer hook and an in-memory store) against the fake summarizer of
tests/fakes/summarizer.py on a real HTTP port. The fake is "ideal": it
carries every fact it sees (every token with a digit), and answers after
`--delay` seconds.

Background mode (the default): a request never waits; the summary a request
schedules is awaited before the next request, as if the user took longer to
answer than the summarizer. Inline mode: each request waits for its span's
summary. Printed per mode: summarizer calls over the run, cache hits, requests
with a summary / the digest, the gateway's planning time per request (median)
when the summary was cached vs when it was not, the share of each prompt that
is an identical prefix of the next (tokens), and the planted facts the last
request still carries.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from typing import Any

import orjson
from prometheus_client import REGISTRY
from starlette.datastructures import Headers

import gateway  # noqa: F401  (offline tiktoken)
from bench.conversations import Stated, stated
from bench.quality import prefix_share
from gateway.chat_request import parse_chat_request
from gateway.planning import plan_request
from gateway.runtime import Runtime
from gateway.settings import load_settings
from gateway.tokens.counter import counter_for
from tests.fakes.summarizer import serve_summarizer

MODEL = "gpt-4o"
COUNTER = counter_for(MODEL)


def requests(conversation: Stated) -> list[list[dict[str, Any]]]:
    """Each prefix of the conversation that ends on a user message: the requests a chat app sends."""
    messages = conversation.messages
    return [messages[: i + 1] for i, m in enumerate(messages) if m["role"] == "user" and i > 2]


def cache_hits() -> float:
    return REGISTRY.get_sample_value("gateway_summaries_total", {"outcome": "cache_hit"}) or 0.0


async def run(mode: str, window: int, delay: float, conversation: Stated) -> dict[str, Any]:
    with serve_summarizer() as fake:
        fake.mode, fake.delay = "slow", delay
        environ = {"GATEWAY_MODELS": json.dumps({MODEL: {"context_window": window}})}
        if mode != "digest only":
            environ["GATEWAY_COMPRESSION_SUMMARIZER_MODEL"] = "summarizer-mini"
            environ["GATEWAY_COMPRESSION_SUMMARIZER_BASE_URL"] = fake.base_url
            environ["GATEWAY_COMPRESSION_SUMMARIZER_MODE"] = mode
        settings = load_settings(None, environ)
        runtime = Runtime.create(settings)
        hits_before = cache_hits()
        timings: dict[str, list[float]] = {"cached": [], "made": [], "digest": [], "none": []}
        sent: list[list[Any]] = []
        try:
            for messages in requests(conversation):
                raw = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 500})
                chat = parse_chat_request(raw, Headers())
                calls = fake.calls
                started = time.perf_counter()
                plan = await plan_request(runtime, chat)
                elapsed = time.perf_counter() - started
                await plan.settle()
                kind = "digest" if "digest" in plan.stages else "none"
                if "summary" in plan.stages:
                    kind = "made" if fake.calls > calls else "cached"
                timings[kind].append(elapsed)
                sent.append(orjson.loads(plan.body)["messages"])
                # The user takes a while to answer: background work finishes in between.
                await asyncio.gather(*runtime._background, return_exceptions=True)
        finally:
            await runtime.close()
        shares = [prefix_share(a, b) for a, b in itertools.pairwise(sent)]
        last = orjson.dumps(sent[-1]).decode()
        return {
            "requests": len(sent),
            "calls": fake.calls,
            "hits": cache_hits() - hits_before,
            "summary": len(timings["cached"]) + len(timings["made"]),
            "digest": len(timings["digest"]),
            **{f"{kind}_ms": 1000 * statistics.median(t) if t else 0.0 for kind, t in timings.items()},
            "prefix": statistics.fmean(shares),
            "facts": sum(code in last for code in conversation.kept.values()),
            "of": len(conversation.kept),
            "stale": conversation.stale in last and conversation.kept["corrected"] not in last,
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--window", type=int, default=16_000, help="the model's context window")
    parser.add_argument("--delay", type=float, default=0.5, help="the fake summarizer's answer time (s)")
    args = parser.parse_args()
    conversation = stated("support", 0, turns=args.turns)
    size = COUNTER.messages(conversation.messages)
    print(f"{args.turns}-turn conversation growing to {size:,} tokens, window {args.window:,}\n")
    header = (
        f"{'mode':<11} {'requests':>8} {'calls':>5} {'hits':>5} {'summary':>7} {'digest':>6} "
        f"{'ms cached':>9} {'ms digest':>9} {'ms made':>7} {'ms none':>7} {'prefix':>6} "
        f"{'facts':>6} {'stale':>5}"
    )
    print(header)
    print("-" * len(header))
    for mode in ("digest only", "background", "inline"):
        r = asyncio.run(run(mode, args.window, args.delay, conversation))
        print(
            f"{mode:<11} {r['requests']:8d} {r['calls']:5d} {r['hits']:5.0f} {r['summary']:7d} "
            f"{r['digest']:6d} {r['cached_ms']:9.1f} {r['digest_ms']:9.1f} {r['made_ms']:7.1f} "
            f"{r['none_ms']:7.1f} {r['prefix']:6.3f} {r['facts']:>3}/{r['of']:<2} "
            f"{'yes' if r['stale'] else 'no':>5}",
            flush=True,
        )
    print(
        "\nMedian planning time (count, fit, summaries) of the requests that used a stored summary"
        "\n(cached), the digest (digest), a summary made while they waited (made, inline only), or"
        "\nthat dropped nothing (none)."
    )


if __name__ == "__main__":
    main()
