"""Per-model correction factors learned from the upstream's reported usage.

Every answer carries the true `usage.prompt_tokens`. For models whose
tokenizer we only approximate, `observe(model, estimated, reported)` moves the
model's factor towards the value that would have made the estimate exact:

    target = factor × reported / estimated

where `estimated` is what the counter returned for the prompt that was sent
(i.e. already multiplied by the current factor). The factor is an exponential
moving average of the targets in log space (over- and under-estimates by the
same ratio weigh the same), with weight 1/(n+1) for the first observations
(a plain mean, so one answer already corrects most of the error) and
`SMOOTHING` afterwards (recent traffic dominates, one odd answer does not).
Factors stay within [MIN_FACTOR, MAX_FACTOR]: a wildly wrong report (a cached
or truncated prompt, a misrouted model) cannot derail the estimates.

Answers for prompts under `MIN_REPORTED_TOKENS` are ignored: fixed per-request
overhead (a provider's hidden system preamble) dominates their ratio.

Exact (OpenAI) counters never apply a factor; see `counter.py`.

Model names come from clients, so the state is bounded: the `MAX_MODELS` most recently used
names are kept (an evicted model starts again from its family factor, or from the store), and
every stored factor expires after `STORE_TTL_SECONDS` unless a later save refreshes it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import orjson

from gateway.store.base import Store

MIN_FACTOR: Final = 0.5
MAX_FACTOR: Final = 2.0
SMOOTHING: Final = 0.2
MIN_REPORTED_TOKENS: Final = 64
MAX_MODELS: Final = 2048
STORE_TTL_SECONDS: Final = 30 * 24 * 3600


def _clamp(factor: float) -> float:
    return min(MAX_FACTOR, max(MIN_FACTOR, factor))


def store_key(model: str) -> str:
    return f"calibration:{model}"


@dataclass(slots=True)
class _State:
    factor: float = 1.0
    samples: int = 0


class Calibration:
    """Process-wide factors per model name (as the client sends it)."""

    def __init__(self, max_models: int = MAX_MODELS) -> None:
        self._states: OrderedDict[str, _State] = OrderedDict()
        self._max_models = max_models

    def factor(self, model: str) -> float:
        state = self._states.get(model)
        return 1.0 if state is None else state.factor

    def samples(self, model: str) -> int:
        state = self._states.get(model)
        return 0 if state is None else state.samples

    def __len__(self) -> int:
        return len(self._states)

    def clear(self) -> None:
        self._states.clear()

    def _state(self, model: str) -> _State:
        state = self._states.get(model)
        if state is None:
            state = self._states[model] = _State()
            if len(self._states) > self._max_models:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(model)
        return state

    def observe(self, model: str, estimated: int, reported: int) -> float:
        """Learn from one answer; returns the model's updated factor."""
        state = self._state(model)
        if estimated <= 0 or reported < MIN_REPORTED_TOKENS:
            return state.factor
        target = _clamp(state.factor * reported / estimated)
        weight = max(SMOOTHING, 1.0 / (state.samples + 1))
        state.factor = _clamp(math.exp((1 - weight) * math.log(state.factor) + weight * math.log(target)))
        state.samples += 1
        return state.factor

    async def load(self, store: Store, model: str) -> None:
        """Adopt the factor persisted for `model`, if any (ignores malformed values)."""
        raw = await store.get(store_key(model))
        if raw is None:
            return
        try:
            data = orjson.loads(raw)
            factor, samples = float(data["factor"]), int(data["samples"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return
        if math.isfinite(factor) and samples >= 0:
            state = self._state(model)
            state.factor, state.samples = _clamp(factor), samples

    async def save(self, store: Store, model: str) -> None:
        state = self._states.get(model)
        if state is not None:
            value = orjson.dumps({"factor": state.factor, "samples": state.samples}).decode()
            await store.set(store_key(model), value, ttl_seconds=STORE_TTL_SECONDS)
