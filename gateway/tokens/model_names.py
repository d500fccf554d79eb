"""Find a model's entry in litellm's model map under the name an app actually sends.

Apps send `claude-3-5-sonnet-20241022` where the map has
`anthropic.claude-3-5-sonnet-20241022-v2:0` (Bedrock) and
`vercel_ai_gateway/anthropic/claude-3-5-sonnet-20241022`; `llama3.1:8b` (an Ollama
tag) or `meta-llama/Llama-3.1-8B-Instruct` (a Hugging Face repo, as vLLM serves it)
where the map has `cerebras/llama3.1-8b` and `together_ai/meta-llama/...`. Lookup
goes from the most specific reading of the name to the loosest, and stops at the
first level that finds anything:

1. `exact`: the name as sent, then with provider prefixes stripped one at a time
   (`openrouter/openai/gpt-4o` → `openai/gpt-4o` → `gpt-4o`), then in lower case;
2. `spelling`: the model's own name (last path segment) with provider, region and
   vendor prefixes removed (`us.anthropic.`), Bedrock's `-v2:0`, Vertex's `@`,
   Ollama's `:tag` folded in, and case and separators ignored
   (`claude-3.5-sonnet` = `claude-3-5-sonnet` = `Claude_3_5_Sonnet`);
3. `alias`: the same with trailing snapshot dates and `latest` dropped on both
   sides (`gpt-4o-2024-08-06` ↔ `gpt-4o`, `mistral-large-latest` ↔ `mistral-large-2411`);
4. `instruct`: the spelling with `instruct` appended, the model servers like Ollama serve
   under the bare name (`qwen2.5:7b` = `Qwen2.5-7B-Instruct`).

Within a level, entries that share a provider with the name (a path prefix such as
`groq/`, or a provider the model is named after, `mistral-large`) are preferred;
when several entries remain, the smallest window wins: guessing too small costs
some compression, guessing too large costs an upstream error.

Only chat-capable entries (mode chat, completion, responses or unset) take part in
levels 2 and 3: an embedding model that shares a spelling must not lend its window.

Work is linear in the name's length: the exact level tries at most as many
suffixes as the longest map key has segments, and the other levels read only the
last segment, with regular expressions that cannot backtrack.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

MatchLevel = Literal["exact", "spelling", "alias", "instruct"]

CHAT_MODES: Final = frozenset({"chat", "completion", "responses"})

# Separators apps and providers use interchangeably inside a model's name.
_SEPARATORS: Final = re.compile(r"[-_.:@ ]+")
# Dotted prefixes of Bedrock ids: regions (`us.`, `apac.`, `us-gov.`) and vendors (`anthropic.`).
# Only purely alphabetic words before a dot count: `gpt-3.5` and `llama3.1` keep theirs.
_DOTTED_PREFIX: Final = re.compile(r"^(?:[a-z]+(?:-[a-z]+)?\.)+(?=[a-z])")
# Bedrock's packaging version `-v1:0`, `-v2:0`: not part of the model's identity.
_BEDROCK_VERSION: Final = re.compile(r"-v\d+:\d+$")
# Words that some spellings carry and others do not: `Meta-Llama-3.1` = `Llama-3.1`,
# Mistral's `open-mixtral-8x22b` = `mixtral-8x22b`.
_VENDOR_WORDS: Final = ("meta", "open")
# Shorter provider names (`xai`, `oci`) would claim unrelated models by their first letters.
MIN_PROVIDER_NAME: Final = 4


def _is_snapshot_token(token: str) -> bool:
    """A trailing date, date part or build number (`20241022`, `2024`, `08`, `0613`, `001`) or `latest`."""
    return token == "latest" or (token.isdigit() and len(token) >= 2)


@dataclass(frozen=True, slots=True)
class Spelling:
    """The parts of a model name that lookup compares."""

    owners: frozenset[str]
    spelling: str
    alias: str


def split_name(name: str) -> Spelling:
    """Owners (provider prefixes), the separator-free spelling and the snapshot-free alias of ``name``."""
    lowered = name.lower()
    head, _, last = lowered.rpartition("/")
    owners = {segment for segment in head.split("/") if segment} if head else set()
    dotted = _DOTTED_PREFIX.match(last)
    if dotted:
        owners.update(part for part in dotted.group(0).split(".") if part)
        last = last[dotted.end() :]
    last = _BEDROCK_VERSION.sub("", last)
    # An Ollama `name:tag`: the tag (a size, a quantisation) is part of the spelling; the
    # alias is the model without it (`qwen2.5:7b` → `qwen2.5`).
    base, colon, tag = last.partition(":")
    if colon:
        owners.add("ollama")
        last = base if tag == "latest" else f"{base}-{tag}"
    tokens = _tokens(last)
    alias_tokens = _tokens(base)
    while len(alias_tokens) > 1 and _is_snapshot_token(alias_tokens[-1]):
        alias_tokens.pop()
    return Spelling(frozenset(owners), "".join(tokens), "".join(alias_tokens))


def _tokens(name: str) -> list[str]:
    tokens = [token for token in _SEPARATORS.split(name) if token]
    return tokens[1:] if len(tokens) > 1 and tokens[0] in _VENDOR_WORDS else tokens


@dataclass(frozen=True, slots=True)
class _Entry:
    window: int
    owners: frozenset[str]


@dataclass(frozen=True, slots=True)
class NameMatch:
    window: int
    level: MatchLevel


def suffixes(name: str, max_segments: int) -> list[str]:
    """`a/b/c` → [`a/b/c`, `b/c`, `c`], keeping only suffixes of at most ``max_segments`` segments
    (longer ones cannot be a key), so the work stays linear in the name's length."""
    tails: list[str] = []
    end = len(name)
    for _ in range(max_segments):
        cut = name.rfind("/", 0, end)
        if cut < 0:
            break
        tails.append(name[cut + 1 :])
        end = cut
    found = ([name] if len(tails) < max_segments else []) + tails[::-1]
    return [suffix for suffix in dict.fromkeys(found) if suffix]


def first_suffix_match(table: Mapping[str, int], name: str, max_segments: int) -> int | None:
    """The value of the longest suffix of ``name`` in ``table``, as given, then in lower case."""
    for spelling in (name, name.lower()):
        for suffix in suffixes(spelling, max_segments):
            window = table.get(suffix)
            if window is not None:
                return window
    return None


class ModelNameIndex:
    """Windows by exact key, by spelling and by alias; built once from the model map."""

    def __init__(self, entries: Mapping[str, Any]) -> None:
        self._exact: dict[str, int] = {}
        self._spelling: dict[str, list[_Entry]] = {}
        self._alias: dict[str, list[_Entry]] = {}
        for key, entry in entries.items():
            if not isinstance(entry, dict):
                continue
            window = entry_window(entry)
            if window is None:
                continue
            self._exact[key] = window
            self._exact.setdefault(key.lower(), window)
            mode = entry.get("mode")
            if mode is not None and mode not in CHAT_MODES:
                continue
            parts = split_name(key)
            provider = entry.get("litellm_provider")
            owners = parts.owners
            if isinstance(provider, str):
                owners = owners | {provider.split("-", 1)[0], provider}
            indexed = _Entry(window, owners)
            self._spelling.setdefault(parts.spelling, []).append(indexed)
            self._alias.setdefault(parts.alias, []).append(indexed)
        self._max_segments = 1 + max((key.count("/") for key in self._exact), default=0)
        # Providers a model can be named after, in the separator-free form spellings use.
        providers = {
            owner for found in self._spelling.values() for entry_ in found for owner in entry_.owners
        }
        self._named_after = tuple(
            (provider, _SEPARATORS.sub("", provider).replace("_", ""))
            for provider in sorted(providers)
            if len(provider) >= MIN_PROVIDER_NAME
        )

    @classmethod
    def from_windows(cls, windows: Mapping[str, int]) -> ModelNameIndex:
        return cls({name: {"max_input_tokens": window} for name, window in windows.items()})

    @property
    def windows(self) -> Mapping[str, int]:
        return self._exact

    def __len__(self) -> int:
        return len(self._exact)

    def exact(self, name: str) -> int | None:
        return first_suffix_match(self._exact, name, self._max_segments)

    def lookup(self, name: str) -> NameMatch | None:
        window = self.exact(name)
        if window is not None:
            return NameMatch(window, "exact")
        parts = split_name(name)
        owners = set(parts.owners)
        # A model named after its provider (`mistral-large`, `gemini-2.0-flash`) belongs to it.
        owners.update(provider for provider, bare in self._named_after if parts.spelling.startswith(bare))
        levels: tuple[tuple[MatchLevel, dict[str, list[_Entry]], str], ...] = (
            ("spelling", self._spelling, parts.spelling),
            ("alias", self._alias, parts.alias),
            # Ollama and others serve the instruct model under the bare name (`qwen2.5:7b`).
            ("instruct", self._spelling, parts.spelling + "instruct"),
        )
        for level, table, key in levels:
            found = table.get(key) if key else None
            if found:
                return NameMatch(_safest(found, owners), level)
        return None


def _safest(entries: Iterable[_Entry], owners: set[str]) -> int:
    """The smallest window among entries of the name's own provider, else among all."""
    candidates = list(entries)
    own = [entry for entry in candidates if entry.owners & owners]
    return min(entry.window for entry in (own or candidates))


def _positive_int(value: object) -> int | None:
    # bool is an int subclass; `true` is not a token count.
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def entry_window(entry: Mapping[str, Any]) -> int | None:
    """`max_input_tokens`, else `max_tokens`, of one model-map entry."""
    return _positive_int(entry.get("max_input_tokens")) or _positive_int(entry.get("max_tokens"))
