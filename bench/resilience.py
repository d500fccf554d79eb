"""What a context overflow costs when the gateway recovers from it, and how fast it stops happening.

    python bench/resilience.py [--runs N] [--requests N] [--window N]
    python bench/resilience.py --hostile [--names N] [--idle N]

Servers, each its own process on 127.0.0.1, stopped at exit (and killed with the bench):

- fake upstream with a real window (`python -m tests.fakes.upstream --window N`): it counts
  every prompt exactly and answers OpenAI's context_length_exceeded 400 above the window;
- fake upstream without a window (everything fits);
- gateway A in front of the first, gateway B in front of the second
  (`python -m gateway.cli serve`, default settings).

(a) Overflow recovery latency, non-streaming, one payload over the fake's window
    (a conversation of old turns and a new question, max_tokens set):
    - overflow + retry: a model name the gateway has never seen, so its window is unknown;
      the gateway forwards as is, gets the 400, learns the window, compresses, retries once;
    - direct success: the same payload for a model whose window the gateway has learned:
      compressed ahead of time, answered on the first try;
    - reference: the same payload through gateway B (fits: forwarded untouched) and straight
      to the windowless fake (no gateway).
    Median over N interleaved runs; the ratio is overflow + retry over direct success.

(b) First-try success for an unknown model before and after the first overflow taught the
    window: one growing conversation (each request adds an exchange), the gateway's answer
    headers say whether an overflow retry was needed.

(c) Hostile input (`--hostile`, run alone): one gateway with default settings in front of the
    windowless fake, a normal client sending small chat requests all along, and one attack at a
    time: slash model names, 1 MB model names, idle sockets, a 10 MB header, three unfinished
    100 MB headers, a 10 MB body abandoned by its client. Per attack: its time and answer, the
    gateway's RSS before and after (2 s later) and CPU, the normal client's p99 and failures
    during the attack and the 2 s after it.

Latencies are from the client (whole body read) on a small shared machine: compare rows
measured side by side, not absolute milliseconds.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from servers import Server, bench_environment, gateway_environment, start, stop

CHAT = "/v1/chat/completions"
REQUEST_TIMEOUT = 30.0
MAX_TOKENS = 256
WORDS_PER_MESSAGE = 40  # ~200 tokens a message, ~400 an exchange


# --- processes ---------------------------------------------------------------------------------


@contextlib.contextmanager
def servers(window: int, logs: Path) -> Iterator[dict[str, Server]]:
    env = bench_environment()
    running: dict[str, Server] = {}
    try:
        running["fake-window"] = start(
            "fake-window",
            ["-m", "tests.fakes.upstream", "--window", str(window)],
            health="/v1/models",
            env=env,
            logs=logs,
        )
        running["fake-open"] = start(
            "fake-open", ["-m", "tests.fakes.upstream"], health="/v1/models", env=env, logs=logs
        )
        for name, upstream in (("gateway-a", "fake-window"), ("gateway-b", "fake-open")):
            argv = ["-m", "gateway.cli", "serve"]
            running[name] = start(
                name, argv, health="/healthz", env=gateway_environment(running[upstream]), logs=logs
            )
        yield running
    finally:
        for server in reversed(running.values()):
            stop(server)


# --- payloads ----------------------------------------------------------------------------------


def conversation(exchanges: int, *, seed: str = "") -> list[dict[str, str]]:
    """A system prompt, `exchanges` old user/assistant turns, and a new question."""
    messages = [{"role": "system", "content": "You are a careful assistant. Answer from the conversation."}]
    for turn in range(exchanges):
        words = " ".join(f"{seed}topic{turn}-{j}" for j in range(WORDS_PER_MESSAGE))
        messages.append({"role": "user", "content": f"Question {turn}: tell me about {words}"})
        messages.append({"role": "assistant", "content": f"Answer {turn}: here is what I know: {words}"})
    messages.append({"role": "user", "content": f"After {exchanges} exchanges: what did I ask first?"})
    return messages


def body(model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": model, "messages": messages, "max_tokens": MAX_TOKENS}


@dataclass
class Answer:
    status: int
    seconds: float
    headers: httpx.Headers

    @property
    def retried(self) -> bool:
        return self.headers.get("x-gateway-retry") == "overflow"

    @property
    def compressed(self) -> bool:
        return self.headers.get("x-gateway-compression", "none") != "none"


def post(client: httpx.Client, origin: str, payload: dict[str, Any]) -> Answer:
    started = time.perf_counter()
    reply = client.post(origin + CHAT, json=payload)
    seconds = time.perf_counter() - started
    if reply.status_code != 200:
        raise RuntimeError(f"{origin} answered {reply.status_code}: {reply.text[:500]}")
    return Answer(reply.status_code, seconds, reply.headers)


# --- (a) overflow recovery latency -------------------------------------------------------------


def recovery_latency(running: dict[str, Server], runs: int, exchanges: int) -> list[tuple[str, float, str]]:
    gateway_a, gateway_b = running["gateway-a"].origin, running["gateway-b"].origin
    open_fake = running["fake-open"].origin
    messages = conversation(exchanges)
    timings: dict[str, list[float]] = {"overflow": [], "learned": [], "fast": [], "direct": []}
    notes = {"overflow": set(), "learned": set()}
    with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
        # Teach gateway A the window of "bench-learned"; warm every path.
        first = post(client, gateway_a, body("bench-learned", messages))
        if not first.retried:
            raise RuntimeError("the payload did not overflow the fake's window: raise --exchanges")
        for _ in range(3):
            post(client, gateway_a, body("bench-learned", messages))
            post(client, gateway_b, body("gpt-4o", messages))
            post(client, open_fake, body("gpt-4o", messages))
        for run in range(runs):
            # Interleaved, so drift on the machine hits every row alike.
            overflow = post(client, gateway_a, body(f"bench-unknown-{run:04d}", messages))
            learned = post(client, gateway_a, body("bench-learned", messages))
            timings["overflow"].append(overflow.seconds)
            timings["learned"].append(learned.seconds)
            notes["overflow"].add(f"retry={overflow.retried}")
            notes["learned"].add(f"retry={learned.retried}, compressed={learned.compressed}")
            timings["fast"].append(post(client, gateway_b, body("gpt-4o", messages)).seconds)
            timings["direct"].append(post(client, open_fake, body("gpt-4o", messages)).seconds)
    if notes["overflow"] != {"retry=True"} or notes["learned"] != {"retry=False, compressed=True"}:
        raise RuntimeError(f"unexpected paths: {notes}")
    medians = {name: statistics.median(values) * 1000 for name, values in timings.items()}
    return [
        ("overflow + compressed retry (window unknown)", medians["overflow"], "1 overflow, 1 retry"),
        ("direct success (window learned, compressed ahead)", medians["learned"], "first try"),
        ("reference: gateway, window not exceeded (as is)", medians["fast"], "upstream without window"),
        ("reference: upstream, no gateway", medians["direct"], "upstream without window"),
        ("ratio overflow + retry / direct success", medians["overflow"] / medians["learned"], ""),
    ]


# --- (b) first-try success before and after learning -------------------------------------------


@dataclass
class Turn:
    index: int
    tokens_before: int
    tokens_after: int
    retried: bool
    compressed: bool


def learning_curve(running: dict[str, Server], requests: int) -> list[Turn]:
    gateway_a = running["gateway-a"].origin
    turns = []
    with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
        for index in range(requests):
            answer = post(client, gateway_a, body("bench-growing-llm", conversation(index + 1, seed="g")))
            turns.append(
                Turn(
                    index + 1,
                    int(answer.headers["x-gateway-prompt-tokens-before"]),
                    int(answer.headers["x-gateway-prompt-tokens-after"]),
                    answer.retried,
                    answer.compressed,
                )
            )
    return turns


# --- (c) hostile input -------------------------------------------------------------------------

HOSTILE_NORMAL_BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Are you there?"}]}
SETTLE_SECONDS = 2.0
# A hostile request still unanswered after this long counts as a miss.
ATTACK_TIMEOUT = 120.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class NormalClient:
    """A well-behaved client sending small chat requests one after another, in a thread."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.samples: list[tuple[float, int]] = []  # (latency, status; 0 = failed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    status = client.post(self.origin + CHAT, json=HOSTILE_NORMAL_BODY).status_code
                except httpx.HTTPError:
                    status = 0
                self.samples.append((time.perf_counter() - started, status))
                time.sleep(0.01)

    def __enter__(self) -> NormalClient:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT + 5)


def p99_ms(samples: list[tuple[float, int]]) -> float:
    latencies = sorted(latency for latency, _ in samples)
    if not latencies:
        return float("nan")
    return latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000


@dataclass
class HostileRow:
    name: str
    seconds: float
    outcome: str
    rss_before: float
    rss_after: float
    cpu: float
    normal_p99: float
    normal_failed: int
    normal_count: int


def _raw_socket(origin: str) -> socket.socket:
    host, port = origin.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT)
    return sock


def _drain(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _status_of(response: bytes) -> str:
    return response.split(b"\r\n", 1)[0].decode("latin-1", "replace")[9:] or "closed without answer"


def attack_model_name(origin: str, repeats: int) -> str:
    body = {"model": "a/" * repeats, "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(origin + CHAT, json=body, timeout=ATTACK_TIMEOUT)
    return f"{reply.status_code} ({len(orjson.dumps(body)) // 1024} KB body)"


def attack_big_names(origin: str, count: int) -> str:
    statuses: collections.Counter[int] = collections.Counter()
    with httpx.Client(timeout=ATTACK_TIMEOUT) as client:
        for index in range(count):
            name = f"{index:06d}" + "m" * 1_000_000
            body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
            statuses[client.post(origin + CHAT, json=body).status_code] += 1
    return ", ".join(f"{count}× {status}" for status, count in sorted(statuses.items()))


def attack_idle_sockets(origin: str, count: int) -> str:
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            with contextlib.suppress(OSError):
                opened.append(_raw_socket(origin))
        time.sleep(1.0)  # the normal client keeps working among them
        closed = 0
        for sock in opened:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        return f"{len(opened)} opened, {closed} closed by the gateway"
    finally:
        for sock in opened:
            sock.close()


def attack_big_header(origin: str) -> str:
    with _raw_socket(origin) as sock:
        with contextlib.suppress(OSError):
            request = orjson.dumps(HOSTILE_NORMAL_BODY)
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                + b"x-padding: "
                + b"a" * 10_000_000
                + b"\r\n"
                + b"content-length: %d\r\n\r\n" % len(request)
                + request
            )
        return _status_of(_drain(sock))


def attack_unfinished_headers(origin: str, count: int = 3, size: int = 100_000_000) -> str:
    def one() -> tuple[int, str]:
        sent = 0
        with _raw_socket(origin) as sock:
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-padding: ")
                piece = b"a" * 65536
                while sent < size:
                    sock.sendall(piece)
                    sent += len(piece)
            return sent, _status_of(_drain(sock))

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        results = list(pool.map(lambda _: one(), range(count)))
    return "; ".join(f"{status} after {sent / 1e6:.1f} MB" for sent, status in results)


def attack_abandoned_body(origin: str, pid: int) -> str:
    body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "a" * 10_000_000}]})
    with _raw_socket(origin) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + b"content-length: %d\r\n\r\n" % len(body)
            + body
        )
    left = time.perf_counter()
    # Until the gateway's CPU is quiet again (the normal client's own cost is small).
    last, quiet_since = cpu_seconds(pid), time.perf_counter()
    while time.perf_counter() - quiet_since < 0.5 and time.perf_counter() - left < 120:
        time.sleep(0.1)
        now = cpu_seconds(pid)
        if now - last > 0.03:
            quiet_since = time.perf_counter()
        last = now
    return f"busy {quiet_since - left:.1f} s after the client left"


def hostile_table(logs: Path, names: int, idle: int) -> tuple[float, list[HostileRow]]:
    env = bench_environment()
    fake = start("fake-open", ["-m", "tests.fakes.upstream"], health="/v1/models", env=env, logs=logs)
    gateway = start(
        "gateway", ["-m", "gateway.cli", "serve"], health="/healthz", env=gateway_environment(fake), logs=logs
    )
    pid, origin = gateway.process.pid, gateway.origin
    attacks: list[tuple[str, Callable[[], str]]] = [
        ("model name `a/` × 10,000", lambda: attack_model_name(origin, 10_000)),
        ("model name `a/` × 30,000", lambda: attack_model_name(origin, 30_000)),
        (f"1 MB model names × {names}", lambda: attack_big_names(origin, names)),
        (f"{idle} idle sockets", lambda: attack_idle_sockets(origin, idle)),
        ("10 MB header", lambda: attack_big_header(origin)),
        ("3 unfinished 100 MB headers", lambda: attack_unfinished_headers(origin)),
        ("10 MB body abandoned by its client", lambda: attack_abandoned_body(origin, pid)),
    ]
    try:
        with NormalClient(origin) as baseline:
            time.sleep(5)
        baseline_p99 = p99_ms(baseline.samples)
        rows = []
        for name, attack in attacks:
            rss_before, cpu_before = rss_mb(pid), cpu_seconds(pid)
            with NormalClient(origin) as normal:
                started = time.perf_counter()
                try:
                    outcome = attack()
                except httpx.HTTPError as exc:
                    outcome = f"no answer ({type(exc).__name__})"
                seconds = time.perf_counter() - started
                # The normal client's window is the attack and the time right after it.
                time.sleep(SETTLE_SECONDS)
            failed = sum(1 for _, status in normal.samples if status != 200)
            rows.append(
                HostileRow(
                    name,
                    seconds,
                    outcome,
                    rss_before,
                    rss_mb(pid),
                    cpu_seconds(pid) - cpu_before,
                    p99_ms(normal.samples),
                    failed,
                    len(normal.samples),
                )
            )
    finally:
        stop(gateway)
        stop(fake)
    return baseline_p99, rows


def print_hostile(baseline_p99: float, rows: list[HostileRow]) -> None:
    print(
        "\n(c) hostile input against one gateway (default settings), a normal client sending small chat "
        f"requests throughout: its p99 without any attack {baseline_p99:.1f} ms\n"
    )
    print(
        "| attack | time | answer | gateway RSS before → after | gateway CPU | normal client p99 "
        "(× normal) | normal requests failed |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row.name} | {row.seconds:.2f} s | {row.outcome} "
            f"| {row.rss_before:.0f} → {row.rss_after:.0f} MB "
            f"| {row.cpu:.2f} s | {row.normal_p99:.1f} ms ({row.normal_p99 / baseline_p99:.1f}×) "
            f"| {row.normal_failed} of {row.normal_count} |"
        )


# --- report ------------------------------------------------------------------------------------


def print_latency(rows: list[tuple[str, float, str]], runs: int, exchanges: int, window: int) -> None:
    print(
        f"\n(a) overflow recovery latency: median of {runs} runs, non-streaming, one payload "
        f"({exchanges} old exchanges, max_tokens {MAX_TOKENS}) over a {window}-token window\n"
    )
    print("| path | median | upstream requests |")
    print("| --- | ---: | --- |")
    for name, value, note in rows:
        figure = f"{value:.2f}x" if name.startswith("ratio") else f"{value:.1f} ms"
        print(f"| {name} | {figure} | {note} |")


def print_learning(turns: list[Turn], window: int) -> None:
    first_overflow = next((turn.index for turn in turns if turn.retried), None)
    print(
        f"\n(b) first-try success for a model unknown to the gateway, one conversation growing by one "
        f"exchange per request, upstream window {window} tokens (max_tokens {MAX_TOKENS})\n"
    )
    print("| request | prompt tokens as sent by the client | forwarded | compressed | overflow retry |")
    print("| ---: | ---: | ---: | --- | --- |")
    for turn in turns:
        print(
            f"| {turn.index} | {turn.tokens_before} | {turn.tokens_after} | "
            f"{'yes' if turn.compressed else 'no'} | {'yes' if turn.retried else 'no'} |"
        )
    if first_overflow is None:
        print("\nno request overflowed: raise --requests or lower --window")
        return
    phases = {
        "before learning (up to the first overflow)": [t for t in turns if t.index <= first_overflow],
        "after learning": [t for t in turns if t.index > first_overflow],
    }
    print("\n| phase | requests | over the window as sent | needed an overflow retry | first-try success |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for phase, members in phases.items():
        over = sum(1 for t in members if t.tokens_before + MAX_TOKENS > window)
        retried = sum(1 for t in members if t.retried)
        rate = (len(members) - retried) / len(members) if members else float("nan")
        print(f"| {phase} | {len(members)} | {over} | {retried} | {rate:.0%} |")
    over_window = [t for t in turns if t.tokens_before + MAX_TOKENS > window]
    retried_over = sum(1 for t in over_window if t.retried)
    print(
        f"\nOf the {len(over_window)} requests over the window, {retried_over} needed the overflow retry "
        f"(the first one, which taught the window, was request {first_overflow})."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per latency row (default 30)")
    parser.add_argument("--requests", type=int, default=20, help="requests in the growing conversation")
    parser.add_argument("--window", type=int, default=4000, help="the fake upstream's window in tokens")
    parser.add_argument("--exchanges", type=int, default=12, help="old exchanges in the latency payload")
    parser.add_argument("--hostile", action="store_true", help="only (c): the hostile-input table")
    parser.add_argument("--names", type=int, default=50, help="(c): requests with 1 MB model names")
    parser.add_argument("--idle", type=int, default=6000, help="(c): idle sockets opened at once")
    args = parser.parse_args(argv)
    # SIGTERM would otherwise end the bench without stopping its servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.hostile:
        with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
            baseline_p99, hostile_rows = hostile_table(Path(tmp), args.names, args.idle)
        print_hostile(baseline_p99, hostile_rows)
        return 0
    with (
        tempfile.TemporaryDirectory(prefix="bench-resilience-") as tmp,
        servers(args.window, Path(tmp)) as running,
    ):
        rows = recovery_latency(running, args.runs, args.exchanges)
        turns = learning_curve(running, args.requests)
    print_latency(rows, args.runs, args.exchanges, args.window)
    print_learning(turns, args.window)
    return 0


if __name__ == "__main__":
    sys.exit(main())
