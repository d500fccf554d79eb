"""Configuration: YAML, environment overrides, clear errors, and a complete example file."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.settings import ConfigError, Settings, load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "gateway.example.yaml"


def _leaf_paths(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    hints = typing.get_type_hints(cls)
    paths: list[tuple[str, ...]] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            paths.extend(_leaf_paths(typing.cast(type, hint), (*prefix, f.name)))
        else:
            paths.append((*prefix, f.name))
    return paths


def test_defaults_need_no_config() -> None:
    settings = load_settings(None, {})
    assert settings == Settings()
    assert settings.upstream.base_url == "https://api.openai.com/v1"
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 8080)
    assert settings.redis_url is None and settings.upstream.api_key is None


def test_example_file_documents_every_key_with_default_values() -> None:
    document = yaml.safe_load(EXAMPLE.read_text())
    for path in _leaf_paths(Settings):
        node = document
        for part in path:
            assert isinstance(node, dict) and part in node, f"{'.'.join(path)} missing from the example"
            node = node[part]
    assert load_settings(EXAMPLE, {}) == Settings()


def test_environment_overrides_yaml(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "upstream:\n  base_url: http://yaml/v1\n  timeouts:\n    connect: 3\n"
        "models:\n  m1:\n    context_window: 1000\n"
    )
    settings = load_settings(
        config,
        {
            "GATEWAY_UPSTREAM_TIMEOUTS_CONNECT": "1.5",
            "GATEWAY_REDIS_URL": "redis://127.0.0.1:6379/0",
            "GATEWAY_COMPRESSION_AGGRESSIVE_RATIO": "0.5",
        },
    )
    assert settings.upstream.base_url == "http://yaml/v1"
    assert settings.upstream.timeouts.connect == 1.5
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.compression.aggressive_ratio == 0.5
    assert settings.window_overrides() == {"m1": 1000}


def test_list_values_from_yaml_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("compression:\n  tool_result_caps: [4096, 512]\n")
    assert load_settings(config, {}).compression.tool_result_caps == (4096, 512)
    from_env = load_settings(config, {"GATEWAY_COMPRESSION_TOOL_RESULT_CAPS": "1024,128"})
    assert from_env.compression.tool_result_caps == (1024, 128)
    with pytest.raises(ConfigError, match=r"compression.tool_result_caps\[1\] must be a number"):
        load_settings(None, {"GATEWAY_COMPRESSION_TOOL_RESULT_CAPS": "1024,lots"})


def test_config_path_from_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("server:\n  port: 9999\n")
    assert load_settings(None, {"GATEWAY_CONFIG": str(config)}).server.port == 9999


def test_models_from_json_environment() -> None:
    settings = load_settings(None, {"GATEWAY_MODELS": '{"llama-3-8b": {"context_window": 8192}}'})
    assert settings.window_overrides() == {"llama-3-8b": 8192}


@pytest.mark.parametrize(
    ("yaml_text", "env", "fragment"),
    [
        ("upstream:\n  base_ur1: x\n", {}, "unknown config key upstream.base_ur1"),
        ("server:\n  port: eighty\n", {}, "server.port must be a number"),
        ("", {"GATEWAY_SERVER_PORT": "-1"}, "server.port must not be negative"),
        ("", {"GATEWAY_MODELS": "{not json"}, "GATEWAY_MODELS must be JSON"),
        ("- a list\n", {}, "must hold a mapping"),
        ("server: [1\n", {}, "not valid YAML"),
        ("", {"GATEWAY_COMPRESSION_CUT_QUANTUM": "3"}, "cut_quantum"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, yaml_text: str, env: dict[str, str], fragment: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    with pytest.raises(ConfigError, match=fragment):
        load_settings(config, env)


def test_serve_with_bad_config_exits_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("upstream:\n  nope: 1\n")
    assert main(["serve", "--config", str(config)]) == 2
    assert "unknown config key upstream.nope" in capsys.readouterr().err


def test_missing_config_file_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--config", "/nonexistent/gateway.yaml"]) == 2
    assert "cannot read config file" in capsys.readouterr().err
