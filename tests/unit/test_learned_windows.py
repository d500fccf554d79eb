"""Windows learned from overflow errors: plausibility, bisection, bounds, expiry, the store."""

from __future__ import annotations

import time

import orjson
import pytest

from gateway.store.memory import MemoryStore
from gateway.tokens.expiring import ExpiringLRU
from gateway.tokens.learned_windows import (
    CONVERGED_SHARE,
    Evidence,
    LearnedWindows,
    Refusal,
    judge,
    learned_key,
)


def refusal(
    demand: int, window: int | None = None, *, prompt: int | None = None, output: int | None = None
) -> Refusal:
    return Refusal(demand, demand, window, prompt, output)


@pytest.mark.parametrize(
    ("case", "stated", "expected"),
    [
        # OpenAI's "maximum context length is 8192 tokens ... your messages resulted in 9000"
        ("consistent", refusal(9_000, 8_192, prompt=9_000), 8_192),
        ("no stated prompt", refusal(9_000, 8_192), 8_192),
        # A client-supplied number echoed back: "maximum context length is 20 tokens"
        ("below the floor", refusal(9_000, 20, prompt=9_000), None),
        # "prompt 500 tokens, window 8192": it would have fitted; the refusal is about something else
        ("does not explain the refusal", refusal(9_000, 8_192, prompt=500), None),
        # The stated prompt is not the one that was sent
        ("another prompt", refusal(9_000, 8_192, prompt=80_000), None),
        # A window far above what was sent cannot be why it was refused
        ("far above the demand", refusal(9_000, 1_000_000), None),
    ],
)
def test_judge(case: str, stated: Refusal, expected: int | None) -> None:
    assert judge(stated, None, floor=1_024) == expected, case


def test_a_stated_window_below_what_was_accepted_needs_the_refused_prompt_stated() -> None:
    known = Evidence(accepted=50_000, expires_at=time.time() + 60)
    # "maximum context length is 30000 tokens", nothing else: an echo, the model took 50000.
    assert judge(refusal(60_000, 30_000), known, floor=1_024) is None
    assert judge(refusal(60_000, 45_000), known, floor=1_024) == 45_000  # within tokenizer slack
    # A redeployed server with a shorter window states the refused prompt too: believed.
    assert judge(refusal(60_000, 30_000, prompt=60_000), known, floor=1_024) == 30_000


def test_a_poisoned_statement_teaches_nothing() -> None:
    learned = LearnedWindows(floor=1_024)
    learned.accepted("m", 40_000)
    assert learned.refused("m", refusal(50_000, 20, prompt=50_000)) is None
    evidence = learned.get("m")
    assert evidence is not None and (evidence.stated, evidence.refused, evidence.accepted) == (
        None,
        None,
        40_000,
    )
    assert learned.estimate("m") is None  # nothing bounds the window: the model map still decides
    # A refusal stating no window below the floor is no bound either,
    assert learned.refused("m", refusal(500)) is None
    assert learned.estimate("m") is None
    # nor one far below the window the model is known to have (config, discovery, model map).
    assert learned.refused("m", Refusal(5_000, 5_000, None, None, None, expected_window=128_000)) is None
    assert learned.estimate("m") is None
    learned.refused("m", Refusal(130_000, 130_000, None, None, None, expected_window=128_000))
    assert learned.estimate("m") is not None


def simulate_growing_conversation(window: int, turns: int, growth: int) -> tuple[int, int, int]:
    """Requests growing by ``growth`` against an upstream refusing demands above ``window``
    (stating no number), planned like the gateway does: (refused first tries, refused
    retries, the last estimate)."""
    learned = LearnedWindows()
    refused_first = refused_retry = 0
    size = growth
    estimate = 0
    for _ in range(turns):
        size += growth
        estimate = learned.estimate("m") or size
        sent = min(size, estimate)
        if sent <= window:
            learned.accepted("m", sent)
            continue
        refused_first += 1
        learned.refused("m", refusal(sent))
        evidence = learned.get("m")
        assert evidence is not None
        retry = evidence.accepted if evidence.accepted and evidence.accepted >= sent * 0.75 else None
        retry = retry or evidence.estimate() or int(sent * 0.75)
        if retry <= window:
            learned.accepted("m", retry)
        else:
            refused_retry += 1
            learned.refused("m", refusal(retry))
    return refused_first, refused_retry, estimate


def test_bisection_converges_on_a_growing_conversation() -> None:
    refused_first, refused_retry, estimate = simulate_growing_conversation(50_000, 60, 2_000)
    assert refused_retry == 0  # no request fails: every retry aims at an accepted size
    assert refused_first <= 4  # the gap halves per probe
    assert 50_000 * (1 - CONVERGED_SHARE) <= estimate <= 50_000


def test_the_window_moves_and_the_evidence_follows() -> None:
    learned = LearnedWindows()
    learned.accepted("m", 10_000)
    learned.refused("m", refusal(12_000))
    # The server was redeployed with a larger window: an accepted demand above the old bound clears it.
    learned.accepted("m", 20_000)
    evidence = learned.get("m")
    assert evidence is not None and (evidence.accepted, evidence.refused) == (20_000, None)
    # ... and a smaller one: a refusal below the accepted bound drops it.
    learned.refused("m", refusal(15_000))
    evidence = learned.get("m")
    assert evidence is not None and (evidence.accepted, evidence.refused) == (None, 15_000)


def test_memory_is_bounded_whatever_the_number_of_names() -> None:
    learned = LearnedWindows(max_models=100)
    for index in range(10_000):
        learned.refused(f"hostile-{index}" + "x" * 50, refusal(5_000, 4_096, prompt=5_000))
    assert len(learned) == 100
    assert learned.get("hostile-9999" + "x" * 50) is not None  # the most recent stay
    assert learned.get("hostile-0" + "x" * 50) is None


def test_learned_windows_expire() -> None:
    learned = LearnedWindows(ttl_seconds=60)
    learned.refused("m", refusal(9_000, 8_192, prompt=9_000))
    assert learned.estimate("m") == 8_192
    learned.put("m", Evidence(stated=8_192, expires_at=time.time() - 1))
    assert learned.estimate("m") is None


def test_expiring_lru_evicts_least_recently_used() -> None:
    cache: ExpiringLRU[int] = ExpiringLRU(2)
    later = time.time() + 60
    cache.put("a", 1, later)
    cache.put("b", 2, later)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3, later)
    assert ("a" in cache, "b" in cache, "c" in cache) == (True, False, True)


class SharedMemoryStore(MemoryStore):
    """Stands in for Redis: a store other processes write, where a key gone is a forget."""

    shared = True


async def test_every_key_is_written_with_a_ttl_and_read_back_by_another_replica() -> None:
    store = SharedMemoryStore()
    first = LearnedWindows(ttl_seconds=600)
    first.refused("m", refusal(9_000, 8_192, prompt=9_000))
    await first.save(store, "m")
    raw = await store.get(learned_key("m"))
    assert raw is not None and orjson.loads(raw)["stated"] == 8_192
    _, expires_at = store._values[learned_key("m")]
    assert expires_at is not None and 0 < expires_at - time.monotonic() <= 600

    second = LearnedWindows()
    await second.load(store, "m")
    assert second.estimate("m") == 8_192
    # Forgotten in the store (`windows forget`): the replica drops it at its next read.
    await store.delete(learned_key("m"))
    await second.load(store, "m")
    assert second.estimate("m") is None


@pytest.mark.parametrize("stored", ["", "abc", "-5", "[1]", '{"stated": -3}', '{"stated": true}', "1e9"])
async def test_malformed_records_are_ignored(stored: str) -> None:
    store = MemoryStore()
    await store.set(learned_key("m"), stored)
    learned = LearnedWindows()
    await learned.load(store, "m")
    assert learned.estimate("m") is None
