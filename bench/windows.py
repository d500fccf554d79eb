"""Context windows: the names apps send, what they resolve to, and learning without numbers.

    python bench/windows.py [--runs N]

(a) Resolution of model names as apps send them, per provider: the window found and its
    source (`model_map` with the match level: exact, spelling, alias; or unknown), against
    litellm's bundled model map, no upstream. A name is counted as known to the map when
    some entry matches it under any spelling the resolver understands; names the map does
    not hold under any spelling (checked by hand, listed as such) stay unknown.
(b) The cost of the name index: reading the map and building the index (median of N runs,
    and the memory it keeps), and a lookup (median µs) for a plain name, a fuzzy one, and a
    hostile 100,000-character name (work is linear in the name).
(c) Learning when the upstream's overflow error states no numbers (OpenAI's "Your input
    exceeds the context window of this model"): a growing conversation (each request adds
    an exchange) for a model the gateway does not know, against the fake upstream with a
    real window; counts the requests that failed (an error reached the client), that needed
    an overflow retry, and that were fitted before sending. Then an error echoing a tiny
    number ("maximum context length is 20 tokens") for a known model: how many later
    requests were refused or compressed.

Servers (fake upstream, gateway) run in this process on 127.0.0.1 threads.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import httpx
from count import median_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.app import create_app
from gateway.settings import load_settings
from gateway.tokens.model_names import ModelNameIndex
from gateway.tokens.windows import ModelMap, WindowResolver
from tests.fakes.serve import serve_in_thread
from tests.fakes.upstream import FakeUpstream
from tests.fakes.upstream import create_app as create_fake

NAMES: dict[str, list[str]] = {
    "OpenAI": [
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4o-2024-08-06",
        "gpt-4.1",
        "gpt-4.1-mini",
        "o3-mini",
        "o1",
        "gpt-5",
        "gpt-3.5-turbo",
        "gpt-4-turbo",
        "chatgpt-4o-latest",
    ],
    "Azure": [
        "azure/gpt-4o",
        "azure/gpt-35-turbo",
        "gpt-35-turbo",
        "azure/gpt-4o-mini",
        "azure/o3-mini",
        "azure/gpt-4.1",
    ],
    "Anthropic": [
        "claude-3-5-sonnet-20241022",
        "anthropic/claude-3-5-sonnet-20241022",
        "claude-3-5-sonnet-latest",
        "claude-3-5-haiku-20241022",
        "claude-3-7-sonnet-20250219",
        "claude-3-7-sonnet-latest",
        "claude-sonnet-4-20250514",
        "claude-opus-4-1",
        "claude-sonnet-4-5",
        "claude-3-opus-20240229",
        "claude-3-haiku-20240307",
        "anthropic/claude-sonnet-4-5",
    ],
    "Google": [
        "gemini-1.5-pro",
        "gemini-1.5-flash",
        "gemini-2.0-flash",
        "gemini-2.5-pro",
        "gemini-2.5-flash",
        "gemini/gemini-2.5-pro",
        "models/gemini-2.5-flash",
        "gemini-2.0-flash-001",
        "vertex_ai/gemini-2.5-flash",
    ],
    "Mistral": [
        "mistral-large-latest",
        "mistral-small-latest",
        "codestral-latest",
        "open-mistral-nemo",
        "mistral/mistral-medium-latest",
        "ministral-8b-latest",
        "pixtral-large-latest",
        "mistral-large-2411",
        "open-mixtral-8x22b",
    ],
    "Groq": [
        "groq/llama-3.1-8b-instant",
        "groq/llama-3.3-70b-versatile",
        "llama-3.3-70b-versatile",
        "groq/mixtral-8x7b-32768",
        "groq/gemma2-9b-it",
        "groq/openai/gpt-oss-120b",
        "qwen/qwen3-32b",
    ],
    "Together": [
        "together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo",
        "meta-llama/Llama-3.3-70B-Instruct-Turbo",
        "Qwen/Qwen2.5-72B-Instruct-Turbo",
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-R1",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
    ],
    "OpenRouter": [
        "openrouter/anthropic/claude-3.5-sonnet",
        "anthropic/claude-3.5-sonnet",
        "openai/gpt-4o-mini",
        "meta-llama/llama-3.1-70b-instruct",
        "google/gemini-2.0-flash-001",
        "deepseek/deepseek-chat",
        "mistralai/mistral-large",
        "x-ai/grok-2",
        "qwen/qwen-2.5-72b-instruct",
    ],
    "Bedrock": [
        "bedrock/anthropic.claude-3-5-sonnet-20241022-v2:0",
        "anthropic.claude-3-5-sonnet-20241022-v2:0",
        "us.anthropic.claude-3-7-sonnet-20250219-v1:0",
        "anthropic.claude-3-haiku-20240307-v1:0",
        "meta.llama3-1-70b-instruct-v1:0",
        "amazon.nova-pro-v1:0",
        "mistral.mistral-large-2407-v1:0",
        "cohere.command-r-plus-v1:0",
    ],
    "vLLM / Hugging Face": [
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "Qwen/Qwen2.5-7B-Instruct",
        "Qwen/Qwen2.5-72B-Instruct",
        "mistralai/Mistral-7B-Instruct-v0.3",
        "google/gemma-2-9b-it",
        "Qwen/Qwen3-32B",
        "microsoft/Phi-3.5-mini-instruct",
        "deepseek-ai/DeepSeek-R1-Distill-Llama-70B",
    ],
    "Ollama": [
        "llama3.1:8b",
        "llama3.1",
        "llama3.2:3b",
        "llama3:latest",
        "qwen2.5:7b",
        "mistral:latest",
        "mixtral:8x7b",
        "gemma2:9b",
        "phi3:mini",
        "deepseek-r1:7b",
        "qwen2.5-72b-instruct",
    ],
    "Others": [
        "deepseek-chat",
        "deepseek-reasoner",
        "grok-2-latest",
        "xai/grok-3",
        "command-r-plus",
        "command-r",
    ],
}
# Checked by hand: no entry of litellm 1.106's map holds these under any spelling (or holds
# no window for them), so `unknown` is the right answer, not a miss.
NOT_IN_MAP = {
    "chatgpt-4o-latest",
    "gemini-1.5-pro",
    "gemini-1.5-flash",
    "gemini-2.0-flash",
    "gemini-2.0-flash-001",
    "google/gemini-2.0-flash-001",
    "phi3:mini",
}


def resolution_table() -> None:
    resolver = WindowResolver()
    total = known = 0
    misses: list[str] = []
    print("(a) resolution of names as apps send them (litellm model map, no upstream)\n")
    print(f"| {'provider':<19} | {'name as sent':<52} | {'window':>9} | source |")
    print(f"| {'-' * 19} | {'-' * 52} | {'-' * 9} | ------ |")
    for provider, names in NAMES.items():
        for name in names:
            found = resolver.resolve_window(name)
            total += 1
            source = found.source + (f" ({found.detail})" if found.detail else "")
            if found.tokens is not None:
                known += 1
            elif name not in NOT_IN_MAP:
                misses.append(name)
            note = " (not in the map)" if name in NOT_IN_MAP else ""
            print(f"| {provider:<19} | {name:<52} | {found.tokens or '-':>9} | {source}{note} |")
    in_map = total - len(NOT_IN_MAP)
    print(
        f"\n{total} names; {known} resolved; {in_map} known to the map under some spelling, "
        f"{in_map - len(misses)} of them resolved; unresolved: {', '.join(misses) or 'none'}\n"
    )


def index_cost(runs: int) -> None:
    print("(b) the name index: built once at start-up\n")
    build = median_seconds(lambda: ModelMap().index(), runs)
    gc.collect()
    tracemalloc.start()
    model_map = ModelMap()
    model_map.index()
    gc.collect()
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    index: ModelNameIndex = model_map.index()
    print(f"| {'measure':<48} | {'value':>12} |")
    print(f"| {'-' * 48} | {'-' * 12} |")
    print(f"| {'read map + build index (median of ' + str(runs) + ')':<48} | {build * 1000:>9.1f} ms |")
    print(f"| {'memory kept by the index':<48} | {kept / 1e6:>9.1f} MB |")
    print(f"| {'peak memory while building (parsed JSON incl.)':<48} | {peak / 1e6:>9.1f} MB |")
    print(f"| {'entries with a window':<48} | {len(index):>12} |")
    lookups = {
        "exact name (gpt-4o)": "gpt-4o",
        "fuzzy name (anthropic/claude-3.5-sonnet)": "anthropic/claude-3.5-sonnet",
        "unknown name (my-finetune-v3)": "my-finetune-v3",
        "hostile: 'a/' x 50,000 (100,000 chars)": "a/" * 50_000,
        "hostile: 'a.' x 50,000 (100,000 chars)": "a." * 50_000,
    }
    for label, name in lookups.items():
        per = median_seconds(lambda name=name: index.lookup(name), max(5, runs))  # type: ignore[misc]
        print(f"| {'lookup, ' + label:<48} | {per * 1e6:>9.1f} µs |")
    print()


def growing(url: str, model: str, turns: int, *, words: int, max_tokens: int | None) -> list[httpx.Response]:
    answers = []
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn}: " + "lorem ipsum dolor " * words})
        body: dict[str, Any] = {"model": model, "messages": messages}
        if max_tokens:
            body["max_tokens"] = max_tokens
        answer = httpx.post(f"{url}/chat/completions", json=body, timeout=60)
        answers.append(answer)
        messages.append({"role": "assistant", "content": f"answer {turn}: " + "sit amet " * words})
    return answers


def no_numbers_run() -> None:
    print("(c) learning without numbers: a growing conversation for an unknown model, the upstream")
    print('    answering "Your input exceeds the context window of this model" above its window\n')
    print("| window | max_tokens | requests | over window | failed | retried | fitted ahead | last retry |")
    print("| ------ | ---------- | -------- | ----------- | ------ | ------- | ------------ | ---------- |")
    fake = FakeUpstream(log_requests=False)
    with serve_in_thread(create_fake(fake)) as upstream_url:
        fake.base_url = f"{upstream_url}/v1"
        fake.overflow_style = "openai_new"
        settings = load_settings(None, {"GATEWAY_UPSTREAM_BASE_URL": fake.base_url})
        with serve_in_thread(create_app(settings)) as gateway_url:
            for window, max_tokens, turns in (
                (4_096, None, 40),
                (8_192, 512, 50),
                (32_768, None, 60),
                (32_768, 2_048, 60),
            ):
                fake.window = window
                model = f"unknown-{uuid.uuid4().hex[:8]}"
                answers = growing(
                    f"{gateway_url}/v1", model, turns, words=60 * window // 8_192 + 20, max_tokens=max_tokens
                )
                over = sum(
                    int(a.headers.get("x-gateway-prompt-tokens-before", 0)) + (max_tokens or 0) > window
                    for a in answers
                )
                failed = sum(a.status_code != 200 for a in answers)
                retried = [i + 1 for i, a in enumerate(answers) if a.headers.get("x-gateway-retry")]
                ahead = sum(
                    a.status_code == 200
                    and not a.headers.get("x-gateway-retry")
                    and a.headers.get("x-gateway-compression", "none") != "none"
                    for a in answers
                )
                print(
                    f"| {window:>6} | {max_tokens or '-':>10} | {turns:>8} | {over:>11} | {failed:>6} | "
                    f"{len(retried):>7} | {ahead:>12} | {retried[-1] if retried else '-':>10} |"
                )
            print()
            print('an overflow error echoing a tiny number ("maximum context length is 20 tokens"),')
            print("then 10 more requests for the same model\n")
            fake.window = None
            fake.overflow_style = "openai"
            fake.stated_window = 20
            fake.faults = ["overflow"]
            answers = growing(f"{gateway_url}/v1", "gpt-4o-mini", 11, words=400, max_tokens=None)
            first, later = answers[0], answers[1:]
            print("| first request | later refused | later compressed | later retried |")
            print("| ------------- | ------------- | ---------------- | ------------- |")
            print(
                f"| {first.status_code} {first.headers.get('x-gateway-retry', '')} | "
                f"{sum(a.status_code != 200 for a in later):>13} | "
                f"{sum(a.headers.get('x-gateway-compression', 'none') != 'none' for a in later):>16} | "
                f"{sum(bool(a.headers.get('x-gateway-retry')) for a in later):>13} |"
            )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions for the timed measures")
    args = parser.parse_args()
    resolution_table()
    index_cost(args.runs)
    no_numbers_run()


if __name__ == "__main__":
    main()
