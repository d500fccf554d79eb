"""Gateway configuration: a YAML file, every key overridable from the environment.

The environment name of a key is ``GATEWAY_`` + its dotted path in upper case
with dots as underscores: ``upstream.base_url`` -> ``GATEWAY_UPSTREAM_BASE_URL``.
Mapping-valued keys (``models``) take JSON: ``GATEWAY_MODELS='{"m": {"context_window": 32000}}'``;
list-valued keys take commas: ``GATEWAY_COMPRESSION_TOOL_RESULT_CAPS=2048,256``.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import math
import os
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gateway.compress.options import CompressionOptions
from gateway.policy.config import PolicySettings, TeamSettings, validate_teams
from gateway.tokens.windows import usable_budget

ENV_PREFIX = "GATEWAY_"
CONFIG_ENV = "GATEWAY_CONFIG"


class ConfigError(ValueError):
    """The configuration cannot be used; the message lists every problem, each naming its key."""

    def __init__(self, problems: str | list[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else problems
        if len(self.problems) == 1:
            super().__init__(self.problems[0])
        else:
            super().__init__(
                f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
            )


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
LOG_FORMATS = ("json", "text")
MAX_WORKERS = 512
REDIS_SCHEMES = ("redis", "rediss", "unix")
# Deeper than any valid configuration (teams.<name>.limits.<key> is four levels): a deeper value
# is refused when read, before code that recurses into it (reprs in messages) overflows the stack.
MAX_CONFIG_DEPTH = 16
MAX_DISCOVERY_TIMEOUT = 30.0


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    # Bodies above this are refused with 413 before being read in full.
    max_body_bytes: int = 32 * 1024 * 1024
    # The same for the pass-through routes (file uploads): OpenAI accepts files up to 512 MB.
    max_passthrough_body_bytes: int = 512 * 1024 * 1024
    log_level: str = "info"
    # An upstream key, no gateway keys and a non-loopback address make an open relay: refused
    # at start-up unless the operator says this is what they mean.
    allow_unauthenticated: bool = False
    # Worker processes (serve --workers): a number, or "auto" / 0 for one per usable CPU.
    workers: str = "1"
    # json: one JSON object per log line (request lines included); text: for people.
    log_format: str = "text"
    # After SIGTERM, how long in-flight requests and streams may take to finish before they are cut.
    shutdown_grace_seconds: float = 60.0
    # Open client connections; beyond it the oldest idle one is closed, else the new one.
    # Lowered at start-up to fit under the process's open-file limit.
    max_connections: int = 4096
    # Request line plus headers; larger ones answer 431.
    max_header_bytes: int = 64 * 1024
    # Seconds from a request's first byte (or the connection's start) to the end of its headers.
    header_timeout: float = 15.0
    # Longest silence, in seconds, inside a request body.
    body_timeout: float = 60.0
    # Slowest a body may arrive once `body_timeout` has passed (bytes per second; 0: no floor).
    body_min_rate: float = 1024.0
    # Seconds an idle keep-alive connection stays open between requests.
    keep_alive_timeout: float = 5.0


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
    # Where POST /v1/messages goes (Anthropic's API; the path /v1/messages is appended).
    anthropic_base_url: str = "https://api.anthropic.com"
    # When set, sent as x-api-key on /v1/messages instead of the caller's credentials.
    anthropic_api_key: str | None = None
    max_connections: int = 1000
    timeouts: TimeoutSettings = field(default_factory=TimeoutSettings)
    retries: RetrySettings = field(default_factory=RetrySettings)


@dataclass(frozen=True)
class ModelSettings:
    context_window: int | None = None


@dataclass(frozen=True)
class WindowSettings:
    # Ask the upstream's model endpoints (vLLM, OpenRouter, LM Studio, Ollama, llama.cpp) for a
    # model's window at its first sight; the answer is cached in the store.
    discovery: bool = True
    # Seconds the first request of a model may wait for discovery.
    discovery_timeout: float = 2.0
    # How long a discovered window (or the lack of one) is kept before asking again.
    discovery_ttl_seconds: int = 86_400
    # How long a window learned from overflow errors is believed before it is learned again.
    learned_ttl_seconds: int = 86_400
    # A stated window below this is an echo of some other number, not the model's window.
    min_plausible_window: int = 1_024
    # Models whose learned and discovered windows are kept in memory (least recently used go).
    max_models: int = 10_000
    # How often a replica re-reads a model's learned window from the store (other replicas'
    # lessons, `context-gateway windows forget`).
    store_refresh_seconds: float = 30.0


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


SUMMARIZER_MODES = ("background", "inline")


@dataclass(frozen=True)
class SummarizerSettings:
    """`compression.summarizer`: an LLM summarizing dropped spans (gateway/summarize/); off without model."""

    model: str = ""
    base_url: str | None = None  # default: upstream.base_url
    api_key: str | None = None  # default: upstream.api_key
    mode: str = "background"
    # Summarize the span the first drop will remove once the prompt reaches this share of its
    # budget, so that drop already finds the summary; 1: only once turns are dropped.
    start_ratio: float = 0.8
    max_input_tokens: int = 16_000
    max_output_tokens: int = 1_024
    timeout: float = 30.0
    cache_ttl: int = 7 * 24 * 3600


@dataclass(frozen=True)
class CompressionSettings(CompressionOptions):
    """The engine's options plus the summarizer, which only the gateway (not the library) uses."""

    summarizer: SummarizerSettings = field(default_factory=SummarizerSettings)


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    models: dict[str, ModelSettings] = field(default_factory=dict)
    redis_url: str | None = None
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    windows: WindowSettings = field(default_factory=WindowSettings)
    compression: CompressionSettings = field(default_factory=CompressionSettings)
    # Team name -> its gateway keys, upstream key, models, compression and limits (gateway/policy).
    teams: dict[str, TeamSettings] = field(default_factory=dict)
    policy: PolicySettings = field(default_factory=PolicySettings)

    def __post_init__(self) -> None:
        validate_teams(self.teams)

    def window_overrides(self) -> dict[str, int]:
        return {name: m.context_window for name, m in self.models.items() if m.context_window}


def load_settings(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    server_overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Read the YAML file (``path`` or ``$GATEWAY_CONFIG``), then apply environment overrides,
    then ``server_overrides`` (the command line's ``--host``/``--port``).

    Every problem is collected before anything is reported, so an operator fixes a broken
    deployment in one round instead of one key per restart.
    """
    env = os.environ if environ is None else environ
    path = path or env.get(CONFIG_ENV) or None
    raw: dict[str, Any] = {}
    if path is not None:
        too_deep = f"config file {path} nests values deeper than {MAX_CONFIG_DEPTH} levels"
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        except RecursionError:  # the YAML parser recurses once per level
            raise ConfigError(too_deep) from None
        if nested_deeper_than(loaded, MAX_CONFIG_DEPTH):
            raise ConfigError(too_deep)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        raw = loaded or {}
    problems: list[str] = []
    _apply_env(Settings, raw, (), env, problems)
    problems.extend(_unknown_environment(env))
    if server_overrides:
        server = raw.setdefault("server", {})
        if isinstance(server, dict):
            server.update({k: v for k, v in server_overrides.items() if v is not None})
    settings = _build(Settings, raw, "", problems)
    if settings is not None:
        problems.extend(_check(settings))
    if problems:
        raise ConfigError(problems)
    assert isinstance(settings, Settings)
    return settings


def environment_names(cls: type[Any] = Settings, path: tuple[str, ...] = ()) -> Iterator[str]:
    """Every ``GATEWAY_*`` variable the settings read (mapping-valued keys take one, as JSON)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            yield from environment_names(typing.cast(type[Any], hint), (*path, f.name))
        else:
            yield ENV_PREFIX + "_".join((*path, f.name)).upper()


def _unknown_environment(env: Mapping[str, str]) -> list[str]:
    """A misspelled variable would otherwise be ignored without a word."""
    known = {*environment_names(), CONFIG_ENV}
    problems = []
    for name in sorted(n for n in env if n.upper().startswith(ENV_PREFIX) and n not in known):
        close = difflib.get_close_matches(name.upper(), known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        problems.append(f"unknown environment variable {name}{hint}")
    return problems


def _check(settings: Settings) -> list[str]:
    """Problems no single value shows on its own: URLs, names, ranges, the open relay."""
    problems = []
    upstream_problem = http_url_problem(settings.upstream.base_url)
    if upstream_problem:
        problems.append(f"upstream.base_url {upstream_problem}")
    anthropic_problem = http_url_problem(settings.upstream.anthropic_base_url)
    if anthropic_problem:
        problems.append(f"upstream.anthropic_base_url {anthropic_problem}")
    if settings.server.log_level.lower() not in LOG_LEVELS:
        problems.append(
            f"server.log_level must be one of {', '.join(LOG_LEVELS)}, got {settings.server.log_level!r}"
        )
    log_format = settings.server.log_format
    if log_format not in LOG_FORMATS:
        problems.append(f"server.log_format must be one of {', '.join(LOG_FORMATS)}, got {log_format[:40]!r}")
    workers = settings.server.workers
    if not (
        workers == "auto"
        or (len(workers) <= 3 and workers.isascii() and workers.isdigit() and int(workers) <= MAX_WORKERS)
    ):
        problems.append(
            f"server.workers must be auto or a number from 0 to {MAX_WORKERS}, got {workers[:40]!r}"
        )
    if settings.server.shutdown_grace_seconds > 86400:
        problems.append("server.shutdown_grace_seconds must be at most 86400")
    if not 1 <= settings.server.port <= 65535:
        problems.append(f"server.port must be between 1 and 65535, got {settings.server.port}")
    if settings.redis_url:
        redis_problem = _redis_url_problem(settings.redis_url)
        if redis_problem:
            problems.append(f"redis_url {redis_problem}")
    problems.extend(_summarizer_problems(settings.compression.summarizer))
    if settings.windows.discovery_timeout > MAX_DISCOVERY_TIMEOUT:
        problems.append(
            f"windows.discovery_timeout must be at most {MAX_DISCOVERY_TIMEOUT:g} s (it delays a model's "
            f"first request), got {settings.windows.discovery_timeout:g}"
        )
    if settings.windows.max_models < 1:
        problems.append("windows.max_models must be at least 1")
    if open_relay(settings):
        problems.append(
            f"upstream.api_key is set, no gateway keys are configured and the gateway listens on "
            f"{settings.server.host}, which is not a loopback address: anyone who can reach it would "
            "use the organisation's upstream key (an open relay). Listen on 127.0.0.1, configure "
            "gateway keys, or set server.allow_unauthenticated: true if this is what you mean"
        )
    return problems


def _summarizer_problems(summarizer: SummarizerSettings) -> list[str]:
    where = "compression.summarizer"
    problems = []
    if len(summarizer.model) > 256 or any(ord(ch) < 32 for ch in summarizer.model):
        problems.append(f"{where}.model must be a model name (at most 256 printable characters)")
    if summarizer.base_url:
        url_problem = summarizer_url_problem(summarizer.base_url)
        if url_problem:
            problems.append(f"{where}.base_url {url_problem}")
    if summarizer.mode not in SUMMARIZER_MODES:
        problems.append(
            f"{where}.mode must be one of {', '.join(SUMMARIZER_MODES)}, got {summarizer.mode[:40]!r}"
        )
    if not 0 < summarizer.start_ratio <= 1:
        problems.append(f"{where}.start_ratio must be above 0 and at most 1")
    if not 1_024 <= summarizer.max_input_tokens <= 2_000_000:
        problems.append(f"{where}.max_input_tokens must be between 1024 and 2000000")
    if not 32 <= summarizer.max_output_tokens <= 100_000:
        problems.append(f"{where}.max_output_tokens must be between 32 and 100000")
    if not 0.1 <= summarizer.timeout <= 600:
        problems.append(f"{where}.timeout must be between 0.1 and 600 seconds")
    if not 60 <= summarizer.cache_ttl <= 365 * 24 * 3600:
        problems.append(f"{where}.cache_ttl must be between 60 seconds and a year")
    return problems


def summarizer_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a summarizer's base URL (``compression.summarizer.base_url``), or None."""
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in url):
        return "must not contain control characters"
    return http_url_problem(url)


def http_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an upstream base URL, or None. Never quotes credentials."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a broken IPv6 host ("http://[::1/v1")
        return "is not a valid URL"
    if parts.scheme not in ("http", "https"):
        return f"must start with http:// or https:// (got {redact_url(url)!r})"
    if not parts.hostname:
        return f"has no host (got {redact_url(url)!r})"
    try:
        _ = parts.port
    except ValueError:
        return f"has an invalid port (got {redact_url(url)!r})"
    return None


def _redis_url_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in REDIS_SCHEMES:
        return f"must start with redis://, rediss:// or unix:// (got {redact_url(url)!r})"
    if parts.scheme != "unix" and not parts.hostname:
        return f"has no host (got {redact_url(url)!r})"
    try:
        _ = parts.port
    except ValueError:
        return f"has an invalid port (got {redact_url(url)!r})"
    database = parts.path.strip("/")
    if database and not database.isdigit() and parts.scheme != "unix":
        return f"names database {database!r}; it must be a number"
    return None


def redact_url(url: str) -> str:
    """``url`` without its user and password, for logs and error messages (one that cannot be
    parsed is not shown at all: where its credentials end is unknown)."""
    try:
        parts = urlsplit(url)
        if parts.password is None and parts.username is None:
            return url
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
    except ValueError:  # a broken IPv6 host, or a port that is no number
        return "(a URL that cannot be parsed)"
    return parts._replace(netloc=netloc).geturl()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def open_relay(settings: Settings) -> bool:
    """An upstream key anyone on the network could spend (teams are gateway keys: not one)."""
    return (
        bool(settings.upstream.api_key or settings.upstream.anthropic_api_key)
        and not settings.teams
        and not settings.server.allow_unauthenticated
        and not is_loopback(settings.server.host)
    )


def _apply_env(
    cls: type[Any], raw: dict[str, Any], path: tuple[str, ...], env: Mapping[str, str], problems: list[str]
) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key_path = (*path, f.name)
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            nested = raw.setdefault(f.name, {})
            if isinstance(nested, dict):
                _apply_env(typing.cast(type[Any], hint), nested, key_path, env, problems)
            continue
        name = ENV_PREFIX + "_".join(key_path).upper()
        if name not in env:
            continue
        value = env[name]
        if typing.get_origin(hint) is dict:
            too_deep = f"{name} nests values deeper than {MAX_CONFIG_DEPTH} levels"
            try:
                loaded = json.loads(value)
            except json.JSONDecodeError as exc:
                problems.append(f"{name} must be JSON: {exc.msg}")
            except RecursionError:  # the JSON decoder recurses once per level
                problems.append(too_deep)
            else:
                if nested_deeper_than(loaded, MAX_CONFIG_DEPTH):
                    problems.append(too_deep)
                else:
                    raw[f.name] = loaded
        else:
            raw[f.name] = value


def nested_deeper_than(value: object, limit: int) -> bool:
    """Whether lists and mappings in ``value`` nest more than ``limit`` levels deep. Iterative, and
    a container shared by YAML aliases is walked again only when reached deeper than before, so
    an alias bomb costs its distinct containers times ``limit``, not its expanded size."""
    deepest: dict[int, int] = {}
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list):
            continue
        if depth >= limit:
            return True
        if deepest.get(id(item), -1) >= depth:
            continue
        deepest[id(item)] = depth
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children)
    return False


def _build(cls: type[Any], raw: Any, where: str, problems: list[str]) -> Any:
    """The dataclass for ``raw``, or None after adding what is wrong with it to ``problems``."""
    if not isinstance(raw, dict):
        problems.append(f"{where or 'config'} must be a mapping")
        return None
    hints = typing.get_type_hints(cls)
    names = sorted(f.name for f in dataclasses.fields(cls))
    found = len(problems)
    for name in sorted(set(raw) - set(names), key=str):
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" (did you mean {_join(where, close[0])}?)" if close else ""
        problems.append(f"unknown config key {_join(where, str(name))}{hint}")
    values = {
        name: _convert(hints[name], value, _join(where, name), problems)
        for name, value in raw.items()
        if name in hints
    }
    if len(problems) > found:
        return None
    try:
        return cls(**values)
    except ValueError as exc:  # a section's own validation (e.g. CompressionOptions)
        problems.append(f"{where or 'config'}: {exc}")
        return None


def _convert(hint: Any, value: Any, where: str, problems: list[str]) -> Any:
    """``value`` as ``hint``; a problem is added to ``problems`` (and None returned) when it is not."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or value == "":
            return None
        return _convert(options[0], value, where, problems)
    if dataclasses.is_dataclass(hint):
        return _build(typing.cast(type[Any], hint), value, where, problems)
    if origin is dict:
        _, value_type = typing.get_args(hint)
        if not isinstance(value, dict):
            problems.append(f"{where} must be a mapping")
            return None
        return {str(k): _convert(value_type, v, f"{where}.{k}", problems) for k, v in value.items()}
    if origin is tuple:
        item_type = typing.get_args(hint)[0]
        # From the environment a list is comma-separated: GATEWAY_COMPRESSION_TOOL_RESULT_CAPS=2048,256
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            problems.append(f"{where} must be a list")
            return None
        return tuple(_convert(item_type, item, f"{where}[{i}]", problems) for i, item in enumerate(items))
    try:
        return _scalar(hint, value, where)
    except ConfigError as exc:
        problems.append(str(exc))
        return None


def _scalar(hint: Any, value: Any, where: str) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("1", "true", "yes", "on"):
            return True
        if str(value).lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{where} must be true or false, got {str(value)[:40]!r}")
    if hint in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        try:
            number = hint(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{where} must be a number, got {str(value)[:40]!r}") from None
        if hint is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{where} must be a whole number, got {value!r}")
        if hint is float and not math.isfinite(number):
            raise ConfigError(f"{where} must be a finite number")
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
