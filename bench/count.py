"""Token counting cost, side by side with raw tiktoken on the same text.

Run: `python bench/count.py` (~30–60 s). Prints:

1. conversations of ~8k, 128k and 1M tokens: raw tiktoken `encode_ordinary`
   over the same message texts (the floor), the gateway counter cold (empty
   cache) and warm (every message cached), the per-message hashing alone, and
   the free byte bound; medians over repeats, ratio vs the floor;
2. per-request counting over a growing 300-turn conversation (history cached,
   the new turn not): it should stay flat while a full recount grows;
3. start-up: loading the encodings, litellm's model map JSON, and
   `import litellm` (in fresh subprocesses, once each).
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

import gateway  # noqa: F401  (offline tiktoken cache)
from gateway.tokens.cache import CountCache, message_key
from gateway.tokens.calibration import Calibration
from gateway.tokens.counter import TokenCounter
from gateway.tokens.encodings import get_encoding, warm_up

MODEL = "gpt-4o"
PROSE_WORDS = (
    "the a of to and in is that for it as with was on be by this are from at or an which have not they "
    "but context window budget gateway request response upstream compression message assistant summary "
    "tool result latency throughput tokenizer encoding conversation history prompt model provider cache"
)
PROSE = PROSE_WORDS.split()
CODE = [
    "def handler(request, *, timeout=30):",
    "    return {'status': 200, 'items': [x for x in items if x.ok]}",
    "for (let i = 0; i < rows.length; i++) { total += rows[i].value; }",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id;",
    "2024-06-11T10:42:17.331Z INFO worker-7 processed 1532 events in 84ms",
    '{"id": "a1b2c3", "score": 0.9731, "tags": ["alpha", "beta"], "ok": true}',
]


def make_text(rng: random.Random, words: int) -> str:
    lines: list[str] = []
    while words > 0:
        if rng.random() < 0.25:
            lines.append(rng.choice(CODE))
            words -= 10
        else:
            count = rng.randint(8, 30)
            lines.append(" ".join(rng.choices(PROSE, k=count)).capitalize() + ".")
            words -= count
    return "\n".join(lines)


def make_turn(rng: random.Random, tag: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"[{tag}] " + make_text(rng, rng.randint(40, 120))},
        {"role": "assistant", "content": f"[{tag}] " + make_text(rng, rng.randint(150, 400))},
    ]


def make_conversation(target_tokens: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    encoding = get_encoding("o200k_base")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    tokens = 0
    while tokens < target_tokens:
        turn = make_turn(rng, f"{seed}-{len(messages)}")
        tokens += sum(len(encoding.encode_ordinary(m["content"])) + 4 for m in turn)
        messages += turn
    return messages


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def fresh_counter() -> TokenCounter:
    return TokenCounter(MODEL, calibration=Calibration(), cache=CountCache(max_entries=100_000))


def row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(
        cell.rjust(width) if i else cell.ljust(width)
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
    )


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    print(row(header, widths))
    print(row(["-" * w for w in widths], widths))
    for cells in rows:
        print(row(cells, widths))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def bench_size(label: str, target: int, repeats: int) -> list[list[str]]:
    encoding = get_encoding("o200k_base")
    messages = make_conversation(target, seed=target)
    body = {"model": MODEL, "messages": messages}
    body_bytes = orjson.dumps(body)
    texts = [m["content"] for m in messages]
    tokens = fresh_counter().request(body)

    # Floor and cold count alternate, so machine noise hits both alike.
    floor_samples, cold_samples = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for text in texts:
            len(encoding.encode_ordinary(text))
        floor_samples.append(time.perf_counter() - start)
        counter = fresh_counter()
        start = time.perf_counter()
        counter.request(body)
        cold_samples.append(time.perf_counter() - start)
    floor, cold = statistics.median(floor_samples), statistics.median(cold_samples)

    warm_counter = fresh_counter()
    warm_counter.request(body)
    warm = median_seconds(lambda: warm_counter.request(body), repeats * 3)
    hashing = median_seconds(lambda: [message_key(b"k", m) for m in messages], repeats * 3)
    bound = median_seconds(lambda: warm_counter.byte_upper_bound(body_bytes), repeats * 3)

    megabytes = sum(len(text.encode()) for text in texts) / 1e6
    return [
        [
            label,
            name,
            f"{len(messages)}",
            f"{tokens:,}",
            ms(seconds),
            f"{megabytes / seconds:,.0f}",
            f"{seconds / floor:.3f}x",
        ]
        for name, seconds in (
            ("tiktoken floor", floor),
            ("counter cold", cold),
            ("counter warm", warm),
            ("  hashing only", hashing),
            ("  byte bound", bound),
        )
    ]


def bench_sizes() -> None:
    rows = [
        *bench_size("8k", 8_000, 25),
        *bench_size("128k", 128_000, 7),
        *bench_size("1M", 1_000_000, 3),
    ]
    print_table(
        f"Counting a conversation ({MODEL}, o200k_base; medians)",
        ["size", "method", "msgs", "tokens", "ms", "MB/s", "vs floor"],
        rows,
    )


def bench_growing() -> None:
    turns = 300
    rng = random.Random(300)
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for index in range(turns):
        history += make_turn(rng, f"h{index}")
    counter = fresh_counter()
    encoding = get_encoding("o200k_base")
    rows: list[list[str]] = []
    for turn in (10, 100, 200, 300):
        prefix = history[: 1 + 2 * (turn - 1)]
        counter.request({"model": MODEL, "messages": prefix})  # history already seen
        samples, full = [], []
        for repeat in range(25):
            messages = prefix + make_turn(rng, f"t{turn}-{repeat}")
            start = time.perf_counter()
            tokens = counter.request({"model": MODEL, "messages": messages})
            samples.append(time.perf_counter() - start)
        for _ in range(3):
            start = time.perf_counter()
            for message in messages:
                len(encoding.encode_ordinary(message["content"]))
            full.append(time.perf_counter() - start)
        warm, recount = statistics.median(samples), statistics.median(full)
        rows.append(
            [
                f"{turn}",
                f"{len(messages)}",
                f"{tokens:,}",
                ms(warm),
                ms(recount),
                f"{recount / warm:.0f}x",
            ]
        )
    print_table(
        "Per-request counting over a growing conversation (history cached, new turn not; medians)",
        ["turn", "msgs", "tokens", "counter ms", "full tiktoken ms", "saved"],
        rows,
    )


STARTUP_PROBE = """
import os, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
before = rss()
start = time.perf_counter()
exec(sys.argv[1])
print(f"{time.perf_counter() - start:.3f} {rss() - before:.1f}")
"""


def probe(statement: str, prelude: str) -> tuple[float, float]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    code = prelude + "\n" + STARTUP_PROBE
    root = str(Path(__file__).resolve().parent.parent)
    output = subprocess.run(
        [sys.executable, "-c", code, statement],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=root,
        timeout=120,
    ).stdout.split()
    return float(output[-2]), float(output[-1])


def bench_startup() -> None:
    tokens = "import gateway.tokens"
    steps = (
        ("import gateway.tokens (tiktoken, orjson)", "import gateway.tokens", "import gateway"),
        ("warm_up(): o200k_base", "gateway.tokens.warm_up(['o200k_base'])", tokens),
        ("warm_up(): cl100k_base", "gateway.tokens.warm_up(['cl100k_base'])", tokens),
        ("model map JSON → windows", "n = len(gateway.tokens.ModelMap().windows())", tokens),
        ("import litellm (for comparison)", "import litellm", "import gateway"),
    )
    rows = []
    for name, statement, prelude in steps:
        seconds, rss = probe(statement, prelude)
        rows.append([name, f"{seconds:.3f}", f"{rss:.1f}"])
    print_table("Start-up (fresh subprocess each, once)", ["step", "seconds", "RSS MB"], rows)


def main() -> None:
    started = time.perf_counter()
    warm_up()
    bench_sizes()
    bench_growing()
    bench_startup()
    print(f"\ntotal bench time: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
