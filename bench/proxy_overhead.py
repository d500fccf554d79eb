"""What the gateway costs on its fast path, next to the cheapest proxies that could stand in its place.

    python bench/proxy_overhead.py [--quick]

Targets, each its own process on 127.0.0.1 (uvicorn, uvloop, httptools, one worker):

- direct: the fake upstream (tests/fakes/upstream.py) with no proxy in front;
- floor httpx / floor aiohttp: bench/proxy_floors.py, a bare starlette passthrough
  over one shared httpx.AsyncClient or aiohttp.ClientSession;
- gateway: `python -m gateway.cli serve`, no config file, model gpt-4o (128k window,
  so it counts and decides), requests that fit (no compression).

Matrix: small (~200 tokens) and large (~30k tokens, an agent conversation with
tool calls) chat requests, non-streaming and streaming, at concurrency 1, 8 and
32; then the same two conversations as Anthropic Messages (`POST /v1/messages`,
model claude-sonnet-4-5) and Responses (`POST /v1/responses`) bodies, at
concurrency 1 and 8, each on the gateway's fast path against the same floors.
Per cell: latency p50/p99 seen by the client (whole body read) and the
proxy process's CPU time (utime+stime from /proc, all threads) per request.

Throughput: the same bodies at concurrency 64 against the aiohttp floor, the gateway
with one worker and `serve --workers 2` (requests/s, and CPU per request of the
whole process tree: supervisor and workers).

The machine is small and noisy (2 cores shared by client, upstream and proxy),
so: every target is warmed up first; the whole matrix runs in rounds; within a
row group the targets take turns in interleaved slices, in a rotating order;
each figure is the median of the per-round figures. Ratios between targets
measured side by side are the result, not absolute milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop
from proxy_payloads import APIS, Payload, build
from servers import REPO, Server, bench_environment, gateway_environment, start, stop

BENCH = REPO / "bench"

DIRECT, FLOOR_HTTPX, FLOOR_AIOHTTP, GATEWAY = "direct", "floor httpx", "floor aiohttp", "gateway"
GATEWAY_2 = "gateway w2"  # serve --workers 2
THROUGHPUT_TARGETS = (FLOOR_AIOHTTP, GATEWAY, GATEWAY_2)
THROUGHPUT_CONCURRENCY = 64
TARGETS = (DIRECT, FLOOR_HTTPX, FLOOR_AIOHTTP, GATEWAY)
PROXIES = (FLOOR_HTTPX, FLOOR_AIOHTTP, GATEWAY)
FLOORS = (FLOOR_HTTPX, FLOOR_AIOHTTP)
SIZES = ("small", "large")
CONCURRENCIES = (1, 8, 32)
GOAL_CPU_RATIO = 1.2  # the goal: gateway CPU per request ≤ 1.2× the best floor's

NATIVE_CONCURRENCIES = (1, 8)

Group = tuple[str, str, bool, int]  # api, size, stream, concurrency: the rows compared with each other
GROUPS: tuple[Group, ...] = tuple(
    ("chat", s, st, c) for s in SIZES for st in (False, True) for c in CONCURRENCIES
) + tuple(
    (api, s, st, c) for api in APIS[1:] for s in SIZES for st in (False, True) for c in NATIVE_CONCURRENCIES
)
Cell = tuple[Group, str]  # a group and a target

# Bounds, so that a hung target stops the run instead of stalling it.
REQUEST_TIMEOUT = 30.0
BATCH_TIMEOUT = 120.0
# Let the last responses' bookkeeping land before reading CPU times.
SETTLE_SECONDS = 0.05
# Each row group's requests per target run as this many interleaved slices.
SLICES = 3
# Warm-up and measured requests use disjoint nonces, so no measured body was seen before.
WARMUP_NONCE_BASE = 90_000_000
THROUGHPUT_NONCE_BASE = 50_000_000
THROUGHPUT_GROUPS = (("small", False), ("small", True), ("large", False), ("large", True))
CELL_NONCE_STRIDE = 10_000


@dataclass(frozen=True)
class Plan:
    rounds: int
    requests: dict[str, int]
    """Measured requests per cell and round, by size: /proc CPU times tick every 10 ms, so
    enough for ≥ ~25 ticks per proxy cell. A multiple of SLICES."""
    warmup: dict[str, int]


FULL = Plan(rounds=3, requests={"small": 600, "large": 300}, warmup={"small": 50, "large": 20})
QUICK = Plan(rounds=2, requests={"small": 180, "large": 60}, warmup={"small": 20, "large": 8})
# Requests per throughput cell: several seconds of load each, so start and end effects are small.
THROUGHPUT_FACTOR = 2


# --- processes ---------------------------------------------------------------------------------


@contextlib.contextmanager
def servers(logs: Path) -> Iterator[dict[str, Server]]:
    """Upstream, floors and gateway, started one at a time so each time-to-ready is its own."""
    env = bench_environment()
    running: dict[str, Server] = {}
    try:
        upstream = start(
            DIRECT,
            ["-m", "tests.fakes.upstream", "--chunk-delay", "0"],
            health="/v1/models",
            env=env,
            logs=logs,
        )
        running[DIRECT] = upstream
        for name, client in ((FLOOR_HTTPX, "httpx"), (FLOOR_AIOHTTP, "aiohttp")):
            argv = [str(BENCH / "proxy_floors.py"), "--client", client, "--upstream", upstream.origin]
            running[name] = start(name, argv, health="/healthz", env=env, logs=logs)
        gateway_env = gateway_environment(upstream)
        running[GATEWAY] = start(
            GATEWAY, ["-m", "gateway.cli", "serve"], health="/healthz", env=gateway_env, logs=logs
        )
        running[GATEWAY_2] = start(
            GATEWAY_2,
            ["-m", "gateway.cli", "serve", "--workers", "2"],
            health="/healthz",
            env=gateway_env,
            logs=logs,
        )
        yield running
    finally:
        for server in running.values():
            stop(server)


def _stat(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()  # the command name may contain spaces


def process_tree(pid: int) -> list[int]:
    """The process and its live children (the workers of `serve --workers N`)."""
    tree = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError):  # gone meanwhile
                if int(_stat(int(entry.name))[1]) == pid:
                    tree.append(int(entry.name))
    return tree


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process tree (every thread, live or exited)."""
    ticks = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            fields = _stat(member)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """Resident memory of the process tree."""
    total = 0
    for member in process_tree(pid):
        for line in Path(f"/proc/{member}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


# --- load --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    p50: float
    p99: float
    cpu: float | None
    """Proxy CPU seconds per request; None for the direct target."""


def percentile(sorted_values: Sequence[float], share: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(share * len(sorted_values)))]


async def fire(
    session: aiohttp.ClientSession,
    url: str,
    payload: Payload,
    *,
    first_nonce: int,
    count: int,
    concurrency: int,
) -> list[float]:
    """`count` requests, `concurrency` in flight; each latency covers the whole body."""
    latencies: list[float] = []
    remaining = iter(range(first_nonce, first_nonce + count))
    headers = payload.headers

    async def worker() -> None:
        for nonce in remaining:
            body = payload.body(nonce)
            started = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as reply:
                content = await reply.read()
            latencies.append(time.perf_counter() - started)
            if reply.status != 200 or (payload.stream and payload.stream_end not in content[-8192:]):
                raise RuntimeError(f"{url} answered {reply.status}: {content[:300]!r}")

    async with asyncio.timeout(BATCH_TIMEOUT):
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def check_fast_path(session: aiohttp.ClientSession, gateway: Server, payload: Payload) -> int:
    """The gateway counted the prompt and forwarded it untouched; returns its token count."""
    body = payload.body(WARMUP_NONCE_BASE - 1)
    async with session.post(gateway.origin + payload.path, data=body, headers=payload.headers) as reply:
        await reply.read()
        compression = reply.headers.get("x-gateway-compression")
        before = reply.headers.get("x-gateway-prompt-tokens-before", "")
    if reply.status != 200 or compression != "none" or not before.isdigit():
        raise RuntimeError(f"gateway is not on its fast path: {reply.status}, compression={compression!r}")
    return int(before)


def rotated(targets: tuple[str, ...], shift: int) -> tuple[str, ...]:
    """Who goes first moves round by round, so no target always runs right after the same neighbour."""
    shift %= len(targets)
    return targets[shift:] + targets[:shift]


async def row_group(
    session: aiohttp.ClientSession,
    running: dict[str, Server],
    payload: Payload,
    *,
    first_nonce: int,
    count: int,
    concurrency: int,
    rotation: int,
) -> dict[str, Sample]:
    """Every target on the same bodies, in interleaved slices so that a burst of noise from
    elsewhere on the machine lands on all of them rather than on one.

    Each proxy's CPU time is read before its first slice and after its last: an idle proxy
    costs ~1 ms of CPU a second, so the others' slices in between barely register.
    """
    cpu_before = {name: cpu_seconds(server.process.pid) for name, server in running.items()}
    latencies: dict[str, list[float]] = {name: [] for name in TARGETS}
    per_slice = count // SLICES
    for index in range(SLICES):
        for name in rotated(TARGETS, rotation + index):
            latencies[name] += await fire(
                session,
                running[name].origin + payload.path,
                payload,
                first_nonce=first_nonce + index * per_slice,
                count=per_slice,
                concurrency=concurrency,
            )
    await asyncio.sleep(SETTLE_SECONDS)
    samples: dict[str, Sample] = {}
    for name, measured in latencies.items():
        cpu = (cpu_seconds(running[name].process.pid) - cpu_before[name]) / len(measured)
        measured.sort()
        samples[name] = Sample(
            percentile(measured, 0.5), percentile(measured, 0.99), None if name == DIRECT else cpu
        )
    return samples


async def measure(
    running: dict[str, Server], plan: Plan
) -> tuple[dict[Cell, list[Sample]], dict[tuple[str, str], int]]:
    """Every cell of the matrix, once per round; also the gateway's prompt counts of both sizes."""
    payloads = {
        (api, size, stream): build(size, stream, api)
        for api in APIS
        for size in SIZES
        for stream in (False, True)
    }
    samples: dict[Cell, list[Sample]] = {}
    # Idle connections are dropped before uvicorn's 5 s keep-alive closes them: reusing one the
    # server is closing fails the request (a race, not the target's fault).
    connector = aiohttp.TCPConnector(
        limit=2 * THROUGHPUT_CONCURRENCY, limit_per_host=0, keepalive_timeout=4.0
    )
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tokens = {
            (api, size): await check_fast_path(session, running[GATEWAY], payloads[api, size, False])
            for api in APIS
            for size in SIZES
        }
        for name in TARGETS:
            for (_, size, _), payload in payloads.items():
                await fire(
                    session,
                    running[name].origin + payload.path,
                    payload,
                    first_nonce=WARMUP_NONCE_BASE,
                    count=plan.warmup[size],
                    concurrency=8,
                )
        for round_index in range(plan.rounds):
            for group_index, group in enumerate(GROUPS):
                api, size, stream, concurrency = group
                measured = await row_group(
                    session,
                    running,
                    payloads[api, size, stream],
                    # The same bodies for every target of the group, new ones for each group and round.
                    first_nonce=(round_index * len(GROUPS) + group_index) * CELL_NONCE_STRIDE,
                    count=plan.requests[size],
                    concurrency=concurrency,
                    # Rotate who goes first, so no target always runs right after the same neighbour.
                    rotation=round_index + group_index,
                )
                for name, sample in measured.items():
                    samples.setdefault((group, name), []).append(sample)
            print(f"  round {round_index + 1}/{plan.rounds} done", file=sys.stderr, flush=True)
    return samples, tokens


Throughput = tuple[float, float]  # requests/s, CPU seconds per request


async def throughput(
    running: dict[str, Server], plan: Plan
) -> dict[tuple[str, bool], dict[str, list[Throughput]]]:
    """Each payload at concurrency 64 against the floor and both gateways, in rotating order."""
    results: dict[tuple[str, bool], dict[str, list[Throughput]]] = {}
    connector = aiohttp.TCPConnector(
        limit=2 * THROUGHPUT_CONCURRENCY, limit_per_host=0, keepalive_timeout=4.0
    )
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for name in (GATEWAY_2,):  # the others were warmed up by the matrix
            for size in SIZES:
                for stream in (False, True):
                    await fire(
                        session,
                        running[name].origin + build(size, stream).path,
                        build(size, stream),
                        first_nonce=WARMUP_NONCE_BASE,
                        count=plan.warmup[size] * 2,
                        concurrency=THROUGHPUT_CONCURRENCY,
                    )
        for round_index in range(plan.rounds):
            for group_index, (size, stream) in enumerate(THROUGHPUT_GROUPS):
                payload = build(size, stream)
                count = plan.requests[size] * THROUGHPUT_FACTOR
                for name in rotated(THROUGHPUT_TARGETS, round_index + group_index):
                    pid = running[name].process.pid
                    cpu_before, started = cpu_seconds(pid), time.perf_counter()
                    await fire(
                        session,
                        running[name].origin + payload.path,
                        payload,
                        first_nonce=THROUGHPUT_NONCE_BASE + round_index * CELL_NONCE_STRIDE,
                        count=count,
                        concurrency=THROUGHPUT_CONCURRENCY,
                    )
                    elapsed = time.perf_counter() - started
                    await asyncio.sleep(SETTLE_SECONDS)
                    cell = results.setdefault((size, stream), {}).setdefault(name, [])
                    cell.append((count / elapsed, (cpu_seconds(pid) - cpu_before) / count))
            print(f"  throughput round {round_index + 1}/{plan.rounds} done", file=sys.stderr, flush=True)
    return results


# --- report ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One target in one row group: medians over rounds, in milliseconds."""

    p50: float
    p99: float
    cpu: float | None


def summarize(runs: list[Sample]) -> Row:
    cpus = [run.cpu for run in runs if run.cpu is not None]
    return Row(
        statistics.median(run.p50 for run in runs) * 1000,
        statistics.median(run.p99 for run in runs) * 1000,
        statistics.median(cpus) * 1000 if cpus else None,
    )


def report(
    samples: dict[Cell, list[Sample]],
    running: dict[str, Server],
    plan: Plan,
    tokens: dict[tuple[str, str], int],
) -> None:
    sizes = "; ".join(
        f"{api} {size}: {tokens[api, size]} prompt tokens, {build(size, False, api).length} bytes"
        for api in APIS
        for size in SIZES
    )
    print()
    print(
        f"Proxy overhead: medians of {plan.rounds} rounds; {plan.requests['small']} small / "
        f"{plan.requests['large']} large requests per cell; models gpt-4o (chat, responses) and "
        "claude-sonnet-4-5 (anthropic), fast path (no compression)."
    )
    print(f"  {sizes} (tokens as counted by the gateway).")
    print(
        f"Goal (issue): gateway CPU per request ≤ {GOAL_CPU_RATIO}× the best floor's "
        "(the lower of the two floors in the same row group)."
    )
    print("+p50: p50 added vs direct. ×best: gateway ÷ best floor on that column (h httpx, a aiohttp).")
    header = (
        f"{'api':<10}{'size':<6}{'stream':<7}{'conc':>4}  {'target':<14}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'+p50 ms':>9}"
        f"{'CPU/req ms':>11}{'+p50 ×best':>12}{'CPU ×best':>11}  goal"
    )
    print(header)
    print("-" * len(header))
    met = 0
    for api, size, stream, concurrency in GROUPS:
        rows = {name: summarize(samples[(api, size, stream, concurrency), name]) for name in TARGETS}
        added = {name: rows[name].p50 - rows[DIRECT].p50 for name in TARGETS}
        cpu = {name: row.cpu for name, row in rows.items() if row.cpu is not None}
        best_latency = min(FLOORS, key=added.__getitem__)
        best_cpu = min(FLOORS, key=cpu.__getitem__)
        for name in TARGETS:
            row = rows[name]
            lead = (
                f"{api:<10}{size:<6}{'yes' if stream else 'no':<7}{concurrency:>4}" if name == DIRECT else ""
            )
            line = (
                f"{lead:<27}  {name:<14}{row.p50:>8.2f}{row.p99:>8.2f}"
                f"{'—' if name == DIRECT else f'{added[name]:+.2f}':>9}"
                f"{f'{cpu[name]:.2f}' if name in cpu else '—':>11}"
            )
            if name == GATEWAY:
                cpu_ratio = ratio(cpu[GATEWAY], cpu[best_cpu])
                ok = cpu_ratio is not None and cpu_ratio <= GOAL_CPU_RATIO
                met += ok
                line += (
                    f"{times(ratio(added[GATEWAY], added[best_latency]), best_latency):>12}"
                    f"{times(cpu_ratio, best_cpu):>11}  {'met' if ok else 'MISSED'}"
                )
            print(line)
        print()
    print(f"Goal met in {met}/{len(GROUPS)} row groups.")
    print(
        "Resident memory after the run: "
        + ", ".join(f"{name} {rss_mb(running[name].process.pid):.0f} MB" for name in (*PROXIES, GATEWAY_2))
    )
    print(
        "Time to ready (spawn → health 200, each started alone): "
        + ", ".join(f"{name} {running[name].ready_seconds:.2f} s" for name in (*PROXIES, GATEWAY_2))
    )


def report_throughput(results: dict[tuple[str, bool], dict[str, list[Throughput]]], plan: Plan) -> None:
    print()
    print(
        f"Throughput at concurrency {THROUGHPUT_CONCURRENCY}: medians of {plan.rounds} rounds; "
        f"{plan.requests['small'] * THROUGHPUT_FACTOR} small / {plan.requests['large'] * THROUGHPUT_FACTOR} "
        "large requests per cell. CPU per request of the whole process tree (supervisor + workers)."
    )
    print(f"The client shares the machine's {os.cpu_count()} CPUs with the servers: req/s is bounded by it.")
    header = f"{'size':<6}{'stream':<7}  {'target':<14}{'req/s':>9}{'CPU/req ms':>12}{'CPU ×aiohttp':>14}"
    print(header)
    print("-" * len(header))
    for size, stream in THROUGHPUT_GROUPS:
        cells = results[size, stream]
        medians = {
            name: (statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs) * 1000)
            for name, runs in cells.items()
        }
        floor_cpu = medians[FLOOR_AIOHTTP][1]
        for index, name in enumerate(THROUGHPUT_TARGETS):
            rate, cpu = medians[name]
            lead = f"{size:<6}{'yes' if stream else 'no':<7}" if index == 0 else ""
            print(f"{lead:<13}  {name:<14}{rate:>9.0f}{cpu:>12.2f}{cpu / floor_cpu:>13.2f}×")
        print()


def ratio(value: float, best: float) -> float | None:
    # A floor's added latency can be lost in noise (≈ 0 or below): no ratio to it means anything.
    return value / best if best > 0.05 else None


def times(value: float | None, floor: str) -> str:
    return "n/a" if value is None else f"{value:.2f}× {floor.split()[-1][0]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and requests (~1 min)")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    # SIGTERM would otherwise end the bench without its cleanup; as an exception, `finally` runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="proxy-overhead-") as logs, servers(Path(logs)) as running:
        print("servers ready; warming up and measuring …", file=sys.stderr, flush=True)
        try:
            samples, tokens = uvloop.run(measure(running, plan))
            rates = uvloop.run(throughput(running, plan))
        except RuntimeError:
            # A target answered an error: its log (gone with the temporary folder) says why.
            for server in running.values():
                print(f"--- {server.name} ({server.origin}), end of its log:", file=sys.stderr)
                print(server.log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        report(samples, running, plan, tokens)
        report_throughput(rates, plan)
    print(f"(run took {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
