"""compression.summarizer: read from YAML and the environment; hostile values are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import ConfigError, load_settings


def test_the_summarizer_is_off_by_default_and_read_from_yaml(tmp_path: Path) -> None:
    assert load_settings(None, {}).compression.summarizer.model == ""
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "compression:\n  digest_ratio: 0.05\n  summarizer:\n    model: gpt-4o-mini\n    mode: inline\n"
        "    timeout: 5\n    base_url: http://127.0.0.1:9000/v1\n"
    )
    settings = load_settings(config, {})
    summarizer = settings.compression.summarizer
    assert (summarizer.model, summarizer.mode, summarizer.timeout) == ("gpt-4o-mini", "inline", 5.0)
    assert settings.compression.digest_ratio == 0.05  # the engine's options sit beside it


@pytest.mark.parametrize(
    ("name", "value", "key"),
    [
        ("MODE", "sometimes", "summarizer.mode"),
        ("MODE", "x" * 10_000, "summarizer.mode"),
        ("TIMEOUT", "0", "summarizer.timeout"),
        ("TIMEOUT", "nan", "summarizer.timeout"),
        ("TIMEOUT", "1e9", "summarizer.timeout"),
        ("START_RATIO", "0", "summarizer.start_ratio"),
        ("START_RATIO", "1.5", "summarizer.start_ratio"),
        ("START_RATIO", "nan", "summarizer.start_ratio"),
        ("START_RATIO", "-inf", "summarizer.start_ratio"),
        ("MAX_INPUT_TOKENS", "10", "summarizer.max_input_tokens"),
        ("MAX_INPUT_TOKENS", "abc", "summarizer.max_input_tokens"),
        ("MAX_OUTPUT_TOKENS", "-5", "summarizer.max_output_tokens"),
        ("MAX_OUTPUT_TOKENS", "9" * 400, "summarizer.max_output_tokens"),
        ("CACHE_TTL", "1", "summarizer.cache_ttl"),
        ("BASE_URL", "ftp://example/v1", "summarizer.base_url"),
        ("BASE_URL", "http://user:pw@\x00host/v1", "summarizer.base_url"),
        ("MODEL", "gpt\x00evil", "summarizer.model"),
        ("MODEL", "m" * 5_000, "summarizer.model"),
    ],
)
def test_hostile_summarizer_values_are_refused_naming_the_key(name: str, value: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key) as caught:
        load_settings(None, {f"GATEWAY_COMPRESSION_SUMMARIZER_{name}": value})
    assert "pw" not in str(caught.value)


def test_a_summarizer_section_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("compression:\n  summarizer: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"compression\.summarizer"):
        load_settings(config, {})
    config.write_text("compression:\n  summarizer:\n    timeuot: 5\n")
    with pytest.raises(ConfigError, match=r"did you mean compression\.summarizer\.timeout"):
        load_settings(config, {})
