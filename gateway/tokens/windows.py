"""Context windows: how many tokens a model accepts, where that number came from,
and how much of it the prompt may use.

Resolution order (`WindowResolver.resolve_window`):

1. `config`: an explicit override from the operator's configuration;
2. `learned`: a window taught by an upstream "context length exceeded" error
   for that model, persisted in the store (`LearnedWindows`);
3. `model_map`: litellm's bundled model map (`max_input_tokens`, else
   `max_tokens`), read as JSON without importing litellm (seconds of import
   and ~165 MB, against ~0.03 s and a small dict of ints here);
4. `unknown`: no number; the caller forwards as is and learns from errors.

Config and model-map lookups try the name as given, then with provider
prefixes stripped one at a time (`openrouter/openai/gpt-4o` → `openai/gpt-4o`
→ `gpt-4o`), then the same in lower case.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from gateway.offline import litellm_package_dir
from gateway.store.base import Store

MODEL_MAP_FILE: Final = "model_prices_and_context_window_backup.json"

WindowSource = Literal["config", "learned", "model_map", "unknown"]


@dataclass(frozen=True, slots=True)
class ResolvedWindow:
    tokens: int | None
    source: WindowSource


def _positive_int(value: object) -> int | None:
    # bool is an int subclass; `true` is not a token count.
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def candidate_names(model: str) -> list[str]:
    """`a/b/c` → [`a/b/c`, `b/c`, `c`], then lower-case variants, without repeats."""
    names: list[str] = []
    for spelling in (model, model.lower()):
        parts = spelling.split("/")
        for start in range(len(parts)):
            name = "/".join(parts[start:])
            if name and name not in names:
                names.append(name)
    return names


def _first(table: Mapping[str, int], model: str) -> int | None:
    for name in candidate_names(model):
        window = table.get(name)
        if window is not None:
            return window
    return None


class ModelMap:
    """Windows from litellm's local model map, loaded lazily once.

    Only `name → window` is kept: the parsed 3 MB JSON (~18 MB of objects)
    is dropped as soon as the windows are extracted.
    """

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._windows: dict[str, int] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_windows(cls, windows: Mapping[str, int]) -> ModelMap:
        model_map = cls()
        model_map._windows = dict(windows)
        return model_map

    def get(self, model: str) -> int | None:
        return _first(self.windows(), model)

    def windows(self) -> dict[str, int]:
        if self._windows is None:
            with self._lock:
                if self._windows is None:
                    self._windows = self._load()
        return self._windows

    def _load(self) -> dict[str, int]:
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
        return extract_windows(data) if isinstance(data, dict) else {}


def extract_windows(entries: Mapping[str, Any]) -> dict[str, int]:
    """`max_input_tokens`, else `max_tokens`, for every entry that has a usable one."""
    windows: dict[str, int] = {}
    for name, entry in entries.items():
        if isinstance(entry, dict):
            window = _positive_int(entry.get("max_input_tokens")) or _positive_int(entry.get("max_tokens"))
            if window is not None:
                windows[name] = window
    return windows


def window_store_key(model: str) -> str:
    return f"window:{model}"


class LearnedWindows:
    """Windows reported by upstream overflow errors, per model name as sent.

    The latest report wins: it is the upstream's own statement of its limit.
    """

    def __init__(self) -> None:
        self._windows: dict[str, int] = {}

    def learn(self, model: str, window: int) -> None:
        if _positive_int(window) is not None:
            self._windows[model] = window

    def get(self, model: str) -> int | None:
        return self._windows.get(model)

    async def load(self, store: Store, model: str) -> None:
        raw = await store.get(window_store_key(model))
        window = _positive_int(int(raw)) if raw is not None and raw.strip().isdigit() else None
        if window is not None:
            self._windows[model] = window

    async def save(self, store: Store, model: str) -> None:
        window = self._windows.get(model)
        if window is not None:
            await store.set(window_store_key(model), str(window))


class WindowResolver:
    def __init__(
        self,
        overrides: Mapping[str, int] | None = None,
        learned: LearnedWindows | None = None,
        model_map: ModelMap | None = None,
    ) -> None:
        overrides = overrides or {}
        self._overrides = {name: window for name, window in overrides.items() if _positive_int(window)}
        self.learned = LearnedWindows() if learned is None else learned
        self.model_map = ModelMap() if model_map is None else model_map

    def known(self, model: str) -> bool:
        """Named in the configuration or in litellm's map: a bounded set of names."""
        return _first(self._overrides, model) is not None or self.model_map.get(model) is not None

    def resolve_window(self, model: str) -> ResolvedWindow:
        configured = _first(self._overrides, model)
        if configured is not None:
            return ResolvedWindow(configured, "config")
        learned = self.learned.get(model)
        if learned is not None:
            return ResolvedWindow(learned, "learned")
        mapped = self.model_map.get(model)
        if mapped is not None:
            return ResolvedWindow(mapped, "model_map")
        return ResolvedWindow(None, "unknown")


# With no max_tokens in the request, reserve at most this fraction (1/N) of the window.
UNSTATED_RESERVE_DIVISOR = 4


def output_reserve(body: Mapping[str, Any], default: int, window: int | None = None) -> int:
    """Tokens the answer may take: the request's `max_completion_tokens` or
    `max_tokens` (the larger, if a client sends both), else `default`.

    An unstated reserve is capped at a quarter of `window`: upstreams then
    let the answer take whatever the prompt leaves, and a fixed 4096 would
    eat half of an 8k local model's window for an answer nobody asked for.
    """
    requested = [
        value
        for value in (_positive_int(body.get("max_completion_tokens")), _positive_int(body.get("max_tokens")))
        if value is not None
    ]
    if requested:
        return max(requested)
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
