"""Proxy CPU per request with wrk as the client: the gateway beside the aiohttp floor.

    python bench/proxy_wrk.py [--baseline DIR] [--api A ...] [--size S ...] [--concurrency 8 64]
                              [--same-body] [--seconds 3] [--rounds 5] [--log-level warning|info]
                              [--parts]

bench/proxy_overhead.py drives the targets from a Python (aiohttp) client, which
takes a core's worth of CPU on this 2-core machine. wrk (Debian's `wrk`
package; required here, not by the tests) is a C client that costs the
machine far less per request, so the proxies run closer to saturation, as under
production load. Each target (the aiohttp floor of bench/proxy_floors.py, this
checkout's gateway, and with `--baseline` another checkout's) gets `--seconds`
of wrk load per cell; the targets take turns in a rotating order over
`--rounds`; each figure is the median over rounds of the process's CPU time
(utime + stime) divided by the requests wrk completed. A gateway's ratio to the
floor is the median over rounds of its round's figure over the floor's in the
same round, with their range beside it: this shared machine's speed drifts by
a third over minutes (the floor alone read 0.47 and 0.76 ms on one cell in two
runs), and a ratio of figures measured seconds apart cancels the drift that a
ratio of two medians keeps.

`--parts` adds two targets made of this checkout's gateway with work taken out
(bench/gateway_parts.py): `relay` (its server, middleware and upstream client, nothing parsed
or counted; non-streamed answers only) and `uncounted` (everything but the exact count): where
the gateway's CPU above the floor goes.

Bodies are bench/proxy_payloads.py's: by default every request carries a new
nonce in its latest message, as in proxy_overhead.py (a chat history repeated
with one new message); `--same-body` sends one identical body throughout, as
a plain `wrk -s` script does. Requests still in flight when wrk stops (at most
the concurrency) add CPU that no completed request accounts for; that inflates
every target alike, most in large cells at high concurrency.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import uvloop
from proxy_ab import THIS_CHECKOUT, servers
from proxy_overhead import FLOOR_AIOHTTP, GOAL_CPU_RATIO, check_fast_path, cpu_seconds, rotated
from proxy_payloads import APIS, NONCE_WIDTH, Payload, build
from servers import REPO, Server, gateway_environment, start, stop

# The proxies share one core, wrk and the upstream the other, so the client's and upstream's
# scheduling does not land in a proxy's CPU time.
PROXY_CPU, CLIENT_CPU = 1, 0
SETTLE_SECONDS = 0.2  # requests cut off when wrk stops finish their bookkeeping before CPU is read
WARMUP_SECONDS = 1
# wrk's Lua: a new body per request (the nonce slot filled from a counter) or one body for all.
LUA = """
local head, tail, nonce, same
function init(args)
  local function slurp(path)
    local f = assert(io.open(path, "rb")); local data = f:read("*a"); f:close(); return data
  end
  head, tail, nonce, same = slurp(args[1]), slurp(args[2]), tonumber(args[3]), args[4] == "same"
  wrk.method = "POST"
{headers}
end
function request()
  if not same then nonce = nonce + 1 end
  return wrk.format(nil, nil, nil, head .. string.format("%0{width}d", nonce % 1e{width}) .. tail)
end
"""
REQUESTS_DONE = re.compile(r"(\d+) requests in")
ERRORS = ("Non-2xx or 3xx responses", "Socket errors")


def pin(server: Server, cpu: int) -> None:
    """Every thread of the server's process on `cpu` (threads it starts later inherit it)."""
    for thread in Path(f"/proc/{server.process.pid}/task").iterdir():
        os.sched_setaffinity(int(thread.name), {cpu})


def lua_script(payload: Payload) -> str:
    headers = "\n".join(f'  wrk.headers["{name}"] = "{value}"' for name, value in payload.headers.items())
    return LUA.format(headers=headers, width=NONCE_WIDTH)


def wrk(
    server: Server,
    payload: Payload,
    files: list[Path],
    nonce: int,
    args: argparse.Namespace,
    concurrency: int,
    seconds: float,
) -> int:
    """Run wrk against `server`; the requests it completed."""
    script, head, tail = files
    command = [
        "taskset",
        "-c",
        str(CLIENT_CPU),
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{seconds:g}s",
        "--timeout",
        "30s",
        "-s",
        str(script),
        server.origin + payload.path,
        "--",
        str(head),
        str(tail),
        str(nonce),
        "same" if args.same_body else "new",
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    if any(error in output for error in ERRORS):
        raise RuntimeError(f"{server.name} failed requests under wrk:\n{output}")
    found = REQUESTS_DONE.search(output)
    if found is None:
        raise RuntimeError(f"no request count in wrk's output:\n{output}")
    return int(found.group(1))


def measure(
    running: dict[str, Server],
    payload: Payload,
    concurrency: int,
    args: argparse.Namespace,
    files: list[Path],
    nonce: int,
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Each target's median CPU per request, and each gateway's ratios to the floor, round by round."""
    targets = tuple(running)
    for target in targets:
        wrk(running[target], payload, files, nonce, args, concurrency, WARMUP_SECONDS)
        nonce += 10**6
    per_round: dict[str, list[float]] = {target: [] for target in targets}
    for round_number in range(args.rounds):
        for target in rotated(targets, round_number):
            server = running[target]
            before = cpu_seconds(server.process.pid)
            done = wrk(server, payload, files, nonce, args, concurrency, args.seconds)
            nonce += 10**6
            time.sleep(SETTLE_SECONDS)
            per_round[target].append((cpu_seconds(server.process.pid) - before) / done)
    floor = per_round[FLOOR_AIOHTTP]
    ratios = {
        target: sorted(value / base for value, base in zip(values, floor, strict=True))
        for target, values in per_round.items()
        if target != FLOOR_AIOHTTP
    }
    return {target: statistics.median(values) for target, values in per_round.items()}, ratios


PART_NAMES = {"relay": "gateway: relay", "uncounted": "gateway: uncounted"}


def start_parts(running: dict[str, Server], logs: Path, log_level: str) -> None:
    env = {**gateway_environment(running["upstream"]), "GATEWAY_SERVER_LOG_LEVEL": log_level}
    for part, name in PART_NAMES.items():
        launcher = [str(REPO / "bench" / "gateway_parts.py"), part, "serve"]
        running[name] = start(name, launcher, health="/healthz", env=env, logs=logs)


async def fast_paths(running: dict[str, Server], payload: Payload) -> None:
    async with aiohttp.ClientSession() as session:
        for name, server in running.items():
            if name not in (FLOOR_AIOHTTP, PART_NAMES["relay"]):  # the relay sets no gateway headers
                await check_fast_path(session, server, payload)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", type=Path, help="another checkout of this project, measured beside")
    parser.add_argument("--api", choices=APIS, nargs="+", default=list(APIS))
    parser.add_argument("--size", choices=("small", "large"), nargs="+", default=["small", "large"])
    parser.add_argument("--stream", choices=("no", "yes"), nargs="+", default=["no", "yes"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--same-body", action="store_true", help="one identical body for every request")
    parser.add_argument("--parts", action="store_true", help="add bench/gateway_parts.py's targets")
    parser.add_argument("--seconds", type=float, default=3.0, help="wrk load per target, cell and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--log-level",
        choices=("warning", "info"),
        default="warning",
        help="the gateways' log level (info, the default of `serve`, writes a line per request)",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        parser.error("wrk is not installed (Debian: apt-get install wrk)")
    if args.baseline is not None and not (args.baseline / "gateway" / "cli.py").is_file():
        parser.error(f"{args.baseline} is not a checkout of this project")
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(scratch)
        running = servers(args.baseline.resolve() if args.baseline else None, logs, args.log_level)
        if args.parts:
            try:
                start_parts(running, logs, args.log_level)
            except BaseException:
                for server in running.values():
                    stop(server)
                raise
        upstream = running.pop("upstream")
        try:
            pin(upstream, CLIENT_CPU)
            for server in running.values():
                pin(server, PROXY_CPU)
            print(
                f"wrk, {'one identical body' if args.same_body else 'a new latest message per request'}, "
                f"gateways logging at {args.log_level}; "
                f"proxy CPU ms per request, median of {args.rounds} rounds of {args.seconds:g} s per target"
            )
            names = [name for name in running if name != FLOOR_AIOHTTP]
            print(
                f"{'api':<10} {'size':<6} {'stream':<6} {'c':>3} {'floor':>7} "
                + " ".join(f"{name + ' (× floor, range)':>27}" for name in names)
            )
            nonce, met, rows = 0, 0, 0
            for api in args.api:
                for size in args.size:
                    for stream in args.stream:
                        payload = build(size, stream == "yes", api)
                        files = [logs / "post.lua", logs / "head", logs / "tail"]
                        files[0].write_text(lua_script(payload))
                        files[1].write_bytes(payload.head)
                        files[2].write_bytes(payload.tail)
                        uvloop.run(fast_paths(running, payload))
                        for concurrency in args.concurrency:
                            cpu, ratios = measure(running, payload, concurrency, args, files, nonce)
                            nonce += 10**7
                            base = cpu[FLOOR_AIOHTTP]
                            rows += 1
                            met += statistics.median(ratios[THIS_CHECKOUT]) <= GOAL_CPU_RATIO
                            cells = " ".join(
                                f"{cpu[name] * 1000:7.3f} ({statistics.median(ratios[name]):.2f}× "
                                f"{ratios[name][0]:.2f}–{ratios[name][-1]:.2f})"
                                for name in names
                            )
                            print(
                                f"{api:<10} {size:<6} {stream:<6} {concurrency:>3} {base * 1000:7.3f} "
                                + cells,
                                flush=True,
                            )
            print(f"gateway ≤ {GOAL_CPU_RATIO}× the floor (median ratio) in {met} of {rows} rows")
        finally:
            for server in [upstream, *running.values()]:
                stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
