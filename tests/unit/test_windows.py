"""Context-window resolution and the usable prompt budget."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.tokens.learned_windows import Evidence, LearnedWindows
from gateway.tokens.model_names import ModelNameIndex, suffixes
from gateway.tokens.windows import (
    ModelMap,
    ResolvedWindow,
    WindowResolver,
    output_reserve,
    usable_budget,
)

MAP = ModelMap.from_windows({"gpt-4o": 128_000, "openai/special": 50_000, "claude-x": 200_000})


def _stated(window: int) -> Evidence:
    return Evidence(stated=window, expires_at=time.time() + 60)


def test_resolution_order() -> None:
    learned = LearnedWindows()
    resolver = WindowResolver({"gpt-4o": 64_000}, learned, MAP)
    assert resolver.resolve_window("gpt-4o") == ResolvedWindow(64_000, "config")
    assert resolver.resolve_window("claude-x") == ResolvedWindow(200_000, "model_map", "exact")
    learned.put("claude-x", _stated(180_000))
    assert resolver.resolve_window("claude-x").source == "learned"
    assert resolver.resolve_window("claude-x").tokens == 180_000
    learned.put("gpt-4o", _stated(100_000))
    assert resolver.resolve_window("gpt-4o") == ResolvedWindow(64_000, "config")  # config still wins
    assert resolver.resolve_window("mystery-model") == ResolvedWindow(None, "unknown")


def test_provider_prefixes_are_stripped_progressively() -> None:
    assert suffixes("openrouter/openai/GPT-4o", 5) == ["openrouter/openai/GPT-4o", "openai/GPT-4o", "GPT-4o"]
    # Suffixes longer than any key are never tried: linear work on hostile names.
    assert suffixes("a/b/c/d", 2) == ["c/d", "d"]
    resolver = WindowResolver({"my-model": 8_000}, LearnedWindows(), MAP)
    assert resolver.resolve_window("openrouter/openai/gpt-4o").tokens == 128_000
    assert resolver.resolve_window("azure/GPT-4o").tokens == 128_000
    # The longest matching suffix wins: `openai/special` before a bare `special`.
    assert resolver.resolve_window("openrouter/openai/special").tokens == 50_000
    assert resolver.resolve_window("proxy/my-model") == ResolvedWindow(8_000, "config")


def test_invalid_overrides_are_ignored() -> None:
    resolver = WindowResolver({"gpt-4o": 0, "claude-x": True}, LearnedWindows(), MAP)
    assert resolver.resolve_window("gpt-4o").source == "model_map"
    assert resolver.resolve_window("claude-x").source == "model_map"


def test_litellm_bundled_map() -> None:
    resolver = WindowResolver()
    assert resolver.resolve_window("gpt-4o") == ResolvedWindow(128_000, "model_map", "exact")
    assert resolver.resolve_window("openai/gpt-4o").tokens == 128_000
    assert resolver.resolve_window("openrouter/openai/gpt-4o").tokens == 128_000
    # gpt-5: max_input_tokens (272000) wins over max_tokens (the 128000 output limit).
    assert resolver.resolve_window("gpt-5").tokens == 272_000
    assert resolver.resolve_window("anthropic/claude-sonnet-4-5").tokens == 200_000
    assert resolver.resolve_window("no-such-model-xyz").source == "unknown"


def test_index_prefers_max_input_tokens_and_skips_junk() -> None:
    entries: dict[str, Any] = {
        "sample_spec": {
            "max_input_tokens": "max input tokens, if the provider specifies it",
            "max_tokens": "LEGACY",
        },
        "both": {"max_input_tokens": 272_000, "max_tokens": 128_000},
        "legacy": {"max_tokens": 4_096},
        "bool": {"max_input_tokens": True},
        "none": {"max_input_tokens": None},
        "zero": {"max_input_tokens": 0, "max_tokens": 2_048},
        "not-a-dict": 3,
    }
    assert dict(ModelNameIndex(entries).windows) == {"both": 272_000, "legacy": 4_096, "zero": 2_048}


def test_model_map_file_is_loaded_lazily_once(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"m": {"max_input_tokens": 1_000}}))
    model_map = ModelMap(path)
    first = model_map.index()
    path.write_text(json.dumps({"m": {"max_input_tokens": 2_000}}))
    assert model_map.get("m") == 1_000
    assert model_map.index() is first


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]"])
def test_missing_or_broken_model_map_resolves_nothing(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "map.json"
    if content is not None:
        path.write_text(content)
    assert ModelMap(path).get("gpt-4o") is None


@pytest.mark.parametrize(
    ("body", "reserve"),
    [
        ({}, 4_096),  # nothing requested: the configured default
        ({"max_tokens": 1_000}, 1_000),
        ({"max_completion_tokens": 2_000}, 2_000),
        ({"max_tokens": 1_000, "max_completion_tokens": 3_000}, 3_000),  # both: the larger
        ({"max_tokens": 5_000, "max_completion_tokens": 3_000}, 5_000),
        ({"max_tokens": None}, 4_096),
        ({"max_tokens": 0}, 4_096),
        ({"max_tokens": -1}, 4_096),
        ({"max_tokens": True}, 4_096),
        ({"max_tokens": "100"}, 4_096),
    ],
)
def test_output_reserve(body: dict[str, Any], reserve: int) -> None:
    assert output_reserve(body, 4_096) == reserve
    assert (
        usable_budget(128_000, body, default_output_reserve=4_096, safety_margin=500)
        == 128_000 - reserve - 500
    )


def test_budget_never_negative() -> None:
    assert usable_budget(8_000, {"max_tokens": 10_000}, default_output_reserve=1_000, safety_margin=100) == 0
    assert usable_budget(1_000, {"max_tokens": 1_000}, default_output_reserve=1_000, safety_margin=0) == 0


def test_unstated_reserve_is_capped_for_small_windows() -> None:
    # An 8k local model asked for no max_tokens keeps 3/4 of its window for the prompt.
    assert output_reserve({}, 4_096, window=8_192) == 2_048
    assert usable_budget(8_192, {}, default_output_reserve=4_096, safety_margin=0) == 6_144
    # A stated reserve is honoured whatever the window.
    assert usable_budget(8_192, {"max_tokens": 6_000}, default_output_reserve=4_096, safety_margin=0) == 2_192


def test_reserve_applies_to_model_map_windows_as_shared_context() -> None:
    # gpt-4o: 128000 is prompt + completion (OpenAI's overflow error counts both).
    window = WindowResolver().resolve_window("gpt-4o").tokens
    assert window is not None
    assert (
        usable_budget(window, {"max_tokens": 16_384}, default_output_reserve=4_096, safety_margin=0)
        == 111_616
    )
    # gpt-5: 272000 is an input limit; subtracting the reserve gives up headroom, never overflows.
    window = WindowResolver().resolve_window("gpt-5").tokens
    assert window is not None
    assert usable_budget(window, {}, default_output_reserve=4_096, safety_margin=0) == 267_904
