"""This checkout's gateway against another checkout's, beside the aiohttp floor: proxy CPU per request.

    git worktree add --detach /tmp/baseline <commit>
    python bench/proxy_ab.py /tmp/baseline [--api chat|anthropic|responses] [--size large]
                             [--stream] [--tools N] [--concurrency 8] [--rounds 15] [--requests 600]

bench/proxy_overhead.py measures one checkout against the floors; a change's
gain is smaller than the difference between two of its runs on this noisy
machine (2 cores shared by client, upstream and proxies). Here both gateways
(`python -m gateway.cli serve`, each started in its own checkout) and the
floor run side by side: many short rounds, the targets in a rotating order
within each, and every figure the median over rounds of CPU time (utime +
stime) per request. Requests are bench/proxy_payloads.py's bodies (chat unless
`--api` says otherwise), each with a new latest message, so the count cache
behaves as in production.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

import aiohttp
import uvloop
from proxy_overhead import FLOOR_AIOHTTP, cpu_seconds, fire, rotated
from proxy_payloads import APIS, build
from servers import REPO, Server, bench_environment, gateway_environment, start, stop

BASELINE, THIS_CHECKOUT = "baseline", "this checkout"  # the gateways' names in `servers()`
SETTLE_SECONDS = 0.05  # the last responses' bookkeeping lands before CPU times are read
WARMUP_REQUESTS = 300


def servers(baseline: Path | None, logs: Path, log_level: str = "warning") -> dict[str, Server]:
    """The fake upstream, the aiohttp floor, `baseline`'s gateway (if any) and this checkout's,
    the gateways logging at `log_level`."""
    env = bench_environment()
    running: dict[str, Server] = {}
    try:
        upstream = start(
            "upstream",
            ["-m", "tests.fakes.upstream", "--chunk-delay", "0"],
            health="/v1/models",
            env=env,
            logs=logs,
        )
        running["upstream"] = upstream
        floor = [
            str(REPO / "bench" / "proxy_floors.py"),
            "--client",
            "aiohttp",
            "--upstream",
            upstream.origin,
        ]
        running[FLOOR_AIOHTTP] = start(FLOOR_AIOHTTP, floor, health="/healthz", env=env, logs=logs)
        gateway_env = {**gateway_environment(upstream), "GATEWAY_SERVER_LOG_LEVEL": log_level}
        serve = ["-m", "gateway.cli", "serve"]
        if baseline is not None:
            running[BASELINE] = start(
                BASELINE, serve, health="/healthz", env=gateway_env, logs=logs, cwd=baseline
            )
        running[THIS_CHECKOUT] = start(THIS_CHECKOUT, serve, health="/healthz", env=gateway_env, logs=logs)
    except BaseException:
        for server in running.values():
            stop(server)
        raise
    return running


async def measure(running: dict[str, Server], args: argparse.Namespace) -> dict[str, list[float]]:
    payload = build(args.size, args.stream, args.api, args.tools)
    targets = (FLOOR_AIOHTTP, BASELINE, THIS_CHECKOUT)
    per_round: dict[str, list[float]] = {target: [] for target in targets}
    nonce = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for target in targets:
            url = running[target].origin + payload.path
            await fire(
                session, url, payload, first_nonce=nonce, count=WARMUP_REQUESTS, concurrency=args.concurrency
            )
            nonce += WARMUP_REQUESTS
        for round_number in range(args.rounds):
            for target in rotated(targets, round_number):
                server = running[target]
                before = cpu_seconds(server.process.pid)
                await fire(
                    session,
                    server.origin + payload.path,
                    payload,
                    first_nonce=nonce,
                    count=args.requests,
                    concurrency=args.concurrency,
                )
                nonce += args.requests
                await asyncio.sleep(SETTLE_SECONDS)
                per_round[target].append((cpu_seconds(server.process.pid) - before) / args.requests)
            print(f"  round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    return per_round


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("baseline", type=Path, help="another checkout of this project (e.g. a git worktree)")
    parser.add_argument("--api", choices=APIS, default="chat", help="which API's bodies to send")
    parser.add_argument("--size", choices=("small", "large"), default="large")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--tools", type=int, default=0, help="more tool definitions of ~1 KB each")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--requests", type=int, default=600, help="requests per target per round")
    args = parser.parse_args()
    if not (args.baseline / "gateway" / "cli.py").is_file():
        parser.error(f"{args.baseline} is not a checkout of this project")
    with tempfile.TemporaryDirectory() as logs:
        running = servers(args.baseline.resolve(), Path(logs))
        try:
            per_round = uvloop.run(measure(running, args))
        finally:
            for server in running.values():
                stop(server)
    floor = statistics.median(per_round[FLOOR_AIOHTTP])
    print(
        f"{args.api} {args.size}, stream={'yes' if args.stream else 'no'}, {args.tools} more tools, "
        f"concurrency {args.concurrency}: "
        f"median of {args.rounds} rounds of {args.requests} requests per target"
    )
    print(f"{'target':<14} {'CPU/req ms':>10} {'× floor':>8}")
    for target, values in per_round.items():
        median = statistics.median(values)
        print(f"{target:<14} {1000 * median:10.3f} {median / floor:7.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
