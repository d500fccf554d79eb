"""Tokenizer and approximation per model family."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import tiktoken

import gateway  # noqa: F401  (offline tiktoken cache)
from gateway.tokens.encodings import CLAUDE_FACTOR, DEFAULT_FACTOR, base_model_name, profile_for


@pytest.mark.parametrize(
    "model",
    [
        "gpt-4o",
        "gpt-4o-2024-08-06",
        "gpt-4o-mini",
        "chatgpt-4o-latest",
        "gpt-4.1",
        "gpt-4.1-nano",
        "gpt-4.5-preview",
        "gpt-5",
        "gpt-5.1",
        "gpt-5-mini",
        "gpt-5-chat-latest",
        "o1",
        "o1-mini",
        "o3",
        "o3-mini",
        "o4-mini",
        "openai/gpt-4o",
        "azure/gpt-4o",
        "openrouter/openai/gpt-5",
        "ft:gpt-4o-mini-2024-07-18:org::abc",
        "GPT-4O",
    ],
)
def test_o200k_models_are_exact(model: str) -> None:
    profile = profile_for(model)
    assert (profile.encoding_name, profile.exact, profile.factor) == ("o200k_base", True, 1.0)
    # Same answer as tiktoken's own model table, for the names it knows.
    with contextlib.suppress(KeyError):
        assert tiktoken.encoding_name_for_model(base_model_name(model)) == "o200k_base"


@pytest.mark.parametrize(
    "model", ["gpt-4", "gpt-4-0613", "gpt-4-turbo", "gpt-3.5-turbo", "azure/gpt-35-turbo"]
)
def test_cl100k_models_are_exact(model: str) -> None:
    profile = profile_for(model)
    assert (profile.encoding_name, profile.exact, profile.func_init) == ("cl100k_base", True, 10)


@pytest.mark.parametrize(
    ("model", "factor"),
    [
        ("claude-sonnet-4-5", CLAUDE_FACTOR),
        ("anthropic/claude-3-5-haiku-latest", CLAUDE_FACTOR),
        ("bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0", CLAUDE_FACTOR),
        ("meta-llama/Llama-3.1-70B-Instruct", DEFAULT_FACTOR),
        ("qwen2.5-72b-instruct", DEFAULT_FACTOR),
        ("mistral-large-latest", DEFAULT_FACTOR),
        ("deepseek/deepseek-chat", DEFAULT_FACTOR),
        ("gemini/gemini-2.5-pro", DEFAULT_FACTOR),
        ("azure/my-deployment", DEFAULT_FACTOR),
        ("o100-custom", DEFAULT_FACTOR),
        ("gpt-oss-120b", 1.0),
        ("groq/openai/gpt-oss-20b", 1.0),
    ],
)
def test_other_families_are_approximations(model: str, factor: float) -> None:
    profile = profile_for(model)
    assert (profile.encoding_name, profile.exact, profile.factor) == ("o200k_base", False, factor)


def test_warm_up_loads_encodings_without_importing_litellm() -> None:
    code = (
        "import sys, gateway.tokens as t; t.warm_up(); "
        "from gateway.tokens.windows import ModelMap; assert ModelMap().get('gpt-4o') == 128000; "
        "assert 'litellm' not in sys.modules, 'litellm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
