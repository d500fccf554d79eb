"""Gateway configuration: a YAML file, every key overridable from the environment.

The environment name of a key is ``GATEWAY_`` + its dotted path in upper case
with dots as underscores: ``upstream.base_url`` -> ``GATEWAY_UPSTREAM_BASE_URL``.
Mapping-valued keys (``models``) take JSON: ``GATEWAY_MODELS='{"m": {"context_window": 32000}}'``;
list-valued keys take commas: ``GATEWAY_COMPRESSION_TOOL_RESULT_CAPS=2048,256``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.compress.options import CompressionOptions
from gateway.policy.config import PolicySettings, TeamSettings, validate_teams
from gateway.tokens.windows import usable_budget

ENV_PREFIX = "GATEWAY_"
CONFIG_ENV = "GATEWAY_CONFIG"


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which key and why."""


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    # Bodies above this are refused with 413 before being read in full.
    max_body_bytes: int = 32 * 1024 * 1024
    log_level: str = "info"


@dataclass(frozen=True)
class TimeoutSettings:
    connect: float = 10.0
    # Until the upstream's response headers: a long generation without streaming takes minutes.
    first_byte: float = 600.0
    # Longest silence between two chunks of a streamed answer.
    idle: float = 120.0
    total: float = 1800.0


@dataclass(frozen=True)
class RetrySettings:
    max_attempts: int = 3
    max_total_seconds: float = 30.0
    backoff_initial: float = 0.5
    backoff_max: float = 8.0
    # A Retry-After longer than this is not waited for: the 429 goes to the client.
    retry_after_cap: float = 20.0


@dataclass(frozen=True)
class UpstreamSettings:
    base_url: str = "https://api.openai.com/v1"
    # When set, replaces the caller's Authorization; when empty, the caller's key passes through.
    api_key: str | None = None
    max_connections: int = 1000
    timeouts: TimeoutSettings = field(default_factory=TimeoutSettings)
    retries: RetrySettings = field(default_factory=RetrySettings)


@dataclass(frozen=True)
class ModelSettings:
    context_window: int | None = None


@dataclass(frozen=True)
class BudgetSettings:
    # Output reserve when the request sets neither max_completion_tokens nor max_tokens.
    default_output_reserve: int = 4096
    # Tokens kept free for counting error on top of the output reserve.
    safety_margin: int = 256

    def usable(self, window: int, body: Mapping[str, Any]) -> int:
        """Prompt tokens a request may use in ``window`` (see tokens.windows.usable_budget)."""
        return usable_budget(
            window, body, default_output_reserve=self.default_output_reserve, safety_margin=self.safety_margin
        )


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    models: dict[str, ModelSettings] = field(default_factory=dict)
    redis_url: str | None = None
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    compression: CompressionOptions = field(default_factory=CompressionOptions)
    # Team name -> its gateway keys, upstream key, models, compression and limits (gateway/policy).
    teams: dict[str, TeamSettings] = field(default_factory=dict)
    policy: PolicySettings = field(default_factory=PolicySettings)

    def __post_init__(self) -> None:
        validate_teams(self.teams)

    def window_overrides(self) -> dict[str, int]:
        return {name: m.context_window for name, m in self.models.items() if m.context_window}


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read the YAML file (``path`` or ``$GATEWAY_CONFIG``), then apply environment overrides."""
    env = os.environ if environ is None else environ
    path = path or env.get(CONFIG_ENV) or None
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        raw = loaded or {}
    _apply_env(Settings, raw, (), env)
    settings: Settings = _build(Settings, raw, "")
    return settings


def _apply_env(cls: type[Any], raw: dict[str, Any], path: tuple[str, ...], env: Mapping[str, str]) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key_path = (*path, f.name)
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            nested = raw.setdefault(f.name, {})
            if isinstance(nested, dict):
                _apply_env(typing.cast(type[Any], hint), nested, key_path, env)
            continue
        name = ENV_PREFIX + "_".join(key_path).upper()
        if name not in env:
            continue
        value = env[name]
        if typing.get_origin(hint) is dict:
            try:
                raw[f.name] = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{name} must be JSON: {exc.msg}") from exc
        else:
            raw[f.name] = value


def _build(cls: type[Any], raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"unknown config key {_join(where, unknown[0])}")
    values = {name: _convert(hints[name], value, _join(where, name)) for name, value in raw.items()}
    try:
        return cls(**values)
    except ValueError as exc:  # a section's own validation (e.g. CompressionOptions)
        raise ConfigError(f"{where or 'config'}: {exc}") from None


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or value == "":
            return None
        return _convert(options[0], value, where)
    if dataclasses.is_dataclass(hint):
        return _build(typing.cast(type[Any], hint), value, where)
    if origin is dict:
        _, value_type = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping")
        return {str(k): _convert(value_type, v, f"{where}.{k}") for k, v in value.items()}
    if origin is tuple:
        item_type = typing.get_args(hint)[0]
        # From the environment a list is comma-separated: GATEWAY_COMPRESSION_TOOL_RESULT_CAPS=2048,256
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{where} must be a list")
        return tuple(_convert(item_type, item, f"{where}[{i}]") for i, item in enumerate(items))
    if hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if hint in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        try:
            number = hint(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
        if number < 0:
            raise ConfigError(f"{where} must not be negative")
        return number
    if hint is str:
        if not isinstance(value, str | int | float):
            raise ConfigError(f"{where} must be a string")
        return str(value)
    raise ConfigError(f"{where}: unsupported type {hint}")


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
