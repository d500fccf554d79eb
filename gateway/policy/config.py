"""The `teams` and `policy` config sections: their model and every check start-up makes on them.

A team is a name (a metric label and a Redis hash tag, so a short plain word), the hashes of its
gateway keys, an optional upstream key, an optional model allow-list, a compression mode and
optional limits. Every problem is a ValueError naming the team and the key; settings.py turns it
into a ConfigError that stops start-up.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

KEY_HASH = re.compile(r"sha256:[0-9a-f]{64}")
TEAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Least to most compression: a request may move its team's mode right, never left.
COMPRESSION_MODES = ("off", "auto", "aggressive")
# Far above any real budget, far below where Lua's doubles lose whole tokens.
MAX_LIMIT = 10**12
MAX_KEYS_PER_TEAM = 1000
MAX_MODEL_PATTERNS = 1000
MAX_PATTERN_LENGTH = 256
MAX_UPSTREAM_KEY_LENGTH = 4096


@dataclass(frozen=True)
class TeamLimits:
    # Prompt budget cap below the model's window: a longer prompt is compressed to it.
    max_context_tokens: int | None = None
    tokens_per_minute: int | None = None
    # Per UTC calendar day, by Redis' clock.
    tokens_per_day: int | None = None
    requests_per_minute: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_context_tokens", "tokens_per_minute", "tokens_per_day", "requests_per_minute"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_LIMIT:
                raise ValueError(f"limits.{name} must be between 1 and {MAX_LIMIT}, got {value}")


@dataclass(frozen=True)
class TeamSettings:
    keys: tuple[str, ...] = ()
    upstream_api_key: str | None = None
    models: tuple[str, ...] | None = None
    compression: str = "auto"
    limits: TeamLimits = field(default_factory=TeamLimits)

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("keys must list at least one sha256:<64 hex> key hash")
        if len(self.keys) > MAX_KEYS_PER_TEAM:
            raise ValueError(f"keys lists more than {MAX_KEYS_PER_TEAM} keys")
        for index, key in enumerate(self.keys):
            if not KEY_HASH.fullmatch(key):
                # The value itself is not quoted: it may be a raw key pasted by mistake.
                raise ValueError(
                    f"keys[{index}] is not a key hash: write sha256:<64 lower-case hex> "
                    "(context-gateway keys hash KEY prints it)"
                )
        if len(set(self.keys)) != len(self.keys):
            raise ValueError("keys lists the same key hash twice")
        upstream_key = self.upstream_api_key
        if upstream_key is not None and (
            not upstream_key.isprintable()
            or not upstream_key.isascii()
            or len(upstream_key) > MAX_UPSTREAM_KEY_LENGTH
        ):
            raise ValueError(
                "upstream_api_key must be printable ASCII (no control characters), at most 4096 chars"
            )
        if self.models is not None:
            if len(self.models) > MAX_MODEL_PATTERNS:
                raise ValueError(f"models lists more than {MAX_MODEL_PATTERNS} patterns")
            for index, pattern in enumerate(self.models):
                if not pattern or len(pattern) > MAX_PATTERN_LENGTH or not pattern.isprintable():
                    raise ValueError(
                        f"models[{index}] must be a printable pattern of 1 to {MAX_PATTERN_LENGTH} chars"
                    )
        if self.compression not in COMPRESSION_MODES:
            raise ValueError(f"compression must be off, auto or aggressive, got {self.compression[:40]!r}")

    def allows_model(self, model: str) -> bool:
        """Shell-style patterns, case-sensitive (model names are)."""
        return self.models is None or any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)


@dataclass(frozen=True)
class PolicySettings:
    # When Redis cannot be reached: "open" keeps serving with per-replica limits in memory,
    # "closed" answers 503 to team requests.
    on_store_failure: str = "open"
    # Longest a limit check may wait for Redis before the failure policy applies (seconds).
    store_timeout: float = 0.25
    # After failures in a row, how long requests skip Redis before trying it again (seconds).
    breaker_cooldown: float = 5.0
    # Output tokens reserved when a request sets neither max_completion_tokens nor max_tokens.
    default_output_allowance: int = 4096

    def __post_init__(self) -> None:
        if self.on_store_failure not in ("open", "closed"):
            raise ValueError(f"on_store_failure must be open or closed, got {self.on_store_failure[:40]!r}")
        if not 0.001 <= self.store_timeout <= 10:
            raise ValueError(f"store_timeout must be between 0.001 and 10 seconds, got {self.store_timeout}")
        if not 0 <= self.breaker_cooldown <= 3600:
            raise ValueError(
                f"breaker_cooldown must be between 0 and 3600 seconds, got {self.breaker_cooldown}"
            )
        if not 1 <= self.default_output_allowance <= MAX_LIMIT:
            raise ValueError(f"default_output_allowance must be between 1 and {MAX_LIMIT}")


def validate_teams(teams: Mapping[str, TeamSettings]) -> None:
    """Checks across teams: names usable as labels and hash tags, each key in one team only."""
    owner: dict[str, str] = {}
    for name, team in teams.items():
        if not TEAM_NAME.fullmatch(name):
            raise ValueError(
                f"team name {name[:80]!r} must be 1-64 letters, digits, '_', '.' or '-', starting with a "
                "letter or digit"
            )
        for key in team.keys:
            if key in owner:
                raise ValueError(f"teams {owner[key]} and {name} list the same key hash")
            owner[key] = name
