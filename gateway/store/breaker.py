"""A circuit breaker for calls to Redis: after a few failures in a row, leave it alone a while.

Closed, calls go through; open, they are skipped until the cooldown ends, then one is tried
again (half-open: the others keep being skipped until it succeeds, and one more failure opens
it again). Not opening on the first failure matters:
on a saturated machine one call can miss its bound because the event loop was late, not Redis;
opening then would hand the whole cooldown to the fallback (for team limits, memory, whose state
starts afresh: bench/budgets.py measured 2x the budget admitted that way, before replicas took
shares). One warning per breaker per `FAILURE_LOG_INTERVAL` at most.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("gateway.store")

# Failures in a row that open the circuit breaker.
BREAKER_THRESHOLD = 3
# At most one "unreachable" log line per breaker in this many seconds.
FAILURE_LOG_INTERVAL = 60.0


class CircuitBreaker:
    """`what`: the store it guards, as the warning names it."""

    def __init__(self, cooldown: float, what: str) -> None:
        self.cooldown = cooldown
        self.what = what
        self._open_until = 0.0
        self._failures = 0
        self._last_log = -FAILURE_LOG_INTERVAL

    def allows(self) -> bool:
        now = time.monotonic()
        if now < self._open_until:
            return False
        if self._open_until:  # half-open: this caller is the one try; the others wait for it
            self._open_until = now + self.cooldown
        return True

    def succeeded(self) -> None:
        self._failures = 0
        self._open_until = 0.0

    def failed(self, exc: BaseException, fallback: str) -> None:
        """Count a failure; `fallback`: what the callers do meanwhile, for the warning."""
        now = time.monotonic()
        self._failures += 1
        if self._failures >= BREAKER_THRESHOLD:
            self._open_until = now + self.cooldown
            self._failures = BREAKER_THRESHOLD - 1  # half-open after the cooldown
        if now - self._last_log >= FAILURE_LOG_INTERVAL:
            self._last_log = now
            log.warning(
                "%s unreachable (%s): %s for %gs", self.what, type(exc).__name__, fallback, self.cooldown
            )
