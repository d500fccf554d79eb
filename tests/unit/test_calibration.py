"""Learning per-model correction factors from the upstream's reported usage."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import tiktoken

import gateway  # noqa: F401  (offline tiktoken cache)
from gateway.store.memory import MemoryStore
from gateway.tokens.cache import CountCache
from gateway.tokens.calibration import MAX_FACTOR, MIN_FACTOR, MIN_REPORTED_TOKENS, Calibration
from gateway.tokens.counter import TokenCounter

SAMPLE = (
    "the quick brown fox jumps over a lazy dog while the gateway trims context windows; "
    "def fit(messages, budget): return [m for m in messages if m] # numpy.array([1, 2, 3]) "
    '東京 データ résumé naïve Größe {"key": [1, 2.5, null]} https://example.com/path?q=1'
)
WORDS = SAMPLE.split()


def conversation(rng: random.Random) -> dict[str, Any]:
    messages = [
        {
            "role": rng.choice(["user", "assistant"]),
            "content": " ".join(rng.choices(WORDS, k=rng.randint(20, 300))),
        }
        for _ in range(rng.randint(2, 25))
    ]
    return {"model": "m", "messages": [{"role": "system", "content": "Be helpful."}, *messages]}


def cl100k_upstream() -> Callable[[dict[str, Any]], int]:
    """An upstream whose real tokenizer is cl100k_base (OpenAI framing rules)."""
    encoding = tiktoken.get_encoding("cl100k_base")

    def usage(body: dict[str, Any]) -> int:
        return 3 + sum(
            3 + len(encoding.encode(m["role"])) + len(encoding.encode(m["content"])) for m in body["messages"]
        )

    return usage


def scaled_o200k_upstream(ratio: float) -> Callable[[dict[str, Any]], int]:
    encoding = tiktoken.get_encoding("o200k_base")

    def usage(body: dict[str, Any]) -> int:
        raw = 3 + sum(
            3 + len(encoding.encode(m["role"])) + len(encoding.encode(m["content"])) for m in body["messages"]
        )
        return round(raw * ratio)

    return usage


@pytest.mark.parametrize(
    ("model", "upstream"),
    [
        ("claude-sonnet-4-5", cl100k_upstream()),
        ("claude-sonnet-4-5", scaled_o200k_upstream(1.27)),
        ("claude-sonnet-4-5", scaled_o200k_upstream(0.85)),
        ("meta-llama/llama-3.1-70b-instruct", scaled_o200k_upstream(1.27)),
        ("qwen2.5-72b-instruct", scaled_o200k_upstream(0.9)),
    ],
    ids=["claude-cl100k", "claude-x1.27", "claude-x0.85", "llama-x1.27", "qwen-x0.9"],
)
def test_estimates_converge_within_3_percent_after_20_answers(
    model: str, upstream: Callable[[dict[str, Any]], int]
) -> None:
    rng = random.Random(20240611)
    calibration = Calibration()
    counter = TokenCounter(model, calibration=calibration, cache=CountCache())
    first_error = None
    for _ in range(20):
        body = conversation(rng)
        estimated, reported = counter.request(body), upstream(body)
        first_error = first_error if first_error is not None else abs(estimated / reported - 1)
        calibration.observe(model, estimated, reported)
    errors = []
    for _ in range(10):
        body = conversation(rng)
        errors.append(abs(counter.request(body) / upstream(body) - 1))
    assert max(errors) < 0.03
    assert first_error is not None and first_error > 0.03  # the family factor alone was off


def test_exact_models_are_never_calibrated() -> None:
    calibration = Calibration()
    counter = TokenCounter("gpt-4o", calibration=calibration, cache=CountCache())
    body = {"messages": [{"role": "user", "content": "hello " * 100}]}
    before = counter.request(body)
    for _ in range(10):
        calibration.observe("gpt-4o", before, before * 2)
    assert calibration.factor("gpt-4o") > 1.5  # learned, but…
    assert counter.request(body) == before  # …not applied
    assert counter.scale == 1.0


def test_first_answer_corrects_most_of_the_error_then_smooths() -> None:
    calibration = Calibration()
    assert calibration.observe("m", 1000, 1300) == pytest.approx(1.3)
    # An outlier moves the factor by the smoothing weight at most (half-weight here: 2nd sample).
    factor = calibration.observe("m", 1300, 2600)
    assert 1.3 < factor < 1.3 * 2**0.5 + 1e-9
    assert calibration.samples("m") == 2


def test_factor_is_bounded_and_small_prompts_ignored() -> None:
    calibration = Calibration()
    for _ in range(50):
        calibration.observe("big", 100, 100_000)
        calibration.observe("small", 100_000, 100)
    assert calibration.factor("big") == MAX_FACTOR
    assert calibration.factor("small") == MIN_FACTOR
    assert calibration.observe("tiny", 10, MIN_REPORTED_TOKENS - 1) == 1.0
    assert calibration.observe("zero", 0, 500) == 1.0
    assert calibration.samples("tiny") == calibration.samples("zero") == 0


async def test_load_and_save_through_the_store() -> None:
    store = MemoryStore()
    calibration = Calibration()
    calibration.observe("claude-x", 1000, 1250)
    await calibration.save(store, "claude-x")
    assert await store.get("calibration:claude-x") is not None

    restored = Calibration()
    await restored.load(store, "claude-x")
    assert restored.factor("claude-x") == pytest.approx(1.25)
    assert restored.samples("claude-x") == 1

    await restored.load(store, "never-seen")
    assert restored.factor("never-seen") == 1.0
    await Calibration().save(store, "nothing-learned")
    assert await store.get("calibration:nothing-learned") is None


@pytest.mark.parametrize(
    "stored", ["not json", "{}", '{"factor": "x", "samples": 1}', '{"factor": NaN}', "[1, 2]"]
)
async def test_malformed_stored_values_are_ignored(stored: str) -> None:
    store = MemoryStore()
    await store.set("calibration:m", stored)
    calibration = Calibration()
    await calibration.load(store, "m")
    assert calibration.factor("m") == 1.0


async def test_stored_factor_is_clamped() -> None:
    store = MemoryStore()
    await store.set("calibration:m", '{"factor": 50.0, "samples": 3}')
    calibration = Calibration()
    await calibration.load(store, "m")
    assert calibration.factor("m") == MAX_FACTOR


def test_state_is_bounded_to_the_most_recent_models() -> None:
    """Model names come from clients: a flood of invented names cannot grow memory."""
    calibration = Calibration(max_models=3)
    for name in ("a", "b", "c"):
        calibration.observe(name, 1000, 1200)
    calibration.observe("a", 1000, 1200)  # used again: now the most recent
    calibration.observe("d", 1000, 1200)
    assert len(calibration) == 3
    assert calibration.samples("b") == 0 and calibration.factor("b") == 1.0  # evicted, oldest
    assert calibration.samples("a") == 2 and calibration.samples("d") == 1
