"""Resolution of the names apps really send against litellm's bundled model map."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.tokens.model_names import ModelNameIndex, split_name, suffixes
from gateway.tokens.windows import ModelMap

INDEX = ModelMap().index()

# (name as an app sends it, the window, how it was found). Windows are litellm 1.106's.
REAL_NAMES = [
    # OpenAI and Azure
    ("gpt-4o", 128_000, "exact"),
    ("gpt-4o-2024-08-06", 128_000, "exact"),
    ("azure/gpt-4o-mini", 128_000, "exact"),
    ("gpt-35-turbo", 4_097, "spelling"),  # Azure's deployment spelling of gpt-3.5-turbo
    # Anthropic: the dated snapshot is only in the map under Bedrock's and a gateway's spelling
    ("claude-3-5-sonnet-20241022", 200_000, "spelling"),
    ("anthropic/claude-3-5-sonnet-20241022", 200_000, "spelling"),
    ("claude-3-5-sonnet-latest", 200_000, "spelling"),
    ("anthropic/claude-3.5-sonnet", 200_000, "spelling"),  # OpenRouter's dotted slug
    # Mistral
    ("mistral-large-latest", 262_144, "spelling"),
    ("open-mixtral-8x22b", 65_536, "spelling"),
    # Groq
    ("groq/llama-3.1-8b-instant", 131_072, "spelling"),
    ("groq/mixtral-8x7b-32768", 32_000, "alias"),
    # Bedrock
    ("anthropic.claude-3-haiku-20240307-v1:0", 200_000, "spelling"),
    ("us.anthropic.claude-3-7-sonnet-20250219-v1:0", 200_000, "exact"),
    # Hugging Face names as vLLM serves them, Together's slugs
    ("meta-llama/Llama-3.3-70B-Instruct-Turbo", 131_072, "spelling"),
    ("Qwen/Qwen2.5-72B-Instruct", 32_000, "spelling"),
    # Ollama tags
    ("llama3.1:8b", 16_384, "spelling"),
    ("mistral:latest", 8_192, "spelling"),
    ("qwen2.5-72b-instruct", 32_000, "spelling"),
    # Snapshot aliases the map only has in another form
    ("grok-2-latest", 131_072, "alias"),
]


@pytest.mark.parametrize(("name", "window", "level"), REAL_NAMES)
def test_real_names_resolve_to_the_map_window(name: str, window: int, level: str) -> None:
    match = INDEX.lookup(name)
    assert match is not None, f"{name} unresolved"
    assert (match.window, match.level) == (window, level)


def test_names_the_map_does_not_know_stay_unknown() -> None:
    for name in ("my-finetune-v3", "gemini-1.5-pro", "totally/unknown/model"):
        assert INDEX.lookup(name) is None


def test_split_name_folds_spellings() -> None:
    bedrock = split_name("us.anthropic.claude-3-5-sonnet-20241022-v2:0")
    assert bedrock.owners == {"us", "anthropic"}
    assert bedrock.spelling == "claude35sonnet20241022"
    assert bedrock.alias == "claude35sonnet"
    assert split_name("vertex_ai/claude-3-5-sonnet@20240620").alias == "claude35sonnet"
    assert split_name("Meta-Llama-3.1-8B-Instruct").spelling == split_name("llama-3.1-8b-instruct").spelling
    ollama = split_name("qwen2.5:7b")
    assert (ollama.owners, ollama.spelling, ollama.alias) == ({"ollama"}, "qwen257b", "qwen25")
    # Dates of every shape come off the alias; sizes and versions stay.
    assert split_name("gpt-4o-2024-08-06").alias == "gpt4o"
    assert split_name("command-r-08-2024").alias == "commandr"
    assert split_name("gemini-1.0-pro-001").alias == "gemini10pro"
    assert split_name("claude-2").alias == "claude2"
    assert split_name("deepseek-v3").alias == "deepseekv3"


def test_the_smallest_window_wins_among_equally_specific_entries() -> None:
    index = ModelNameIndex(
        {
            "provider-a/model-x": {"max_input_tokens": 128_000, "mode": "chat"},
            "provider-b/Model_X": {"max_input_tokens": 32_000, "mode": "chat"},
            "model-x-embed": {"max_input_tokens": 8_000, "mode": "embedding"},
        }
    )
    match = index.lookup("model-x")
    assert match is not None and match.window == 32_000
    # The name's own provider is more specific than the others.
    own = index.lookup("provider-a/MODEL-X")
    assert own is not None and own.window == 128_000


def test_exact_beats_spelling_beats_alias() -> None:
    index = ModelNameIndex.from_windows({"m-2024-01-01": 1_000, "m": 2_000, "vendor/M-2024-01-01": 3_000})
    exact = index.lookup("m-2024-01-01")
    assert exact is not None and (exact.window, exact.level) == (1_000, "exact")
    cased = index.lookup("VENDOR/M-2024-01-01")
    assert cased is not None and (cased.window, cased.level) == (3_000, "exact")
    folded = index.lookup("m.2024.01.01")
    assert folded is not None and (folded.window, folded.level) == (1_000, "spelling")
    alias = index.lookup("m-latest")
    assert alias is not None and (alias.window, alias.level) == (1_000, "alias")


@pytest.mark.parametrize("unit", ["a/", "a", "a.", "a-", "1-", "a:", "@", "a-1:0", "us.", "/"])
def test_hostile_names_cost_linear_work(unit: str) -> None:
    """A 100,000-character name resolves (issue 8 once saw seconds for 10,000 `a/`): only as
    many suffixes as the longest key has segments are ever tried."""
    name = unit * (100_000 // len(unit))
    tried = suffixes(name, 7)
    assert len(tried) <= 7
    assert all(name.endswith(suffix) for suffix in tried)
    match = INDEX.lookup(name)
    assert match is None or match.window > 0


@given(st.text(max_size=200))
def test_any_name_resolves_or_is_unknown_without_raising(name: str) -> None:
    match = INDEX.lookup(name)
    assert match is None or match.window > 0
    tried = suffixes(name, 3)
    assert len(tried) <= 3 and all(name.endswith(suffix) for suffix in tried)
