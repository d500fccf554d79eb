"""Ask the upstream itself how long a context it serves for a model.

Self-hosted servers state their window, and it is the one that counts (a vLLM started
with `--max-model-len 32768` refuses longer prompts whatever the model could do; an
Ollama model truncates at its configured `num_ctx`, silently). Probed concurrently, once
per model at first sight, within one short timeout; whichever answers wins, in this order:

- `GET {base}/models` (OpenAI shape): `max_model_len` (vLLM, SGLang), `context_length`
  and `top_provider.context_length` (OpenRouter), `context_window` (Groq),
  `loaded_context_length` / `max_context_length` (LM Studio);
- `GET {root}/api/v0/models/{model}` (LM Studio's REST API): the same two fields;
- `GET {root}/api/ps` (Ollama, loaded models): `context_length`, what the runner was
  started with; else `POST {root}/api/show`: `num_ctx` from the model's parameters, else
  the model's `*.context_length` capped at Ollama's smallest default (`OLLAMA_DEFAULT_CTX`):
  without `num_ctx` Ollama runs with its server default, not the model's maximum;
- `GET {root}/props` (llama.cpp server): `default_generation_settings.n_ctx`, the context
  of one slot.

Parsing is pure (`window_from_*`) and never raises on what a server sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, urlsplit

import orjson

# Ollama's default context when a model sets no num_ctx: 2048 before 0.6, then 4096 on small
# GPUs and more on large ones (docs/context-length): 4096 is the smallest current default.
OLLAMA_DEFAULT_CTX: Final = 4096
# Sane bounds for a stated window: anything else is not a token count.
MAX_WINDOW: Final = 100_000_000


@dataclass(frozen=True, slots=True)
class Discovered:
    window: int
    # Which server answered: vllm, openrouter, models (another OpenAI-shape list), lmstudio,
    # ollama, llamacpp.
    server: str


def _window(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_WINDOW:
        return value
    return None


def window_from_model_list(body: Any, model: str) -> Discovered | None:
    """The window a `/models` list states for ``model`` (matched by id, case-insensitively)."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    wanted = model.lower()
    for card in data:
        if isinstance(card, dict) and isinstance(card.get("id"), str) and card["id"].lower() == wanted:
            return window_from_model_card(card)
    return None


def window_from_model_card(card: Mapping[str, Any]) -> Discovered | None:
    vllm = _window(card.get("max_model_len"))
    if vllm is not None:
        return Discovered(vllm, "vllm")
    provider = card.get("top_provider")
    stated = [
        _window(card.get("context_length")),
        _window(provider.get("context_length")) if isinstance(provider, dict) else None,
    ]
    openrouter = [window for window in stated if window is not None]
    if openrouter:
        # The model's and its serving provider's limits: the smaller one refuses first.
        return Discovered(min(openrouter), "openrouter")
    lmstudio = _window(card.get("loaded_context_length")) or _window(card.get("max_context_length"))
    if lmstudio is not None:
        return Discovered(lmstudio, "lmstudio")
    groq = _window(card.get("context_window"))
    return None if groq is None else Discovered(groq, "models")


def window_from_ollama_ps(body: Any, model: str) -> Discovered | None:
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, list):
        return None
    wanted = {model, model if ":" in model else f"{model}:latest"}
    for entry in models:
        if isinstance(entry, dict) and (entry.get("name") in wanted or entry.get("model") in wanted):
            window = _window(entry.get("context_length"))
            if window is not None:
                return Discovered(window, "ollama")
    return None


def window_from_ollama_show(body: Any) -> Discovered | None:
    if not isinstance(body, dict):
        return None
    parameters = body.get("parameters")
    if isinstance(parameters, str):
        for line in parameters.splitlines():
            name, _, value = line.strip().partition(" ")
            if name == "num_ctx" and value.strip().isdigit():
                window = _window(int(value.strip()))
                if window is not None:
                    return Discovered(window, "ollama")
    info = body.get("model_info")
    if isinstance(info, dict):
        for key, value in info.items():
            window = _window(value)
            if isinstance(key, str) and key.endswith(".context_length") and window is not None:
                return Discovered(min(window, OLLAMA_DEFAULT_CTX), "ollama")
    return None


def window_from_llamacpp_props(body: Any) -> Discovered | None:
    if not isinstance(body, dict):
        return None
    settings = body.get("default_generation_settings")
    window = _window(settings.get("n_ctx")) if isinstance(settings, dict) else None
    window = window or _window(body.get("n_ctx"))
    return None if window is None else Discovered(window, "llamacpp")


DISCOVERED_PREFIX: Final = "window:discovered:"


def store_key(model: str) -> str:
    return DISCOVERED_PREFIX + model


def encode(found: Discovered | None, expires_at: float) -> str:
    """The store's record; a model with no stated window is recorded too, so no replica asks again."""
    window, server = (None, None) if found is None else (found.window, found.server)
    return orjson.dumps({"window": window, "server": server, "expires_at": expires_at}).decode()


def decode(raw: str) -> Discovered | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("server"), str):
        return None
    window = _window(data.get("window"))
    return None if window is None else Discovered(window, data["server"])


# (method, url, JSON body or None) → parsed JSON, or None on any failure.
FetchJson = Callable[[str, str, bytes | None], Awaitable[Any]]


def server_root(base_url: str) -> str:
    """`http://host:11434/v1` → `http://host:11434`: native APIs live beside the OpenAI one."""
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}"


def listing_urls(base_url: str) -> frozenset[str]:
    """The probed URLs whose answer lists every model (the rest are asked per model)."""
    return frozenset({f"{base_url.rstrip('/')}/models", f"{server_root(base_url)}/api/ps"})


async def discover_window(
    fetch: FetchJson, base_url: str, model: str, *, timeout: float
) -> Discovered | None:
    """Probe the upstream's model endpoints concurrently; the first in priority order that
    states a window wins. None when nothing does within ``timeout`` seconds."""
    base = base_url.rstrip("/")
    root = server_root(base_url)
    quoted = quote(model, safe="")

    async def models() -> Discovered | None:
        return window_from_model_list(await fetch("GET", f"{base}/models", None), model)

    async def lmstudio() -> Discovered | None:
        card = await fetch("GET", f"{root}/api/v0/models/{quoted}", None)
        return window_from_model_card(card) if isinstance(card, dict) else None

    async def ollama() -> Discovered | None:
        loaded = window_from_ollama_ps(await fetch("GET", f"{root}/api/ps", None), model)
        if loaded is not None:
            return loaded
        return window_from_ollama_show(
            await fetch("POST", f"{root}/api/show", orjson.dumps({"model": model}))
        )

    async def llamacpp() -> Discovered | None:
        return window_from_llamacpp_props(await fetch("GET", f"{root}/props", None))

    probes = [asyncio.ensure_future(probe()) for probe in (models, lmstudio, ollama, llamacpp)]
    try:
        async with asyncio.timeout(timeout):
            for probe in probes:
                found = await probe
                if found is not None:
                    return found
    except TimeoutError:
        return None
    finally:
        for probe in probes:
            probe.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
    return None
