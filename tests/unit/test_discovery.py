"""Parsing what upstream servers state about their windows; probing them within a deadline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.tokens.discovery import (
    OLLAMA_DEFAULT_CTX,
    Discovered,
    decode,
    discover_window,
    encode,
    server_root,
    window_from_llamacpp_props,
    window_from_model_list,
    window_from_ollama_ps,
    window_from_ollama_show,
)


def listing(*cards: dict[str, Any]) -> dict[str, Any]:
    return {"object": "list", "data": list(cards)}


def test_model_list_shapes() -> None:
    vllm = listing({"id": "meta-llama/Llama-3.1-8B-Instruct", "object": "model", "max_model_len": 32_768})
    assert window_from_model_list(vllm, "meta-llama/Llama-3.1-8B-Instruct") == Discovered(32_768, "vllm")
    assert window_from_model_list(vllm, "META-LLAMA/llama-3.1-8b-instruct") == Discovered(32_768, "vllm")
    openrouter = listing(
        {
            "id": "anthropic/claude-3.5-sonnet",
            "context_length": 200_000,
            "top_provider": {"context_length": 8_192},
        }
    )
    # The serving provider's limit is the one that refuses first.
    assert window_from_model_list(openrouter, "anthropic/claude-3.5-sonnet") == Discovered(
        8_192, "openrouter"
    )
    lmstudio = listing({"id": "qwen2-7b", "max_context_length": 32_768, "loaded_context_length": 4_096})
    assert window_from_model_list(lmstudio, "qwen2-7b") == Discovered(4_096, "lmstudio")
    groq = listing({"id": "llama-3.1-8b-instant", "context_window": 131_072})
    assert window_from_model_list(groq, "llama-3.1-8b-instant") == Discovered(131_072, "models")
    openai = listing({"id": "gpt-4o", "object": "model", "owned_by": "system"})
    assert window_from_model_list(openai, "gpt-4o") is None
    assert window_from_model_list(vllm, "other-model") is None


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "x",
        {"data": "x"},
        {"data": [1, None, {"id": 3}]},
        listing({"id": "m", "max_model_len": True}),
        listing({"id": "m", "max_model_len": -1}),
        listing({"id": "m", "max_model_len": 10**12}),
        listing({"id": "m", "max_model_len": "4096"}),
    ],
)
def test_model_list_junk_states_nothing(body: Any) -> None:
    assert window_from_model_list(body, "m") is None


def test_ollama_num_ctx_is_what_truncates() -> None:
    show = {
        "parameters": 'stop "<|eot_id|>"\nnum_ctx                        8192\ntemperature 0.6',
        "model_info": {"general.architecture": "llama", "llama.context_length": 131_072},
    }
    assert window_from_ollama_show(show) == Discovered(8_192, "ollama")
    # No num_ctx: Ollama runs the model with its server default, not the model's maximum.
    no_param = {"model_info": {"llama.context_length": 131_072}}
    assert window_from_ollama_show(no_param) == Discovered(OLLAMA_DEFAULT_CTX, "ollama")
    small = {"model_info": {"gemma.context_length": 2_048}}
    assert window_from_ollama_show(small) == Discovered(2_048, "ollama")
    assert window_from_ollama_show({"parameters": "num_ctx lots"}) is None
    assert window_from_ollama_show("oops") is None


def test_ollama_ps_reports_the_loaded_context() -> None:
    ps = {"models": [{"name": "llama3.1:8b", "model": "llama3.1:8b", "context_length": 16_384}]}
    assert window_from_ollama_ps(ps, "llama3.1:8b") == Discovered(16_384, "ollama")
    tagged = {"models": [{"name": "llama3.1:latest", "model": "llama3.1:latest", "context_length": 4_096}]}
    assert window_from_ollama_ps(tagged, "llama3.1") == Discovered(4_096, "ollama")
    assert window_from_ollama_ps(ps, "qwen2.5:7b") is None
    assert window_from_ollama_ps({"models": "no"}, "x") is None


def test_llamacpp_props() -> None:
    assert window_from_llamacpp_props({"default_generation_settings": {"n_ctx": 65_536}}) == Discovered(
        65_536, "llamacpp"
    )
    assert window_from_llamacpp_props({"n_ctx": 4_096}) == Discovered(4_096, "llamacpp")
    assert window_from_llamacpp_props({"default_generation_settings": []}) is None


def test_store_record_roundtrip() -> None:
    assert decode(encode(Discovered(4_096, "vllm"), 1.0)) == Discovered(4_096, "vllm")
    assert decode(encode(None, 1.0)) is None
    for junk in ("", "[]", '{"window": 5}', '{"window": "5", "server": "x"}', "{"):
        assert decode(junk) is None


def test_server_root() -> None:
    assert server_root("http://ollama:11434/v1") == "http://ollama:11434"
    assert server_root("https://openrouter.ai/api/v1/") == "https://openrouter.ai"


async def test_probes_run_concurrently_and_the_first_by_priority_wins() -> None:
    asked: list[str] = []

    async def fetch(method: str, url: str, body: bytes | None) -> Any:
        asked.append(f"{method} {url}")
        if url.endswith("/props"):
            return {"default_generation_settings": {"n_ctx": 2_048}}
        if url.endswith("/v1/models"):
            await asyncio.sleep(0.05)
            return listing({"id": "m", "max_model_len": 8_192})
        return None

    found = await discover_window(fetch, "http://up:8000/v1", "m", timeout=5)
    assert found == Discovered(8_192, "vllm")  # /v1/models outranks /props, though slower
    assert sorted(asked) == [
        "GET http://up:8000/api/ps",
        "GET http://up:8000/api/v0/models/m",
        "GET http://up:8000/props",
        "GET http://up:8000/v1/models",
        "POST http://up:8000/api/show",
    ]


async def test_a_silent_upstream_costs_at_most_the_timeout() -> None:
    async def fetch(method: str, url: str, body: bytes | None) -> Any:
        await asyncio.sleep(60)

    assert await discover_window(fetch, "http://up/v1", "m", timeout=0.05) is None


async def test_model_names_are_quoted_in_urls() -> None:
    asked: list[str] = []

    async def fetch(method: str, url: str, body: bytes | None) -> Any:
        asked.append(url)
        return None

    await discover_window(fetch, "http://up/v1", "../../admin?x=1#", timeout=1)
    assert "http://up/api/v0/models/..%2F..%2Fadmin%3Fx%3D1%23" in asked
