"""What one running gateway holds: settings, the upstream client, the store, learned state."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway import metrics
from gateway.compress import CompressionOptions
from gateway.policy.enforcer import Policy, Team
from gateway.proxy.alternation import AlternatingModels
from gateway.proxy.overflow import detect_silent_truncation
from gateway.proxy.upstream import Upstream
from gateway.settings import Settings
from gateway.store import Store, open_store
from gateway.store.redis import StoreSkipped
from gateway.summarize import Summarizer
from gateway.summarize.ahead import SummariesAhead
from gateway.tokens import discovery
from gateway.tokens.calibration import MAX_MODELS, Calibration
from gateway.tokens.counter import CALIBRATION, counter_for
from gateway.tokens.discovery import discover_window
from gateway.tokens.expiring import ExpiringLRU
from gateway.tokens.learned_windows import LearnedWindows, Refusal
from gateway.tokens.windows import WindowResolver

log = logging.getLogger("gateway")

# Persist a model's calibration on its first sample and every this many after.
CALIBRATION_SAVE_EVERY = 10
# Largest model-list body read during discovery (OpenRouter's list is a few hundred KB).
DISCOVERY_MAX_BYTES = 8 * 1024 * 1024
# How long a fetched model list answers discovery for other models.
LISTING_CACHE_SECONDS = 60.0
# Discoveries in flight at once, over all models.
MAX_CONCURRENT_DISCOVERIES = 8
# Request headers that authenticate the gateway's own discovery requests to the upstream.
DISCOVERY_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})


@dataclass
class Runtime:
    settings: Settings
    upstream: Upstream
    store: Store
    windows: WindowResolver
    calibration: Calibration
    policy: Policy
    summarizer: Summarizer | None = None  # compression.summarizer, when a model is configured
    summaries_ahead: SummariesAhead | None = None  # its start before the first drop (start_ratio)
    # Fire-and-forget store writes, held so they are not garbage-collected mid-flight.
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    # Models whose calibration this process read from the store, most recent last (bounded:
    # model names come from clients; an evicted one is simply read again).
    _loaded: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # Models whose learned window was read from the store lately (entries expire after
    # windows.store_refresh_seconds), and when each sighted model's discovered window is
    # refreshed next (in the background); bounded LRUs.
    _refreshed: ExpiringLRU[bool] = field(init=False)
    _discovery_done: ExpiringLRU[float] = field(init=False)
    # Reads of learned state in flight: concurrent requests for a model wait for the one read
    # instead of planning without what it brings (a worker's first burst would overflow again).
    _loading: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # One discovery per model at a time, whatever the number of concurrent first requests.
    _discovering: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # The upstream's model lists (at most two URLs), with the time they go stale.
    _listings: dict[str, tuple[float, Any]] = field(default_factory=dict)
    # Models whose upstream refused two user messages in a row (gateway/alternation.py).
    alternating: AlternatingModels = field(default_factory=AlternatingModels)

    def __post_init__(self) -> None:
        self._refreshed = ExpiringLRU(self.settings.windows.max_models)
        self._discovery_done = ExpiringLRU(self.settings.windows.max_models)

    @classmethod
    def create(cls, settings: Settings) -> Runtime:
        cfg = settings.windows
        learned = LearnedWindows(
            max_models=cfg.max_models, ttl_seconds=cfg.learned_ttl_seconds, floor=cfg.min_plausible_window
        )
        policy = settings.policy  # one bound for every call to Redis on the request path
        store = open_store(settings.redis_url, timeout=policy.store_timeout, cooldown=policy.breaker_cooldown)
        summarizer = (
            Summarizer(settings.compression.summarizer, settings.upstream, store)
            if settings.compression.summarizer.model
            else None
        )
        return cls(
            settings=settings,
            upstream=Upstream(settings.upstream),
            store=store,
            windows=WindowResolver(
                overrides=settings.window_overrides(), learned=learned, discovered=ExpiringLRU(cfg.max_models)
            ),
            calibration=CALIBRATION,
            policy=Policy(settings.teams, settings.policy, settings.redis_url),
            summarizer=summarizer,
            summaries_ahead=None if summarizer is None else SummariesAhead(summarizer, settings.compression),
        )

    async def start(self) -> None:
        await self.upstream.start()
        await self.policy.start()

    async def close(self) -> None:
        if self._discovering:  # each bounded by windows.discovery_timeout
            await asyncio.gather(*self._discovering.values(), return_exceptions=True)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.upstream.close()
        if self.summarizer is not None:
            await self.summarizer.close()
        await self.store.close()
        await self.policy.close()

    def compression(self, model: str) -> CompressionOptions:
        """The compression options a request for `model` is fitted with."""
        return self.alternating.options(model, self.settings.compression)

    def upstream_key(self, team: Team | None) -> str | None:
        """The key the gateway sends upstream: the team's own, else the configured one, else none."""
        if team is not None and team.settings.upstream_api_key:
            return team.settings.upstream_api_key
        return self.settings.upstream.api_key

    async def load_learned(self, model: str) -> None:
        """Adopt what other replicas learned: the window every `windows.store_refresh_seconds`
        (so a `windows forget` reaches every replica), the calibration once per model and process."""
        loading = self._loading.get(model)
        if loading is None:
            if model in self._refreshed and model in self._loaded:
                self._loaded.move_to_end(model)
                return
            loading = asyncio.ensure_future(self._load(model))
            self._loading[model] = loading
            loading.add_done_callback(lambda _: self._loading.pop(model, None))
        # Shielded: one caller going away must not cancel the read the others wait for.
        await asyncio.shield(loading)

    async def _load(self, model: str) -> None:
        try:
            if model not in self._refreshed:
                self._refreshed.put(model, True, time.time() + self.settings.windows.store_refresh_seconds)
                await self.windows.learned.load(self.store, model)
            if model in self._loaded:
                self._loaded.move_to_end(model)
                return
            self._loaded[model] = None
            if len(self._loaded) > MAX_MODELS:
                self._loaded.popitem(last=False)
            await self.calibration.load(self.store, model)
        except Exception as exc:  # a store outage must not fail requests
            metrics.STORE_ERRORS.labels("read").inc()
            if not isinstance(exc, StoreSkipped):
                log.warning("could not read learned state for %s: %s", model, type(exc).__name__)

    async def discover(self, model: str, headers: list[tuple[str, str]]) -> None:
        """At a model's first sight in this process: the window another replica discovered, else
        ask the upstream (bounded by `windows.discovery_timeout`). Afterwards the answer is in
        memory, and it is re-read (store, then upstream once expired) in the background."""
        cfg = self.settings.windows
        if not cfg.discovery:
            return
        refresh_at = self._discovery_done.get(model)
        if refresh_at is not None and refresh_at > time.time():
            return
        running = self._discovering.get(model)
        if running is None and len(self._discovering) >= MAX_CONCURRENT_DISCOVERIES:
            # A flood of new names must not multiply upstream requests: these go undiscovered
            # (model map, learning) and are asked about at a later sight.
            return
        if running is None:
            credentials = {
                name.lower(): value for name, value in headers if name.lower() in DISCOVERY_HEADERS
            }
            running = asyncio.ensure_future(self._discover(model, credentials))
            self._discovering[model] = running
            running.add_done_callback(lambda task: self._discovered(model, task))
        if refresh_at is None:
            await asyncio.shield(running)

    def _discovered(self, model: str, task: asyncio.Task[None]) -> None:
        self._discovering.pop(model, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("window discovery for %.100r failed: %s", model, type(task.exception()).__name__)

    async def _discover(self, model: str, credentials: Mapping[str, str]) -> None:
        cfg = self.settings.windows
        expires_at = time.time() + cfg.discovery_ttl_seconds
        try:
            stored = await self.store.get(discovery.store_key(model))
        except Exception as exc:
            if not isinstance(exc, StoreSkipped):
                log.warning("could not read the discovered window for %.100r: %s", model, type(exc).__name__)
            stored = None
        if stored is not None:
            found, known = discovery.decode(stored), True
        else:
            base_url = self.settings.upstream.base_url
            listings = discovery.listing_urls(base_url)

            async def fetch(method: str, url: str, body: bytes | None) -> Any:
                # The model lists serve every model: one fetch a minute, not one per new name
                # (OpenRouter's is hundreds of KB).
                cached = self._listings.get(url)
                if cached is not None and cached[0] > time.monotonic():
                    return cached[1]
                answer = await self.upstream.fetch_json(
                    method, url, credentials, body, max_bytes=DISCOVERY_MAX_BYTES
                )
                if url in listings:
                    self._listings[url] = (time.monotonic() + LISTING_CACHE_SECONDS, answer)
                return answer

            found = await discover_window(fetch, base_url, model, timeout=cfg.discovery_timeout)
            known = False
        # Sighted for as long as the LRU keeps it; refreshed in the background after this time.
        refresh_at = time.time() + min(cfg.store_refresh_seconds, cfg.discovery_ttl_seconds)
        self._discovery_done.put(model, refresh_at, math.inf)
        if found is None:
            self.windows.discovered.pop(model)
        else:
            self.windows.discovered.put(model, found, expires_at)
        if not known:
            self.in_background(
                self.store.set(
                    discovery.store_key(model),
                    discovery.encode(found, expires_at),
                    ttl_seconds=cfg.discovery_ttl_seconds,
                )
            )

    def learn_from_overflow(self, model: str, refusal: Refusal) -> int | None:
        """Record a refused request; the stated window when it is believed (see learned_windows.judge)."""
        window = self.windows.learned.refused(model, refusal)
        if window is not None:
            kind = "stated"
        elif refusal.stated_window is not None:
            kind = "implausible"
            log.warning(
                "ignored an implausible stated window of %d tokens for %.100r", refusal.stated_window, model
            )
        else:
            kind = "refused"
        metrics.WINDOW_EVIDENCE.labels(kind).inc()
        self.in_background(self.windows.learned.save(self.store, model))
        return window

    def learn_from_success(self, model: str, demand: int) -> None:
        """An accepted request is a lower bound on the window (what bisection starts from)."""
        if self.windows.learned.accepted(model, demand):
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
        if not task.cancelled() and (failure := task.exception()) is not None:
            metrics.STORE_ERRORS.labels("write").inc()
            if not isinstance(failure, StoreSkipped):
                log.warning("background store write failed: %s", type(failure).__name__)
