"""Compression quality benchmark: context-gateway's `fit` against three baselines.

    python -m bench.quality [--seeds 2] [--turns 60] [--huge-tokens 1000000] [--agent-loop]
                            [--only-loops] [--loop-steps 25,60,160] [--loops-from PATH ...]
                            [--option KEY=VALUE ...] [--only-shapes]

For budgets of 1/1.5, 1/3 and 1/10 of each generated conversation's size it
prints, per method: fits %, strict-API-valid % (tests/fakes/validation.py),
survival % of each canary kind, tokens kept %, budget use (median of
tokens after / budget), median and p99 time per fit (token-count cache
cleared before each call, so every method counts cold), and prefix
stability over a growing agent conversation (share of turn N's compressed
prompt, in tokens, that is an identical message prefix of turn N+1's).
With --agent-loop a last column gives the same stability when the client
also sends the requests an agent makes within a turn, after each
round of tool results (~3.5x the requests; the latest turn then holds tool
results at full size, which become old and compressed at the next turn).
Then agent loops (one task answered by 25, 60 and 160 tool steps of varied
tools and sizes, both wire formats, half of them after three earlier turns) at
1/1.5, 1/3 and 1/6 of their size: fits, strict-valid, task message intact,
`tight` (loops whose system prompt, task and newest step together are larger
than the budget: no method keeps all three whole), newest result intact, `over`
(loops whose newest step alone is larger than the budget: no method can keep it
intact), share of the three newest intact (median), share of
tool calls still present (as calls), budget use of each loop's last request,
refusals, and over growing loops that send a request after every step: budget
use (median over every request that needed compression) and prefix stability; against
keep-newest and progressive-cap. Under each budget, the gateway's rows for the same loops
sent as an agent on the Responses API's built-in tools (`gateway, shell`: Codex-style shell
items; `gateway, computer`: a computer-use agent's reasoning, calls and screenshots), and the
prefix ceiling: the most stability any method can reach on those growing loops while every
request keeps its new step whole.
`--loops-from` takes agent transcripts from files instead (bench/transcripts.py): the table
over them, each also replayed step by step for use and stability.
`--option KEY=VALUE` runs context-gateway with another compression setting (as in
config/gateway.example.yaml), to weigh budget use against cache stability.
Then the gateway on the same conversations written in each API's own shape
(bench/native_shapes.py): chat completions, Anthropic Messages and OpenAI
Responses, fitted through gateway.wire, validated by the fake upstream's
strict validator of that API; the native shapes should score as chat does.
--only-shapes prints that table alone.
It ends with the time to fit a ~1M-token conversation into 128k against the
time to merely count it once.

With --digest it prints only the digest table: conversations with facts
planted the way users state them (bench/conversations.py `stated`: a rule,
a preference and a deadline early, a value stated then corrected, a decision
mid-conversation, an error in a tool result), at 1/2, 1/4 and 1/10 of their
size, fitted with the digest on (the default) and off (a bare marker, as
before), beside two baselines: survival % of each planted code; `stale`, the
% of fits that keep the old value without its correction (the model would act
on it); `in-acct`, the % whose accounts (digest markers) carry the old value.

With --scaling it prints only the cost of one fit as the input grows far past
the budget (median of --repeats runs, each with a cold token-count cache,
beside the time to merely count the same input once): 1k/10k/100k short chat
messages into 8k, 1k/10k/20k tiny agent steps into 2k, and one 1/5/10 MB
message on a single line into 8k. Linear work keeps fit/count about constant.

Baselines, implemented here:
  keep-newest      system messages + the newest messages that fit
  middle-out       delete whole messages from the middle outward until it fits (OpenRouter)
  progressive-cap  a per-message cap from 8192 halving to 128; each round middle-truncates
                   every non-first, non-last message longer than the cap (tool results too),
                   re-counting the conversation after every change; then deletes whole
                   non-tool messages nearest the centre; then trims the first and last messages
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import orjson

import gateway  # noqa: F401  (offline tiktoken)
from bench import transcripts
from bench.conversations import (
    KINDS,
    STATED_KINDS,
    AgentLoop,
    Conversation,
    Message,
    Stated,
    agent_loop,
    chatter,
    conversation,
    growing,
    huge,
    loop_requests,
    one_line,
    stated,
    tiny_steps,
)
from bench.native_shapes import to_anthropic, to_responses, to_responses_computer, to_responses_shell
from gateway.compress import CompressionOptions, ContextBudgetExceeded, fit
from gateway.compress.units import PROTECTED_ROLES, is_user_input
from gateway.settings import ConfigError, load_settings
from gateway.tokens.counter import MESSAGE_COUNTS, counter_for
from gateway.wire.anthropic import ANTHROPIC
from gateway.wire.base import CHAT, WireFormat
from gateway.wire.fitting import fit_request
from gateway.wire.responses import RESPONSES
from tests.fakes import anthropic_api, responses_api
from tests.fakes.images import png_data_url
from tests.fakes.validation import validate_chat_messages

MODEL = "gpt-4o"
COUNTER = counter_for(MODEL)
RATIOS = (1.5, 3.0, 10.0)
LOOP_RATIOS = (1.5, 3.0, 6.0)
LOOP_METHODS = ("context-gateway", "keep-newest", "progressive-cap")
CONVERSATION_KINDS = ("agent", "support", "bilingual", "multimodal", "reasoning")
Method = Callable[[list[Message], int], list[Message]]


def gateway_fit(
    messages: list[Message],
    budget: int,
    options: CompressionOptions = CompressionOptions(),  # noqa: B008 - frozen, safe to share
) -> list[Message]:
    return list(fit(messages, model=MODEL, budget_tokens=budget, options=options).messages)


def keep_newest(messages: list[Message], budget: int) -> list[Message]:
    head = [m for m in messages if m["role"] in ("system", "developer")]
    rest = [m for m in messages if m["role"] not in ("system", "developer")]
    total = COUNTER.messages(head)
    kept: list[Message] = []
    for message in reversed(rest):
        size = COUNTER.message(message)
        if total + size > budget:
            break
        kept.append(message)
        total += size
    return head + kept[::-1]


def middle_out(messages: list[Message], budget: int) -> list[Message]:
    head = [m for m in messages[:1] if m["role"] == "system"]
    rest = messages[len(head) :]
    sizes = [COUNTER.message(m) for m in rest]
    total = COUNTER.messages(head) + sum(sizes)
    while total > budget and len(rest) > 1:
        middle = len(rest) // 2
        total -= sizes.pop(middle)
        rest.pop(middle)
    return head + rest


def _map_texts(message: Message, fn: Callable[[str], str]) -> Message:
    def part(p: Any) -> Any:
        if isinstance(p, Mapping) and isinstance(p.get("text"), str):
            return {**p, "text": fn(p["text"])}
        if isinstance(p, Mapping) and p.get("type") == "tool_result" and isinstance(p.get("content"), str):
            return {**p, "content": fn(p["content"])}
        return p

    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": fn(content)}
    if isinstance(content, list):
        return {**message, "content": [part(p) for p in content]}
    return message


def _cut_middle(cap: int) -> Callable[[str], str]:
    def cut(text: str) -> str:
        ids = COUNTER.encoding.encode_ordinary(text)
        if len(ids) <= cap:
            return text
        half = cap // 2
        return COUNTER.encoding.decode(ids[:half]) + "\n[...]\n" + COUNTER.encoding.decode(ids[-half:])

    return cut


def progressive_cap(messages: list[Message], budget: int) -> list[Message]:
    out = list(messages)
    cap = 8192
    while cap >= 128 and COUNTER.messages(out) > budget:
        for i in range(1, len(out) - 1):
            if COUNTER.message(out[i]) > cap:
                out[i] = _map_texts(out[i], _cut_middle(cap))
                if COUNTER.messages(out) <= budget:  # re-counted after every change
                    return out
        cap //= 2
    while COUNTER.messages(out) > budget:
        centre = len(out) / 2
        candidates = [i for i in range(1, len(out) - 1) if out[i]["role"] != "tool"]
        if not candidates:
            break
        del out[min(candidates, key=lambda i: (abs(i - centre), i))]
    cap = max(COUNTER.message(out[0]), COUNTER.message(out[-1]))
    while COUNTER.messages(out) > budget and cap > 16:
        cap //= 2
        out[0] = _map_texts(out[0], _cut_middle(cap))
        out[-1] = _map_texts(out[-1], _cut_middle(cap))
    return out


METHODS: dict[str, Method] = {
    "context-gateway": gateway_fit,
    "keep-newest": keep_newest,
    "middle-out": middle_out,
    "progressive-cap": progressive_cap,
}


def timed(method: Method, messages: list[Message], budget: int) -> tuple[list[Message] | None, float]:
    MESSAGE_COUNTS.clear()
    start = time.perf_counter()
    try:
        out: list[Message] | None = method(messages, budget)
    except ContextBudgetExceeded:
        out = None
    return out, time.perf_counter() - start


def prefix_share(before: list[Message], after: list[Message]) -> float:
    same = 0
    for a, b in zip(before, after, strict=False):
        if a != b:
            break
        same += 1
    return COUNTER.messages(before[:same]) / COUNTER.messages(before)


def stability(method: Method, requests: list[list[Message]], budget: int) -> float:
    outputs = [timed(method, request, budget)[0] or [] for request in requests]
    shares = [prefix_share(a, b) for a, b in itertools.pairwise(outputs) if a and b]
    return statistics.fmean(shares) if shares else 0.0


def evaluate(method: Method, conversations: list[Conversation], ratio: float) -> dict[str, float]:
    rows: dict[str, list[float]] = {key: [] for key in ("fits", "valid", "kept", "time", "use", *KINDS)}
    for conv in conversations:
        size = COUNTER.messages(conv.messages)
        budget = int(size / ratio)
        out, seconds = timed(method, conv.messages, budget)
        rows["time"].append(seconds)
        fits = out is not None and COUNTER.messages(out) <= budget
        rows["fits"].append(float(fits))
        rows["valid"].append(float(out is not None and validate_chat_messages(out) is None))
        rows["kept"].append(COUNTER.messages(out) / size if out else 0.0)
        if fits and out is not None:
            rows["use"].append(COUNTER.messages(out) / budget)
        dumped = orjson.dumps(out).decode() if out else ""
        for kind in KINDS:
            rows[kind].append(float(fits and conv.canaries[kind] in dumped))
    result = {
        key: 100 * statistics.fmean(values) for key, values in rows.items() if key not in ("time", "use")
    }
    result["use"] = statistics.median(rows["use"]) if rows["use"] else 0.0
    times = sorted(rows["time"])
    result["p50_ms"] = 1000 * statistics.median(times)
    result["p99_ms"] = 1000 * times[min(len(times) - 1, int(0.99 * len(times)))]
    return result


def _results(messages: list[Message]) -> set[str]:
    """Every tool result text of a prompt, in either wire format."""
    texts: set[str] = set()
    for message in messages:
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            texts.add(message["content"])
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            texts |= {
                p["content"]
                for p in content
                if p.get("type") == "tool_result" and isinstance(p.get("content"), str)
            }
    return texts


def _calls(messages: list[Message]) -> set[str]:
    return {
        call
        for message in messages
        if message.get("role") == "assistant"
        for call in transcripts.call_ids(message)
    }


def _step_results(loop: AgentLoop, step: int) -> set[str]:
    ends = [*loop.step_starts[1:], len(loop.messages)]
    return _results(loop.messages[loop.step_starts[step] : ends[step]])


def loop_budget(loop: AgentLoop, ratio: float) -> int:
    """A loop's budget at `ratio`: its final size / ratio."""
    return int(COUNTER.messages(loop.messages) / ratio)


def evaluate_loops(method: Method, loops: list[AgentLoop], ratio: float) -> dict[str, float]:
    """Per loop, its last request at a budget of its size / ratio; shares in %, budget use as a ratio."""
    rows: dict[str, list[float]] = {
        key: []
        for key in ("fits", "valid", "task", "newest", "three", "calls", "use", "refused", "over", "tight")
    }
    for loop in loops:
        budget = loop_budget(loop, ratio)
        newest = loop.messages[loop.step_starts[-1] :]
        # A newest step larger than the whole budget cannot stay intact, whatever the method; nor
        # can all of system prompt, task and newest step when together they exceed it.
        rows["over"].append(float(COUNTER.messages(newest) > budget))
        task = next(m for m in reversed(loop.messages[: loop.step_starts[0]]) if is_user_input(m))
        system = [m for m in loop.messages[: loop.step_starts[0]] if m.get("role") in PROTECTED_ROLES]
        rows["tight"].append(float(COUNTER.messages([*system, task, *newest]) > budget))
        out, _ = timed(method, loop.messages, budget)
        rows["refused"].append(float(out is None))
        out = out or []
        fits = bool(out) and COUNTER.messages(out) <= budget
        rows["fits"].append(float(fits))
        rows["valid"].append(float(fits and validate_chat_messages(out) is None))
        rows["task"].append(float(fits and any(m == task for m in out)))
        kept = _results(out) if fits else set()
        steps = len(loop.step_starts)
        intact = [_step_results(loop, s) <= kept for s in range(steps - 3, steps)]
        rows["newest"].append(float(intact[-1]))
        rows["three"].append(sum(intact) / 3)
        rows["calls"].append(len(_calls(out) & set(loop.call_ids)) / len(loop.call_ids) if fits else 0.0)
        if fits:
            rows["use"].append(COUNTER.messages(out) / budget)
    result = {
        key: 100 * statistics.fmean(rows[key]) for key in ("fits", "valid", "task", "newest", "refused")
    }
    result["three"] = 100 * statistics.median(rows["three"])
    result["calls"] = 100 * statistics.fmean(rows["calls"])
    result["use"] = statistics.median(rows["use"]) if rows["use"] else 0.0
    result["over"] = sum(rows["over"])
    result["tight"] = sum(rows["tight"])
    return result


def loop_stability(method: Method, loop: AgentLoop, ratio: float) -> tuple[float, list[float]]:
    """Prefix stability over the loop's every request, at a budget of its final size / ratio, and
    the budget use of each request that did not fit as it was."""
    budget = loop_budget(loop, ratio)
    outputs = []
    uses = []
    for request in loop_requests(loop):
        try:
            out = method(request, budget)
        except ContextBudgetExceeded:
            out = []
        outputs.append(out)
        if out and COUNTER.messages(request) > budget:
            uses.append(COUNTER.messages(out) / budget)
    shares = [prefix_share(a, b) for a, b in itertools.pairwise(outputs) if a and b]
    return (statistics.fmean(shares) if shares else 0.0), uses


def prefix_ceiling(loop: AgentLoop, ratio: float) -> float:
    """The highest prefix stability any method can reach over the loop's requests at this budget
    while each request keeps its new step whole. Request N+1 holds the prefix it shares with N's
    prompt, then the new step, within the budget; summed over the loop, at least (final size −
    budget) tokens of the prompts before are therefore no prefix of the next, each a share of a
    prompt no larger than the budget."""
    final, budget = COUNTER.messages(loop.messages), loop_budget(loop, ratio)
    pairs = len(loop_requests(loop)) - 1
    return 1 - max(0, final - budget) / (budget * pairs)


def generated_loops(
    seeds: int, steps: list[int], growing_steps: int
) -> tuple[list[AgentLoop], list[AgentLoop], str]:
    """bench/conversations.py's loops for the table, the growing loops for stability, and a title."""
    loops = [
        agent_loop(seed, n, style, prior_turns=3 * (seed % 2))
        for seed in range(seeds)
        for style in ("openai", "anthropic")
        for n in steps
    ]
    grown = [
        agent_loop(seed, growing_steps, style) for seed in range(seeds) for style in ("openai", "anthropic")
    ]
    sizes = [COUNTER.messages(loop.messages) for loop in loops]
    title = (
        f"Agent loops: {len(loops)} loops of {','.join(map(str, steps))} steps, "
        f"{min(sizes):,}–{max(sizes):,} tokens; "
        f"stability over {len(grown)} growing loops of {growing_steps} steps (every step a request)"
    )
    return loops, grown, title


def given_loops(paths: list[Path]) -> tuple[list[AgentLoop], list[AgentLoop], str]:
    """Transcripts from files (bench/transcripts.py): the table and the stability both over them."""
    loops = list(transcripts.load(paths))
    if not loops:
        raise transcripts.TranscriptError(f"no *.json transcript in {', '.join(map(str, paths))}")
    sizes = [COUNTER.messages(loop.messages) for loop in loops]
    steps = [len(loop.step_starts) for loop in loops]
    title = (
        f"Agent loops from files: {len(loops)} transcripts of {min(steps)}–{max(steps)} steps, "
        f"{min(sizes):,}–{max(sizes):,} tokens; stability over each, every step a request"
    )
    return loops, loops, title


def evaluate_builtin_loops(row: str, loops: list[AgentLoop], ratio: float) -> dict[str, float]:
    """The loops as an agent on one of the Responses API's built-in tools sends them (`BUILT_IN_ROWS`:
    a Codex-style shell, or computer use on a reasoning model), fitted by the gateway at the same
    ratio of their size: the columns of `evaluate_loops` that a Responses body has (shares in %).
    A call counts as present as its item or, for computer use, as the text a changed step becomes."""
    shape, call_type, output_type = BUILT_IN_ROWS[row]
    wire, build, _ = {**SHAPES, **LOOP_SHAPES}[shape]
    rows: dict[str, list[float]] = {
        key: [] for key in ("fits", "valid", "task", "newest", "calls", "refused")
    }
    for loop in loops:
        body = build(loop.messages)
        server = responses_api.ResponsesState()
        server.remember_reasoning(body["input"])  # the model's items need the reasoning they followed
        budget = int(shape_tokens(wire, body) / ratio)
        out = fit_shape(wire, body, budget)
        fits = out is not None and shape_tokens(wire, out) <= budget
        items = out["input"] if fits and out is not None else []
        newest = {call for m in loop.messages[loop.step_starts[-1] :] for call in transcripts.call_ids(m)}
        task = next(m for m in reversed(loop.messages[: loop.step_starts[0]]) if is_user_input(m))
        rows["refused"].append(float(out is None))
        rows["fits"].append(float(fits))
        rows["valid"].append(float(fits and responses_api.validate(out, server) is None))
        asked = build([task])["input"][0]
        rows["task"].append(float(asked in items))
        answers = [i for i in body["input"] if i.get("type") == output_type and i["call_id"] in newest]
        rows["newest"].append(float(fits and all(answer in items for answer in answers)))
        kept = {i["call_id"] for i in items if i.get("type") == call_type}
        loop_items = items[items.index(asked) :] if asked in items else items  # not earlier turns'
        as_text = sum(str(i.get("content")).startswith("[called computer") for i in loop_items)
        rows["calls"].append((len(kept & set(loop.call_ids)) + as_text) / len(loop.call_ids))
    return {key: 100 * statistics.fmean(values) for key, values in rows.items()}


def print_loops(
    methods: dict[str, Method], loops: list[AgentLoop], grown: list[AgentLoop], title: str
) -> None:
    print(f"\n{title}\n")
    header = (
        f"{'budget':>7} {'method':<16} {'fits':>5} {'valid':>5} {'task':>5} {'tight':>5} "
        f"{'newest':>6} {'over':>4} {'3 new':>5} {'calls':>5} {'use':>5} {'refused':>7} "
        f"{'use/step':>8} {'prefix':>6}"
    )
    print(header)
    print("-" * len(header))
    for ratio in LOOP_RATIOS:
        for name, method in methods.items():
            r = evaluate_loops(method, loops, ratio)
            runs = [loop_stability(method, loop, ratio) for loop in grown]
            stable = statistics.fmean(share for share, _ in runs)
            step_uses = [use for _, uses in runs for use in uses]
            print(
                f"{'1/' + format(ratio, 'g'):>7} {name:<16} {r['fits']:5.0f} {r['valid']:5.0f} "
                f"{r['task']:5.0f} {r['tight']:5.0f} {r['newest']:6.0f} {r['over']:4.0f} {r['three']:5.0f} "
                f"{r['calls']:5.0f} "
                f"{r['use']:5.2f} "
                f"{r['refused']:7.0f} {statistics.median(step_uses) if step_uses else 0.0:8.2f} "
                f"{stable:6.3f}",
                flush=True,
            )
        for row, (shape, _, _) in BUILT_IN_ROWS.items() if "context-gateway" in methods else ():
            r = evaluate_builtin_loops(row, loops, ratio)
            stable = statistics.fmean(
                shape_stability({**SHAPES, **LOOP_SHAPES}[shape], loop_requests(loop), ratio)
                for loop in grown
            )
            print(
                f"{'':>7} {row:<16} {r['fits']:5.0f} {r['valid']:5.0f} {r['task']:5.0f} "
                f"{'':>5} {r['newest']:6.0f} {'':>4} {'':>5} {r['calls']:5.0f} {'':>5} "
                f"{r['refused']:7.0f} {'':>8} {stable:6.3f}",
                flush=True,
            )
        ceiling = statistics.fmean(prefix_ceiling(loop, ratio) for loop in grown)
        print(f"{'':>7} prefix ceiling for any method that keeps every new step whole: {ceiling:.3f}\n")


DIGEST_RATIOS = (2.0, 4.0, 10.0)


def evaluate_stated(method: Method, conversations: list[Stated], ratio: float) -> dict[str, float]:
    rows: dict[str, list[float]] = {key: [] for key in ("fits", "valid", "stale", "in-acct", *STATED_KINDS)}
    for conv in conversations:
        budget = int(COUNTER.messages(conv.messages) / ratio)
        out, _ = timed(method, conv.messages, budget)
        fits = out is not None and COUNTER.messages(out) <= budget
        rows["fits"].append(float(fits))
        rows["valid"].append(float(out is not None and validate_chat_messages(out) is None))
        dumped = orjson.dumps(out).decode() if out else ""
        for kind, code in conv.kept.items():
            rows[kind].append(float(fits and code in dumped))
        rows["stale"].append(float(conv.stale in dumped and conv.kept["corrected"] not in dumped))
        accounts = [str(m.get("content")) for m in out or [] if "what they held" in str(m.get("content"))]
        rows["in-acct"].append(float(any(conv.stale in account for account in accounts)))
    return {key: 100 * statistics.fmean(values) if values else 0.0 for key, values in rows.items()}


def print_digest(seeds: int, options: CompressionOptions) -> None:
    methods: dict[str, Method] = {
        "gateway+digest": partial(gateway_fit, options=options),
        "gateway, no digest": partial(gateway_fit, options=replace(options, digest_ratio=0.0)),
        "keep-newest": keep_newest,
        "middle-out": middle_out,
    }
    conversations = [stated(kind, seed) for kind in CONVERSATION_KINDS for seed in range(seeds)]
    header = (
        f"{'budget':>7} {'method':<19} {'fits':>5} {'valid':>5} "
        + " ".join(f"{k:>10}" for k in STATED_KINDS)
        + f" {'all':>5} {'stale':>5} {'in-acct':>7}"
    )
    print(f"{len(conversations)} conversations with user-stated facts\n")
    print(header)
    print("-" * len(header))
    for ratio in DIGEST_RATIOS:
        for name, method in methods.items():
            r = evaluate_stated(method, conversations, ratio)
            mean = statistics.fmean(r[k] for k in STATED_KINDS)
            print(
                f"{'1/' + format(ratio, 'g'):>7} {name:<19} {r['fits']:5.0f} {r['valid']:5.0f} "
                + " ".join(f"{r[k]:10.0f}" for k in STATED_KINDS)
                + f" {mean:5.0f} {r['stale']:5.0f} {r['in-acct']:7.0f}",
                flush=True,
            )
        print()


SCALING = (
    ("chat messages", 8_000, [(f"{n:,}", partial(chatter, 0, n)) for n in (1_000, 10_000, 100_000)]),
    ("agent steps", 2_000, [(f"{n:,}", partial(tiny_steps, 0, n)) for n in (1_000, 10_000, 20_000)]),
    ("one message", 8_000, [(f"{mb} MB", partial(one_line, 0, mb)) for mb in (1, 5, 10)]),
)


def print_scaling(repeats: int) -> None:
    """Time per fit against input size, beside the time to count the same input once."""
    header = (
        f"{'shape':<14} {'size':>8} {'tokens':>11} {'budget':>6} "
        f"{'count ms':>9} {'fit ms':>9} {'fit/count':>9}"
    )
    print(header)
    print("-" * len(header))
    for shape, budget, sizes in SCALING:
        for label, build in sizes:
            messages = build()
            MESSAGE_COUNTS.clear()
            start = time.perf_counter()
            tokens = COUNTER.messages(messages)
            count_s = time.perf_counter() - start
            fit_s = statistics.median(timed(gateway_fit, messages, budget)[1] for _ in range(repeats))
            print(
                f"{shape:<14} {label:>8} {tokens:>11,} {budget:>6,} {count_s * 1000:9.0f} "
                f"{fit_s * 1000:9.0f} {fit_s / count_s:9.1f}",
                flush=True,
            )


Shape = tuple[WireFormat, Callable[[list[Message]], dict[str, Any]], Callable[[dict[str, Any]], object]]
SHAPES: dict[str, Shape] = {
    "chat": (
        CHAT,
        lambda messages: {"model": MODEL, "messages": messages},
        lambda body: validate_chat_messages(body["messages"]),
    ),
    "anthropic": (ANTHROPIC, lambda messages: to_anthropic(messages, MODEL), anthropic_api.validate),
    "responses": (
        RESPONSES,
        lambda messages: to_responses(messages, MODEL),
        lambda body: responses_api.validate(body, responses_api.ResponsesState()),
    ),
    # Every tool as the Responses API's built-in shell (shell_call / shell_call_output items).
    "resp-shell": (
        RESPONSES,
        lambda messages: to_responses_shell(messages, MODEL),
        lambda body: responses_api.validate(body, responses_api.ResponsesState()),
    ),
}
# The loop table's rows of built-in tools: (shape, call item, output item). The computer shape is
# loops only: a screenshot stands for each result, so the chat table's fact canaries do not apply.
BUILT_IN_ROWS = {
    "gateway, shell": ("resp-shell", "shell_call", "shell_call_output"),
    "gateway, computer": ("resp-computer", "computer_call", "computer_call_output"),
}
SCREENSHOT = png_data_url(1024, 768)
LOOP_SHAPES: dict[str, Shape] = {
    "resp-computer": (
        RESPONSES,
        lambda messages: to_responses_computer(messages, MODEL, SCREENSHOT),
        lambda body: responses_api.validate(body, responses_api.ResponsesState()),
    ),
}


def fit_shape(wire: WireFormat, body: dict[str, Any], budget: int) -> dict[str, Any] | None:
    view = wire.view(body)
    try:
        out, _, _ = fit_request(
            wire,
            body,
            view,
            model=MODEL,
            budget=budget,
            tokens=COUNTER.request(view.counted),
            options=CompressionOptions(),
        )
    except ContextBudgetExceeded:
        return None
    return body if out is None else out


def shape_tokens(wire: WireFormat, body: dict[str, Any]) -> int:
    return COUNTER.request(wire.view(body).counted)


def evaluate_shape(shape: Shape, conversations: list[Conversation], ratio: float) -> dict[str, float]:
    wire, build, validate = shape
    rows: dict[str, list[float]] = {key: [] for key in ("fits", "valid", "kept", "time", *KINDS)}
    for conv in conversations:
        body = build(conv.messages)
        size = shape_tokens(wire, body)
        budget = int(size / ratio)
        MESSAGE_COUNTS.clear()
        start = time.perf_counter()
        out = fit_shape(wire, body, budget)
        rows["time"].append(time.perf_counter() - start)
        fits = out is not None and shape_tokens(wire, out) <= budget
        rows["fits"].append(float(fits))
        rows["valid"].append(float(out is not None and validate(out) is None))
        rows["kept"].append(shape_tokens(wire, out) / size if out else 0.0)
        dumped = orjson.dumps(out).decode() if out else ""
        for kind in KINDS:
            rows[kind].append(float(fits and conv.canaries[kind] in dumped))
    result = {key: 100 * statistics.fmean(values) for key, values in rows.items() if key != "time"}
    result["p50_ms"] = 1000 * statistics.median(rows["time"])
    return result


def shape_stability(shape: Shape, requests: list[list[Message]], ratio: float) -> float:
    wire, build, _ = shape
    bodies = [build(request) for request in requests]
    budget = int(shape_tokens(wire, bodies[-1]) / ratio)
    outputs = [fit_shape(wire, body, budget) for body in bodies]
    views = [wire.view(out).messages if out else [] for out in outputs]
    shares = [prefix_share(a, b) for a, b in itertools.pairwise(views) if a and b]
    return statistics.fmean(shares) if shares else 0.0


def print_shapes(conversations: list[Conversation], requests: list[list[Message]]) -> None:
    print("context-gateway on the same conversations in each API's shape")
    header = (
        f"{'budget':>7} {'shape':<10} {'fits':>5} {'valid':>5} "
        + " ".join(f"{k.split('_')[0][:8]:>8}" for k in KINDS)
        + f" {'kept':>5} {'p50 ms':>8} {'prefix':>6}"
    )
    print(header)
    print("-" * len(header))
    for ratio in RATIOS:
        for name, shape in SHAPES.items():
            r = evaluate_shape(shape, conversations, ratio)
            stable = shape_stability(shape, requests, ratio)
            print(
                f"{'1/' + format(ratio, 'g'):>7} {name:<10} {r['fits']:5.0f} {r['valid']:5.0f} "
                + " ".join(f"{r[k]:8.0f}" for k in KINDS)
                + f" {r['kept']:5.0f} {r['p50_ms']:8.1f} {stable:6.3f}",
                flush=True,
            )
        print()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=2, help="conversations per kind (default 2)")
    parser.add_argument("--turns", type=int, default=60, help="turns of the growing conversation")
    parser.add_argument("--huge-tokens", type=int, default=1_000_000)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    parser.add_argument(
        "--agent-loop", action="store_true", help="add the stability over an agent's every request"
    )
    parser.add_argument(
        "--loop-steps", default="25,60,160", help="steps of the agent loops (comma-separated)"
    )
    parser.add_argument("--growing-steps", type=int, default=80, help="steps of the growing loops")
    parser.add_argument("--only-loops", action="store_true", help="print only the agent-loop table")
    parser.add_argument(
        "--loops-from",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="agent transcripts (JSON files, or directories of them) instead of the generated loops",
    )
    parser.add_argument("--scaling", action="store_true", help="print only the time per fit as inputs grow")
    parser.add_argument("--repeats", type=int, default=3, help="runs per --scaling row (median)")
    parser.add_argument("--only-shapes", action="store_true", help="print only the table of API shapes")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a compression setting for context-gateway, e.g. recent_steps_ratio=0.7 (repeatable)",
    )
    parser.add_argument("--digest", action="store_true", help="print only the digest on/off table")
    args = parser.parse_args()
    environ = {f"GATEWAY_COMPRESSION_{k.upper()}": v for k, _, v in (o.partition("=") for o in args.option)}
    try:
        options = load_settings(None, environ).compression
    except ConfigError as problem:
        parser.error(str(problem))
    if args.digest:
        print_digest(args.seeds, options)
        return
    methods = {name: METHODS[name] for name in args.methods.split(",")}
    if "context-gateway" in methods:
        methods["context-gateway"] = partial(gateway_fit, options=options)
    loop_methods = {name: method for name, method in methods.items() if name in LOOP_METHODS}
    steps = [int(n) for n in args.loop_steps.split(",")]
    if args.scaling:
        print_scaling(args.repeats)
        return
    try:
        loops = (
            given_loops(args.loops_from)
            if args.loops_from
            else generated_loops(args.seeds, steps, args.growing_steps)
        )
    except transcripts.TranscriptError as problem:
        parser.error(str(problem))
    if args.only_loops:
        print_loops(loop_methods, *loops)
        return

    conversations = [conversation(kind, seed) for kind in CONVERSATION_KINDS for seed in range(args.seeds)]
    requests = growing(0, args.turns)
    if args.only_shapes:
        print_shapes(conversations, requests)
        return
    loop = growing(0, args.turns, agent_loop=True) if args.agent_loop else []
    final = COUNTER.messages(requests[-1])
    sizes = [COUNTER.messages(c.messages) for c in conversations]
    print(
        f"{len(conversations)} conversations, {min(sizes):,}–{max(sizes):,} tokens; "
        f"growing conversation: {len(requests)} requests up to {final:,} tokens\n"
    )
    short = {
        "system_rule": "sys",
        "early_user": "early",
        "middle_assistant": "mid-turn",
        "old_tool_result": "mid-tool",
        "latest_instruction": "latest",
    }
    header = (
        f"{'budget':>7} {'method':<16} {'fits':>5} {'valid':>5} "
        + " ".join(f"{short[k]:>8}" for k in KINDS)
        + f" {'kept':>5} {'use':>5} {'p50 ms':>8} {'p99 ms':>8} {'prefix':>6}"
        + (f" {'loop':>6}" if loop else "")
    )
    print(header)
    print("-" * len(header))
    for ratio in RATIOS:
        for name, method in methods.items():
            r = evaluate(method, conversations, ratio)
            stable = stability(method, requests, int(final / ratio))
            looped = f" {stability(method, loop, int(final / ratio)):6.3f}" if loop else ""
            print(
                f"{'1/' + format(ratio, 'g'):>7} {name:<16} {r['fits']:5.0f} {r['valid']:5.0f} "
                + " ".join(f"{r[k]:8.0f}" for k in KINDS)
                + f" {r['kept']:5.0f} {r['use']:5.2f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f}"
                + f" {stable:6.3f}{looped}",
                flush=True,
            )
        print()

    print_loops(loop_methods, *loops)
    print_shapes(conversations, requests)

    big = huge(0, args.huge_tokens)
    MESSAGE_COUNTS.clear()
    start = time.perf_counter()
    total = COUNTER.messages(big)
    count_s = time.perf_counter() - start
    _, fit_s = timed(gateway_fit, big, 128_000)
    print(
        f"1M test: {total:,} tokens; counting once {count_s * 1000:.0f} ms, "
        f"fit into 128k {fit_s * 1000:.0f} ms = {fit_s / count_s:.2f}x"
    )


if __name__ == "__main__":
    main()
