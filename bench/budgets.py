"""Team token budgets across two gateway replicas on one Redis, and what the policy check costs.

    python bench/budgets.py [--redis-url redis://127.0.0.1:6379/14] [--requests 300] [--quick]

Processes on 127.0.0.1: the fake upstream (exact token counts, window 128k), two gateway
replicas with one team on one Redis, and a third gateway without teams (the baseline).

1. Budget: N requests from one team, 32 in flight, spread over both replicas, against a
   tokens-per-minute limit that admits only part of them. Each request reserves its exact
   prompt + max_tokens; its answer settles the reservation to the upstream's usage. Reported:
   requests admitted and refused (429), tokens admitted (the usage of the admitted requests:
   what the team was charged), and what GCRA allows over the run's duration (the limit, plus
   what flows back at limit/60 per second). Goal: admitted never above allowed by more than
   the output allowance of the requests in flight.
2. Latency: the same small request one at a time, alternating between a team replica (limits
   far above the load) and the baseline gateway; p50/p99 seen by the client and the
   difference. Goal: <= 1 ms added at p50 on loopback Redis.

The machine is small and shared: quote medians and the ratio measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from servers import Server, bench_environment, gateway_environment, start, stop

from gateway.policy.keys import hash_key

CHAT = "/v1/chat/completions"
KEY = "cgw-bench-" + uuid.uuid4().hex
MAX_TOKENS = 200
CONCURRENCY = 32
REQUEST_TIMEOUT = 60.0


@dataclass
class BudgetResult:
    admitted: int = 0
    refused: int = 0
    used: int = 0
    seconds: float = 0.0
    # Checks that fell back to per-replica memory (Redis slower than policy.store_timeout).
    fallbacks: int = 0


def body(nonce: int) -> bytes:
    question = f"Request {nonce}: summarise the quarterly ledger for the audit committee in two lines."
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": question}]
    return json.dumps({"model": "gpt-4o", "messages": messages, "max_tokens": MAX_TOKENS}).encode()


@contextlib.contextmanager
def servers(redis_url: str, team: str, limit: int, logs: Path) -> Iterator[dict[str, Server]]:
    env = bench_environment()
    running: dict[str, Server] = {}
    try:
        upstream = start(
            "upstream",
            ["-m", "tests.fakes.upstream", "--chunk-delay", "0", "--window", "128000"],
            health="/v1/models",
            env=env,
            logs=logs,
        )
        running["upstream"] = upstream
        base = gateway_environment(upstream)
        teams = {
            team: {"keys": [hash_key(KEY)], "limits": {"tokens_per_minute": limit}},
            team + "-fast": {"keys": [hash_key(KEY + "-fast")], "limits": {"tokens_per_minute": 10**11}},
        }
        with_teams = {**base, "GATEWAY_TEAMS": json.dumps(teams), "GATEWAY_REDIS_URL": redis_url}
        for name in ("replica a", "replica b"):
            running[name] = start(
                name, ["-m", "gateway.cli", "serve"], health="/healthz", env=with_teams, logs=logs
            )
        running["no teams"] = start(
            "no teams", ["-m", "gateway.cli", "serve"], health="/healthz", env=base, logs=logs
        )
        yield running
    finally:
        for server in running.values():
            stop(server)


async def budget_run(
    session: aiohttp.ClientSession, replicas: Sequence[Server], requests: int
) -> BudgetResult:
    result = BudgetResult()
    pending = iter(range(requests))
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}

    async def worker() -> None:
        for nonce in pending:
            url = replicas[nonce % len(replicas)].origin + CHAT
            async with session.post(url, data=body(nonce), headers=headers) as reply:
                content = await reply.read()
            if reply.status == 429:
                result.refused += 1
                continue
            if reply.status != 200:
                raise RuntimeError(f"{url} answered {reply.status}: {content[:300]!r}")
            usage = json.loads(content)["usage"]
            result.admitted += 1
            result.used += usage["prompt_tokens"] + usage["completion_tokens"]

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    result.seconds = time.perf_counter() - started
    return result


async def latency_run(
    session: aiohttp.ClientSession, team: Server, plain: Server, rounds: int
) -> dict[str, list[float]]:
    latencies: dict[str, list[float]] = {"teams (Redis)": [], "no teams": []}
    targets = (("teams (Redis)", team, f"Bearer {KEY}-fast"), ("no teams", plain, "Bearer sk-bench"))
    for nonce in range(rounds):
        # Alternate which goes first, so neither always follows the other.
        for name, server, key in targets if nonce % 2 else targets[::-1]:
            headers = {"content-type": "application/json", "authorization": key}
            began = time.perf_counter()
            async with session.post(server.origin + CHAT, data=body(10**6 + nonce), headers=headers) as reply:
                await reply.read()
            latencies[name].append(time.perf_counter() - began)
            if reply.status != 200:
                raise RuntimeError(f"{name} answered {reply.status}")
    return latencies


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--latency-rounds", type=int, default=600)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    args = parser.parse_args()
    requests, rounds = (60, 100) if args.quick else (args.requests, args.latency_rounds)
    team = "bench" + uuid.uuid4().hex[:8]
    # About a third of the requests' usage (~50 tokens each) fits the limit.
    limit = requests * 50 // 3

    async def run(running: dict[str, Server]) -> tuple[BudgetResult, dict[str, list[float]]]:
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY * 2)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            # Warm both paths (connections, encodings) before measuring.
            await latency_run(session, running["replica a"], running["no teams"], 20)
            replicas = [running["replica a"], running["replica b"]]
            budget = await budget_run(session, replicas, requests)
            for replica in replicas:
                async with session.get(replica.origin + "/metrics") as reply:
                    for line in (await reply.text()).splitlines():
                        if line.startswith("gateway_policy_fallbacks_total "):
                            budget.fallbacks += int(float(line.split()[1]))
            latency = await latency_run(session, running["replica a"], running["no teams"], rounds)
        return budget, latency

    with tempfile.TemporaryDirectory() as logs, servers(args.redis_url, team, limit, Path(logs)) as running:
        budget, latency = asyncio.run(run(running))

    allowed = limit + limit * budget.seconds / 60
    print(
        f"## Budget: 2 replicas, one Redis, {requests} requests, {CONCURRENCY} in flight, limit {limit} TPM"
    )
    print()
    print(
        "| admitted | 429 | tokens admitted (usage) | GCRA allows over the run | over by "
        "| output allowance of 32 in flight |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {budget.admitted} | {budget.refused} | {budget.used} | {allowed:.0f} ({budget.seconds:.2f} s) "
        f"| {max(0, budget.used - allowed):.0f} | {CONCURRENCY * MAX_TOKENS} |"
    )
    print(
        f"\nchecks that fell back to per-replica memory (Redis over policy.store_timeout): {budget.fallbacks}"
    )
    print()
    print(f"## Added latency of the policy check: {rounds} small requests each, one at a time, interleaved")
    print()
    print("| gateway | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    for name, values in latency.items():
        print(f"| {name} | {percentile(values, 0.5) * 1000:.2f} | {percentile(values, 0.99) * 1000:.2f} |")
    with_teams, without = latency["teams (Redis)"], latency["no teams"]
    added = (statistics.median(with_teams) - statistics.median(without)) * 1000
    added_p99 = (percentile(with_teams, 0.99) - percentile(without, 0.99)) * 1000
    ratio = statistics.median(with_teams) / statistics.median(without)
    print()
    print(f"added at p50: {added:+.2f} ms (ratio {ratio:.2f}x); at p99: {added_p99:+.2f} ms")
    return 0 if budget.used <= allowed + CONCURRENCY * MAX_TOKENS else 1


if __name__ == "__main__":
    sys.exit(main())
