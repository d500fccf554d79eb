"""Context windows: how many tokens a model accepts, where that number came from,
and how much of it the prompt may use.

Resolution order (`WindowResolver.resolve_window`), first answer wins:

1. `config`: the operator's `models.<name>.context_window` (the name as sent, then with
   provider prefixes stripped, then in lower case);
2. `learned`: a window an upstream overflow error stated and the gateway judged plausible
   (`learned_windows.py`), shared through the store, expiring;
3. `bisected`: no window stated, but the upstream refused some demand and accepted a
   smaller one: the estimate between them (`learned_windows.Evidence.estimate`);
4. `discovered`: what the upstream's own model endpoints state (`discovery.py`);
5. `model_map`: litellm's bundled model map, found under the spelling apps send
   (`model_names.py`), read as JSON without importing litellm (seconds of import and
   ~165 MB, against ~0.1 s and a few MB here);
6. `unknown`: no number; the request is forwarded as is and the window is learned from
   the upstream's overflow error.

Learned and discovered windows beat the model map: they are what this upstream serves
(a vLLM with a shorter `--max-model-len`, an Ollama `num_ctx`), not the model's maximum.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from gateway.offline import litellm_package_dir
from gateway.tokens.discovery import Discovered
from gateway.tokens.expiring import ExpiringLRU
from gateway.tokens.learned_windows import LearnedWindows
from gateway.tokens.model_names import ModelNameIndex, first_suffix_match

MODEL_MAP_FILE: Final = "model_prices_and_context_window_backup.json"
# Resolutions of names against config and the model map, kept per resolver (bounded: names
# come from clients).
STATIC_CACHE_SIZE: Final = 4096

WindowSource = Literal["config", "learned", "bisected", "discovered", "model_map", "unknown"]


@dataclass(frozen=True, slots=True)
class ResolvedWindow:
    tokens: int | None
    source: WindowSource
    # How it was found: the model-map match level, or the server that stated it.
    detail: str = ""


def _positive_int(value: object) -> int | None:
    # bool is an int subclass; `true` is not a token count.
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class ModelMap:
    """Windows from litellm's local model map, indexed once (see `model_names.py`).

    The parsed 3 MB JSON (~18 MB of objects) is dropped as soon as the index is built.
    """

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._index: ModelNameIndex | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_windows(cls, windows: Mapping[str, int]) -> ModelMap:
        model_map = cls()
        model_map._index = ModelNameIndex.from_windows(windows)
        return model_map

    def get(self, model: str) -> int | None:
        match = self.index().lookup(model)
        return None if match is None else match.window

    def windows(self) -> Mapping[str, int]:
        return self.index().windows

    def index(self) -> ModelNameIndex:
        if self._index is None:
            with self._lock:
                if self._index is None:
                    self._index = ModelNameIndex(self._load())
        return self._index

    def _load(self) -> dict[str, Any]:
        path = self._path
        if path is None:
            package_dir = litellm_package_dir()
            if package_dir is None:
                return {}
            path = package_dir / MODEL_MAP_FILE
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}


class WindowResolver:
    def __init__(
        self,
        overrides: Mapping[str, int] | None = None,
        learned: LearnedWindows | None = None,
        model_map: ModelMap | None = None,
        discovered: ExpiringLRU[Discovered] | None = None,
    ) -> None:
        overrides = overrides or {}
        self._overrides = {name: window for name, window in overrides.items() if _positive_int(window)}
        self._override_segments = 1 + max((name.count("/") for name in self._overrides), default=0)
        self.learned = LearnedWindows() if learned is None else learned
        self.model_map = ModelMap() if model_map is None else model_map
        self.discovered: ExpiringLRU[Discovered] = (
            ExpiringLRU(STATIC_CACHE_SIZE) if discovered is None else discovered
        )
        self._static: OrderedDict[str, ResolvedWindow] = OrderedDict()

    def known(self, model: str) -> bool:
        """Named, exactly, in the configuration or in litellm's map: a bounded set of names
        (the fuzzy spellings `resolve_window` accepts are not: any number of them match)."""
        return model in self._overrides or model in self.model_map.windows()

    def resolve_window(self, model: str) -> ResolvedWindow:
        static = self._resolve_static(model)
        if static.source == "config":
            return static
        evidence = self.learned.get(model)
        if evidence is not None:
            if evidence.stated is not None:
                return ResolvedWindow(evidence.stated, "learned", "stated by an overflow error")
            estimate = evidence.estimate()
            if estimate is not None:
                return ResolvedWindow(
                    estimate, "bisected", "converged" if evidence.converged() else "probing"
                )
        found = self.discovered.get(model)
        if found is not None:
            return ResolvedWindow(found.window, "discovered", found.server)
        return static

    def reference_window(self, model: str) -> int | None:
        """What the model is known to have apart from overflow errors: config, discovered, map."""
        static = self._resolve_static(model)
        if static.source == "config":
            return static.tokens
        found = self.discovered.get(model)
        return found.window if found is not None else static.tokens

    def configured(self, model: str) -> int | None:
        return first_suffix_match(self._overrides, model, self._override_segments)

    def _resolve_static(self, model: str) -> ResolvedWindow:
        """Config, else the model map: pure functions of the name, so cached (LRU)."""
        cached = self._static.get(model)
        if cached is not None:
            self._static.move_to_end(model)
            return cached
        configured = self.configured(model)
        if configured is not None:
            resolved = ResolvedWindow(configured, "config")
        else:
            match = self.model_map.index().lookup(model)
            resolved = (
                ResolvedWindow(None, "unknown")
                if match is None
                else ResolvedWindow(match.window, "model_map", match.level)
            )
        self._static[model] = resolved
        if len(self._static) > STATIC_CACHE_SIZE:
            self._static.popitem(last=False)
        return resolved


def requested_output(body: Mapping[str, Any]) -> int | None:
    """The request's `max_completion_tokens` or `max_tokens` (the larger, if a client sends both)."""
    requested = [
        value
        for value in (_positive_int(body.get("max_completion_tokens")), _positive_int(body.get("max_tokens")))
        if value is not None
    ]
    return max(requested) if requested else None


# With no max_tokens in the request, reserve at most this fraction (1/N) of the window.
UNSTATED_RESERVE_DIVISOR = 4


def output_reserve(body: Mapping[str, Any], default: int, window: int | None = None) -> int:
    """Tokens the answer may take: the request's `max_completion_tokens` or
    `max_tokens` (the larger, if a client sends both), else `default`.

    An unstated reserve is capped at a quarter of `window`: upstreams then
    let the answer take whatever the prompt leaves, and a fixed 4096 would
    eat half of an 8k local model's window for an answer nobody asked for.
    """
    requested = requested_output(body)
    if requested is not None:
        return requested
    return default if window is None else min(default, window // UNSTATED_RESERVE_DIVISOR)


def usable_budget(
    window: int, body: Mapping[str, Any], *, default_output_reserve: int, safety_margin: int
) -> int:
    """Prompt tokens that fit: window − output reserve − safety margin (≥ 0).

    The window is treated as shared by prompt and answer, whatever its source:

    - OpenAI rejects a request when prompt + `max_tokens` exceeds the context
      length ("maximum context length is 128000 tokens. However, you requested
      … (X in the messages, Y in the completion)"), and Anthropic validates
      input + `max_tokens` against the context window the same way; a window
      from config or learned from such an error is that context length.
    - litellm's `max_input_tokens` is the whole context for most models
      (gpt-4o: 128000, with 16384 of output inside it; Claude: 200000) but a
      separate input limit for a few (gpt-5: 272000 input + 128000 output).
      The map cannot tell them apart. Subtracting the reserve is exact for
      the first kind and, for the second, gives up at most the reserve in
      headroom — never an overflow — so it is the safe reading of both.
    """
    return max(0, window - output_reserve(body, default_output_reserve, window) - safety_margin)
