"""Windows learned from the upstream's own answers: evidence, judged, bounded and expiring.

An upstream's answers are evidence, not truth. Per model name (as the client sends it)
the gateway keeps:

- `stated`: a window an overflow error stated, kept only when plausible (see `judge`);
- `accepted`: the largest *demand* the upstream accepted, a lower bound on the window;
- `refused`: the smallest demand it refused, an upper bound, when it stated no window
  (OpenAI's "Your input exceeds the context window of this model").

A demand is the prompt as the gateway counts it plus the output the request asked for
(`max_tokens` / `max_completion_tokens`, 0 when unstated: upstreams then check the prompt
alone), so accepted and refused requests compare in one unit whatever their settings.

With only bounds, the window estimate bisects between them: the next prompt aims at the
midpoint (never less than `BLIND_SHARE` of the refused demand), and each answer moves a
bound, so the gap halves per probe. Once it is under `CONVERGED_SHARE` of the upper
bound, the estimate is the accepted bound and requests fit first time.

State is bounded: an LRU of `max_models` entries in memory, and every store key written
with a TTL, so a flood of distinct model names grows neither memory nor Redis.
Learned evidence expires (`ttl_seconds`) and is learned again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Final

import orjson

from gateway.store.base import Store
from gateway.tokens.expiring import ExpiringLRU

# Without an accepted bound, the first probe keeps this share of the refused demand.
BLIND_SHARE: Final = 0.75
# Bisection stops when the gap between the bounds is this share of the upper one.
CONVERGED_SHARE: Final = 1 / 32
# Our count and the upstream's may differ by the tokenizer: a stated window this far below
# what the model already accepted, or a stated prompt this far from what was sent, is an echo.
UNIT_SLACK: Final = 0.8
PROMPT_RATIO_LIMIT: Final = 2.0
# A refusal stating no window below this share of the model's known window is not believed.
MIN_REFUSED_SHARE: Final = 0.5
# A rising accepted bound is written to the store only after growing this share of the window
# estimate: a growing conversation would otherwise write on every turn.
PERSIST_GROWTH: Final = 1 / 64

LEARNED_PREFIX: Final = "window:learned:"


def learned_key(model: str) -> str:
    return LEARNED_PREFIX + model


@dataclass(frozen=True, slots=True)
class Evidence:
    stated: int | None = None
    accepted: int | None = None
    refused: int | None = None
    # Wall-clock seconds (shared by replicas through the store).
    expires_at: float = 0.0

    def estimate(self) -> int | None:
        """The demand the next request may make, or None when nothing bounds the window."""
        if self.stated is not None:
            return self.stated
        if self.refused is None:
            return None
        lower = self.accepted or 0
        if self.converged():
            return lower
        return max(lower + (self.refused - lower) // 2, int(self.refused * BLIND_SHARE))

    def converged(self) -> bool:
        """Stated, or bounds close enough that the accepted one is the estimate."""
        if self.stated is not None:
            return True
        return (
            self.refused is not None and self.refused - (self.accepted or 0) <= self.refused * CONVERGED_SHARE
        )

    def to_json(self) -> str:
        return orjson.dumps(
            {
                "stated": self.stated,
                "accepted": self.accepted,
                "refused": self.refused,
                "expires_at": self.expires_at,
            }
        ).decode()

    @classmethod
    def from_json(cls, raw: str) -> Evidence | None:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(data, dict):
            return None
        expires_at = data.get("expires_at")
        return cls(
            stated=_positive(data.get("stated")),
            accepted=_positive(data.get("accepted")),
            refused=_positive(data.get("refused")),
            expires_at=float(expires_at) if isinstance(expires_at, int | float) else 0.0,
        )


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass(frozen=True, slots=True)
class Refusal:
    """What the gateway knows of one refused request, in its own token units where it counted."""

    demand: int
    prompt_tokens: int
    stated_window: int | None
    stated_prompt: int | None
    stated_output: int | None
    # The window the gateway used for this model before the refusal (config, discovered or the
    # model map), if any.
    expected_window: int | None = None


def judge(refusal: Refusal, known: Evidence | None, *, floor: int) -> int | None:
    """The stated window if it is plausible, else None.

    Implausible: below the floor; not explaining the refusal (the stated prompt and output
    fit in it); about a prompt of a very different size than the one sent (an echo of some
    other number); far above what was sent. A window below a demand the model already
    accepted is believed only when the message also states the prompt it refused (a
    redeployed server with a shorter window says both); otherwise it is an echo.
    """
    window = refusal.stated_window
    if window is None or window < floor or window > refusal.demand * PROMPT_RATIO_LIMIT:
        return None
    if refusal.stated_prompt is None:
        accepted = known.accepted if known is not None else None
        return None if accepted is not None and window < accepted * UNIT_SLACK else window
    if refusal.stated_prompt + (refusal.stated_output or 0) <= window:
        return None
    ratio = refusal.stated_prompt / max(1, refusal.prompt_tokens)
    return window if 1 / PROMPT_RATIO_LIMIT <= ratio <= PROMPT_RATIO_LIMIT else None


class LearnedWindows:
    """Evidence per model: an LRU in memory, mirrored to the store with a TTL on every key."""

    def __init__(self, *, max_models: int = 10_000, ttl_seconds: int = 86_400, floor: int = 1_024) -> None:
        self.ttl_seconds = max(1, ttl_seconds)
        self.floor = floor
        self._evidence: ExpiringLRU[Evidence] = ExpiringLRU(max_models)
        # The accepted bound last written per model, so a growing one is written now and then.
        self._persisted: ExpiringLRU[int] = ExpiringLRU(max_models)

    def __len__(self) -> int:
        return len(self._evidence)

    def get(self, model: str) -> Evidence | None:
        return self._evidence.get(model)

    def estimate(self, model: str) -> int | None:
        evidence = self.get(model)
        return None if evidence is None else evidence.estimate()

    def put(self, model: str, evidence: Evidence) -> None:
        self._evidence.put(model, evidence, evidence.expires_at)

    def forget(self, model: str) -> None:
        self._evidence.pop(model)
        self._persisted.pop(model)

    def _renewed(self, model: str) -> Evidence:
        return replace(self.get(model) or Evidence(), expires_at=time.time() + self.ttl_seconds)

    def refused(self, model: str, refusal: Refusal) -> int | None:
        """Record an overflow; returns the stated window when it was judged plausible.

        An implausible statement teaches nothing (the message is suspect as a whole); a refusal
        that states no window bounds it from above when plausible (`_plausible_bound`).
        """
        known = self.get(model)
        window = judge(refusal, known, floor=self.floor)
        evidence = self._renewed(model)
        if window is not None:
            accepted = evidence.accepted if evidence.accepted is None or evidence.accepted <= window else None
            evidence = replace(evidence, stated=window, accepted=accepted, refused=None)
        elif refusal.stated_window is None and self._plausible_bound(refusal):
            accepted = evidence.accepted
            if accepted is not None and accepted >= refusal.demand:
                accepted = None  # the window shrank (a redeployed server): the old bound is stale
            refused = min(refusal.demand, evidence.refused or refusal.demand)
            evidence = replace(evidence, stated=None, accepted=accepted, refused=refused)
        else:
            return None
        self.put(model, evidence)
        return window

    def _plausible_bound(self, refusal: Refusal) -> bool:
        """A refusal stating no window bounds it only when it is not below the floor, nor far below
        the window the model is otherwise known to have (one odd error must not cap a model)."""
        if refusal.demand < self.floor:
            return False
        expected = refusal.expected_window
        return expected is None or refusal.demand >= expected * MIN_REFUSED_SHARE

    def accepted(self, model: str, demand: int) -> bool:
        """Record an accepted request; True when the change is worth writing to the store."""
        known = self.get(model)
        if known is not None and known.accepted is not None and known.accepted >= demand:
            return False
        evidence = replace(self._renewed(model), accepted=demand)
        if evidence.refused is not None and demand >= evidence.refused:
            evidence = replace(evidence, refused=None)  # the window grew: the old bound is stale
        if evidence.stated is not None and demand * UNIT_SLACK > evidence.stated:
            # The upstream accepted well over its stated window (our count may run a little
            # high for tokenizers we estimate): the statement is stale.
            evidence = replace(evidence, stated=None)
        self.put(model, evidence)
        if evidence.stated is None and evidence.refused is None:
            # Nothing bounds the window from above: the lower bound matters only in memory,
            # for the first overflow's retry (unless it just cleared a stored bound).
            return known is not None and known.estimate() is not None
        last = self._persisted.get(model) or 0
        return demand - last >= (evidence.estimate() or demand) * PERSIST_GROWTH

    async def load(self, store: Store, model: str) -> None:
        """Adopt the store's evidence for ``model`` (another replica's); drop ours when the shared
        store has none any more (`windows forget`, or expired there). A process-local store only
        loses a key to its own bound: that is no forget, and what was learned stays."""
        raw = await store.get(learned_key(model))
        stored = None if raw is None else Evidence.from_json(raw)
        if stored is None or stored.expires_at <= time.time():
            known = self.get(model)
            if raw is None and store.shared and known is not None and (known.stated or known.refused):
                self.forget(model)
            return
        self.put(model, stored)
        if stored.accepted is not None:
            self._persisted.put(model, stored.accepted, stored.expires_at)

    async def save(self, store: Store, model: str) -> None:
        evidence = self.get(model)
        if evidence is None:
            return
        ttl = max(1, int(evidence.expires_at - time.time()))
        await store.set(learned_key(model), evidence.to_json(), ttl_seconds=ttl)
        if evidence.accepted is not None:
            self._persisted.put(model, evidence.accepted, evidence.expires_at)
