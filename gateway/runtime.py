"""What one running gateway holds: settings, the upstream client, the store, learned state."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from gateway import metrics
from gateway.overflow import Overflow, detect_silent_truncation
from gateway.settings import Settings
from gateway.store import Store, open_store
from gateway.tokens.calibration import MAX_MODELS, Calibration
from gateway.tokens.counter import CALIBRATION, counter_for
from gateway.tokens.windows import LearnedWindows, WindowResolver
from gateway.upstream import Upstream

log = logging.getLogger("gateway")

# Persist a model's calibration on its first sample and every this many after.
CALIBRATION_SAVE_EVERY = 10


@dataclass
class Runtime:
    settings: Settings
    upstream: Upstream
    store: Store
    windows: WindowResolver
    calibration: Calibration
    # Fire-and-forget store writes, held so they are not garbage-collected mid-flight.
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    # Models whose learned state this process read from the store, most recent last (bounded:
    # model names come from clients; an evicted one is simply read again).
    _loaded: OrderedDict[str, None] = field(default_factory=OrderedDict)

    @classmethod
    def create(cls, settings: Settings) -> Runtime:
        return cls(
            settings=settings,
            upstream=Upstream(settings.upstream),
            store=open_store(settings.redis_url),
            windows=WindowResolver(overrides=settings.window_overrides(), learned=LearnedWindows()),
            calibration=CALIBRATION,
        )

    async def start(self) -> None:
        await self.upstream.start()

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.upstream.close()
        await self.store.close()

    async def load_learned(self, model: str) -> None:
        """Once per model and process: adopt what other replicas learned (window, calibration)."""
        if model in self._loaded:
            self._loaded.move_to_end(model)
            return
        self._loaded[model] = None
        if len(self._loaded) > MAX_MODELS:
            self._loaded.popitem(last=False)
        try:
            await self.windows.learned.load(self.store, model)
            await self.calibration.load(self.store, model)
        except Exception as exc:  # a store outage must not fail requests
            log.warning("could not read learned state for %s: %s", model, type(exc).__name__)

    async def learn_from_overflow(self, model: str, overflow: Overflow) -> None:
        """Remember a window the upstream stated, so later requests fit ahead of time."""
        if overflow.window is None:
            return
        self.windows.learned.learn(model, overflow.window)
        self.in_background(self.windows.learned.save(self.store, model))

    def observe_usage(self, model: str, estimated: int, reported: int | None) -> bool:
        """Learn from the upstream's own prompt count; True when it shows a silent truncation."""
        if reported is None:
            return False
        if detect_silent_truncation(estimated, reported):
            metrics.SILENT_TRUNCATIONS.labels(self.model_label(model)).inc()
            log.warning("upstream for %s counted %d prompt tokens of ~%d sent", model, reported, estimated)
            return True
        if not counter_for(model).exact:
            self.calibration.observe(model, estimated, reported)
            if self.calibration.samples(model) % CALIBRATION_SAVE_EVERY == 1:
                self.in_background(self.calibration.save(self.store, model))
        return False

    def model_label(self, model: str) -> str:
        """A metric label value: models the operator or litellm's map knows by name, else "other".

        Clients invent model names at will; each label value is a time series forever.
        """
        return model if self.windows.known(model) else "other"

    def in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a store write without holding up the answer; failures are logged, never raised."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("background store write failed: %s", type(task.exception()).__name__)
