"""Configuration: YAML, environment overrides, clear errors, and a complete example file."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from pathlib import Path

import pytest
import yaml

import gateway
from gateway.cli import main, startup_line, unshared_limits_warning
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
        # An alias bomb: the nesting check walks each shared list once, not a billion times.
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n"
                for p, n in zip("abcdefgh", "bcdefghi", strict=True)
            ),
            {},
            "unknown config key a",
        ),
        ("", {"GATEWAY_COMPRESSION_CUT_QUANTUM": "3"}, "cut_quantum"),
        ("", {"GATEWAY_COMPRESSION_AGED_STEP_CAP": "8"}, "aged_step_cap must be at least 32"),
        ("compression:\n  aged_step_cap: [64]\n", {}, "aged_step_cap must be a number"),
        ("", {"GATEWAY_COMPRESSION_AGED_STEP_CAP": "9" * 10_000}, "aged_step_cap must be a number"),
        ("", {"GATEWAY_COMPRESSION_AGED_STEP_CAP": "64\x00"}, "aged_step_cap must be a number"),
        # urlsplit raises on these, and the port check of the redaction raised again: tracebacks.
        (
            "",
            {"GATEWAY_UPSTREAM_BASE_URL": "http://u:pw@h:99999/v1"},
            "upstream.base_url has an invalid port",
        ),
        ("", {"GATEWAY_UPSTREAM_BASE_URL": "http://[::1/v1"}, "upstream.base_url is not a valid URL"),
        ("", {"GATEWAY_REDIS_URL": "redis://u:pw@h:x/0"}, "redis_url has an invalid port"),
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


DEEP_LIST = "[" * 990 + "]" * 990


@pytest.mark.parametrize(
    ("contents", "environ", "named"),
    [
        (b"\xff\xfe: 1\n", {}, "bad.yaml is not UTF-8 text (byte 0)"),
        (b"[" * 10_000 + b"]" * 10_000, {}, "bad.yaml nests values deeper than 16 levels"),
        (None, {"GATEWAY_MODELS": "[" * 5_000 + "]" * 5_000}, "GATEWAY_MODELS nests values deeper"),
        (None, {"GATEWAY_TEAMS": "[" * 5_000 + "]" * 5_000}, "GATEWAY_TEAMS nests values deeper"),
        # Within the parser's reach, but deeper than the messages that quote a value can go.
        (None, {"GATEWAY_MODELS": f'{{"m": {{"context_window": {DEEP_LIST}}}}}'}, "GATEWAY_MODELS nests"),
    ],
)
@pytest.mark.parametrize("command", [["serve"], ["windows", "resolve", "gpt-4o"]])
def test_unreadable_or_too_deep_config_is_a_configuration_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    contents: bytes | None,
    environ: dict[str, str],
    named: str,
    command: list[str],
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_bytes(contents or b"{}\n")
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main([*command, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("context-gateway: configuration error:") and named in err
    assert "Traceback" not in err


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "upstream:\n  base_url: api.example.com/v1\n  nope: 1\n"
        "server:\n  log_level: loud\n  port: 84536\n"
        "redis_url: http://cache:6379\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(config, {"GATEWAY_UPSTREAM_BASEURL": "x", "GATEWAY_COMPRESSION_CUT_QUANTUM": "3"})
    message = str(caught.value)
    for fragment in (
        "unknown config key upstream.nope",
        "unknown environment variable GATEWAY_UPSTREAM_BASEURL (did you mean GATEWAY_UPSTREAM_BASE_URL?)",
        "cut_quantum",
    ):
        assert fragment in message
    # The checks that need a whole, well-typed config run once the structural problems are fixed.
    config.write_text(
        "upstream:\n  base_url: api.example.com/v1\nserver:\n  log_level: loud\n  port: 84536\n"
        "redis_url: http://cache:6379\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(config, {})
    assert len(caught.value.problems) == 4
    message = str(caught.value)
    assert "upstream.base_url must start with http:// or https:// (got 'api.example.com/v1')" in message
    assert "server.log_level must be one of" in message and "'loud'" in message
    assert "server.port must be between 1 and 65535, got 84536" in message
    assert "redis_url must start with redis://" in message


def test_team_limits_kept_per_worker_are_announced_at_start() -> None:
    """Without Redis each worker keeps its own budgets: two workers admitted 6 requests a minute
    for a team limited to 3, and nothing said so. The operator is told at start, naming the
    teams and the multiple, and not told where the limits are shared or nothing is limited."""
    key = "sha256:" + "ab" * 32
    teams = {
        "research": {"keys": [key], "limits": {"requests_per_minute": 3}},
        "ops": {"keys": ["sha256:" + "cd" * 32]},
    }
    settings = load_settings(None, {"GATEWAY_TEAMS": json.dumps(teams)})
    warning = unshared_limits_warning(settings, 4)
    assert warning is not None and "research" in warning and "4x" in warning and "redis_url" in warning
    assert "ops" not in warning and "ab" * 32 not in warning
    assert unshared_limits_warning(settings, 1) is None
    shared = load_settings(
        None, {"GATEWAY_TEAMS": json.dumps(teams), "GATEWAY_REDIS_URL": "redis://r:6379/0"}
    )
    assert unshared_limits_warning(shared, 4) is None
    del teams["research"]["limits"]
    assert unshared_limits_warning(load_settings(None, {"GATEWAY_TEAMS": json.dumps(teams)}), 4) is None


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"GATEWAY_UPSTREAM_BASE_URL": "ftp://files.example/v1"}, "must start with http:// or https://"),
        ({"GATEWAY_UPSTREAM_BASE_URL": "http:///v1"}, "has no host"),
        ({"GATEWAY_UPSTREAM_BASE_URL": "http://h:99999/v1"}, "invalid port"),
        ({"GATEWAY_REDIS_URL": "redis://:pw@cache:6379/zero"}, "must be a number"),
        ({"GATEWAY_REDIS_URL": "redis://"}, "has no host"),
        ({"GATEWAY_SERVER_PORT": "0"}, "between 1 and 65535"),
        ({"GATEWAY_SERVER_PORT": "80.5"}, "must be a number"),
        ({"GATEWAY_SERVER_MAX_BODY_BYTES": "1e999"}, "must be a number"),
        ({"GATEWAY_UPSTREAM_TIMEOUTS_IDLE": "nan"}, "finite"),
        ({"GATEWAY_SERVER_ALLOW_UNAUTHENTICATED": "maybe"}, "true or false"),
        ({"GATEWAY_MODEL": "{}"}, "did you mean GATEWAY_MODELS?"),
        ({"GATEWAY_SERVER_WORKERS": "many"}, "must be auto or a number from 0 to 512, got 'many'"),
        ({"GATEWAY_SERVER_WORKERS": "-1"}, "server.workers must be auto or a number"),
        ({"GATEWAY_SERVER_WORKERS": "513"}, "server.workers must be auto or a number"),
        ({"GATEWAY_SERVER_WORKERS": "\uff12"}, "server.workers must be auto or a number"),  # a full-width 2
        ({"GATEWAY_SERVER_WORKERS": "9" * 100_000}, "got '9999999999"),
        ({"GATEWAY_SERVER_LOG_FORMAT": "xml"}, "server.log_format must be one of json, text, got 'xml'"),
        ({"GATEWAY_SERVER_LOG_FORMAT": "json\n\x1b[31m"}, "server.log_format must be one of json, text"),
        ({"GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS": "soon"}, "must be a number"),
        ({"GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS": "-5"}, "must not be negative"),
        ({"GATEWAY_SERVER_SHUTDOWN_GRACE_SECONDS": "1e9"}, "at most 86400"),
    ],
)
def test_bad_values_name_key_and_value(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_settings(None, env)


def test_errors_never_quote_url_credentials() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"GATEWAY_UPSTREAM_BASE_URL": "ftp://user:hunter2@h/v1"})
    assert "hunter2" not in str(caught.value) and "ftp://h/v1" in str(caught.value)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.internal"])
def test_open_relay_is_refused_unless_meant(host: str) -> None:
    env = {"GATEWAY_UPSTREAM_API_KEY": "sk-org", "GATEWAY_SERVER_HOST": host}
    with pytest.raises(ConfigError, match="open relay"):
        load_settings(None, env)
    assert load_settings(None, {**env, "GATEWAY_SERVER_ALLOW_UNAUTHENTICATED": "true"}).server.host == host
    # Without an upstream key every caller spends their own: nothing to protect.
    assert load_settings(None, {"GATEWAY_SERVER_HOST": host}).server.host == host


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.8.9.10"])
def test_loopback_with_an_upstream_key_is_fine(host: str) -> None:
    assert load_settings(None, {"GATEWAY_UPSTREAM_API_KEY": "sk-org", "GATEWAY_SERVER_HOST": host})


def test_serve_refuses_open_relay_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GATEWAY_UPSTREAM_API_KEY", "sk-org-secret-1234")
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "open relay" in err and "server.allow_unauthenticated" in err
    assert "sk-org-secret-1234" not in err and "Traceback" not in err


@pytest.mark.parametrize("port", ["84536", "0", "http"])
def test_serve_rejects_bad_port_argument(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["serve", "--port", port])
    assert caught.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_huge_workers_value_is_not_echoed_in_full() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"GATEWAY_SERVER_WORKERS": "9" * 100_000})
    assert len(str(caught.value)) < 200


def test_serve_rejects_bad_workers_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--workers", "lots"]) == 2
    assert "server.workers must be auto or a number" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"context-gateway {gateway.__version__}"


def test_startup_line_names_what_is_in_use_without_secrets() -> None:
    settings = load_settings(
        None,
        {
            "GATEWAY_UPSTREAM_BASE_URL": "https://bob:pw-upstream@llm.internal/v1",
            "GATEWAY_UPSTREAM_API_KEY": "sk-org-secret",
            "GATEWAY_REDIS_URL": "redis://:pw-redis@cache:6379/2",
        },
    )
    line = startup_line(settings, "/etc/gateway.yaml", {})
    assert line.startswith(f"context-gateway {gateway.__version__}: config /etc/gateway.yaml")
    assert "upstream https://llm.internal/v1 with the gateway's own key" in line
    assert "store redis://cache:6379/2" in line and "listening on http://127.0.0.1:8080" in line
    for secret in ("pw-upstream", "sk-org-secret", "pw-redis", "bob"):
        assert secret not in line
    assert "store memory" in startup_line(load_settings(None, {}), None, {})


def test_startup_line_says_where_settings_and_upstream_keys_come_from() -> None:
    """A gateway set up wholly by GATEWAY_* variables said "config built-in defaults", and one
    with teams said "with each caller's own key", although no caller's key crosses then."""
    environ = {"GATEWAY_UPSTREAM_BASE_URL": "http://vllm.internal:8000/v1", "GATEWAY_SERVER_PORT": "9000"}
    line = startup_line(load_settings(None, environ), None, environ)
    assert "config built-in defaults and 2 GATEWAY_* variables;" in line
    assert "with each caller's own key;" in line
    hashed = "sha256:" + "0" * 64
    teams = {
        "GATEWAY_TEAMS": f'{{"a": {{"keys": ["{hashed}"]}}, "b": {{"keys": ["{hashed[:-1]}1"]}}}}',
    }
    assert "with no key (teams are set: callers' keys do not cross);" in startup_line(
        load_settings(None, teams), None, {}
    )
    teams["GATEWAY_TEAMS"] = teams["GATEWAY_TEAMS"].replace('"a": {', '"a": {"upstream_api_key": "sk-a", ')
    teams["GATEWAY_UPSTREAM_API_KEY"] = "sk-org"
    line = startup_line(load_settings(None, teams), None, {})
    assert "with their own key for 1 of 2 teams, else the gateway's own key;" in line
    assert "sk-a" not in line and "sk-org" not in line


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"GATEWAY_WINDOWS_DISCOVERY": "maybe"}, "windows.discovery must be true or false"),
        ({"GATEWAY_WINDOWS_DISCOVERY_TIMEOUT": "3600"}, "windows.discovery_timeout must be at most 30"),
        ({"GATEWAY_WINDOWS_DISCOVERY_TIMEOUT": "nan"}, "windows.discovery_timeout must be a finite number"),
        ({"GATEWAY_WINDOWS_LEARNED_TTL_SECONDS": "-1"}, "windows.learned_ttl_seconds must not be negative"),
        ({"GATEWAY_WINDOWS_LEARNED_TTL_SECONDS": "1e400"}, "windows.learned_ttl_seconds must be a number"),
        (
            {"GATEWAY_WINDOWS_MIN_PLAUSIBLE_WINDOW": "\x00\x1b[31m"},
            "windows.min_plausible_window must be a number",
        ),
        ({"GATEWAY_WINDOWS_MAX_MODELS": "0"}, "windows.max_models must be at least 1"),
        ({"GATEWAY_WINDOWS_MAX_MODELS": "9" * 5000}, "windows.max_models must be a number"),
        ({"GATEWAY_WINDOWS_STORE_REFRESH_SECONDS": "[1]"}, "windows.store_refresh_seconds must be a number"),
    ],
)
def test_window_settings_refuse_hostile_values(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(None, env)
    assert fragment in str(raised.value)


def test_window_settings_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text("windows:\n  discovery: false\n  learned_ttl_seconds: 600\n  max_models: 50\n")
    windows = load_settings(path, {}).windows
    assert (windows.discovery, windows.learned_ttl_seconds, windows.max_models) == (False, 600, 50)
    path.write_text("windows:\n  discovery_timeout: {deep: {deeper: [1, 2]}}\n  unknown_key: 1\n")
    with pytest.raises(ConfigError) as raised:
        load_settings(path, {})
    assert "windows.discovery_timeout must be a number" in str(raised.value)
    assert "unknown config key windows.unknown_key" in str(raised.value)
