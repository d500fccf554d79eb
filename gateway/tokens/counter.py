"""Count chat-completions prompts the way the upstream bills them.

One unit everywhere: every method returns *estimated upstream prompt tokens*.

- Exact models (OpenAI tokenizers, `exact = True`): the tiktoken count under
  OpenAI's documented rules (`formats.py`). `messages(ms) == sum(message(m)
  for m in ms) + 3`, and `request()` adds tools and the response schema.
- Approximated models (`exact = False`): the o200k_base count × the family
  factor (`encodings.py`) × the model's learned calibration factor
  (`calibration.py`), rounded up. The factor applies to whatever is asked:
  `text()`, `message()` and `tools()` scale that part alone, so a part is
  never under-estimated; `messages()` and `request()` scale the raw total
  once, which is the best estimate of the whole and may be below the sum of
  the rounded-up parts by less than one token per part.

The counter reads the shared `Calibration` on every call, so estimates follow
the upstream's reports as they arrive; raw counts are cached per message
(`cache.py`) and never depend on the factor.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

import tiktoken

from gateway.tokens.cache import CacheKey, CountCache, message_key
from gateway.tokens.calibration import Calibration
from gateway.tokens.encodings import ModelProfile, get_encoding, profile_for
from gateway.tokens.formats import REPLY_PRIMING, PromptRules, compact_json
from gateway.tokens.segments import SEGMENT_CHARS, segments

# Shared by every counter made by `counter_for`: the route feeds it the
# upstream's reported usage and persists it through the store.
CALIBRATION: Final = Calibration()
MESSAGE_COUNTS: Final = CountCache()

# `byte_upper_bound`: fixed tokens that no body byte pays for (reply priming
# 3 + the tools section's closing 12), with room to spare.
BYTE_BOUND_SLACK: Final = 64
# Parts whose cost is a formula of pixels, seconds or pages, not of their bytes.
# One regex pass is ~5x faster than five substring searches over a JSON body.
_UNBOUNDED_BY_BYTES: Final = re.compile(
    rb'"(?:image_url|image|input_audio|file|document|input_image|input_file)"'
)

# Below this much uncached JSON, tokenizing (~1 ms) is cheaper than a thread hop.
INLINE_COUNT_BYTES: Final = 32 * 1024


@dataclass
class Lookup:
    """A request's messages split by the count cache: what is known and what must be tokenized."""

    cached: int = 0
    missing: list[tuple[CacheKey | None, Any]] = field(default_factory=list)
    missing_bytes: int = 0


class TokenCounter:
    def __init__(
        self,
        model: str,
        *,
        calibration: Calibration | None = None,
        cache: CountCache | None = None,
    ) -> None:
        self.model = model
        self.profile: ModelProfile = profile_for(model)
        self.exact: bool = self.profile.exact
        self.encoding: tiktoken.Encoding = get_encoding(self.profile.encoding_name)
        self._calibration = CALIBRATION if calibration is None else calibration
        self._cache = MESSAGE_COUNTS if cache is None else cache
        self._rules = PromptRules(self.profile, self._raw_text)
        self._cache_namespace = self.profile.key.encode()
        self._tools_namespace = self._cache_namespace + b"/tools"

    @property
    def scale(self) -> float:
        """Multiplier from raw counts to estimated upstream tokens (1.0 when exact)."""
        if self.exact:
            return 1.0
        return self.profile.factor * self._calibration.factor(self.model)

    def _scaled(self, raw: int) -> int:
        return raw if self.exact else math.ceil(raw * self.scale)

    # --- raw counts ----------------------------------------------------------

    def _raw_text(self, text: str) -> int:
        if len(text) <= 2 * SEGMENT_CHARS:
            return len(self.encoding.encode_ordinary(text)) if text else 0
        # Linear time whatever the text (see segments.py).
        return sum(len(self.encoding.encode_ordinary(part)) for part in segments(text))

    def _raw_message(self, message: Mapping[str, Any]) -> int:
        lookup = self.lookup([message])
        return lookup.cached + self._tokenize_missing(lookup)

    def lookup(self, messages: Sequence[Any]) -> Lookup:
        """Key every message and take what the cache knows: hashing only, no tokenizing."""
        lookup = Lookup()
        for message in messages:
            if not isinstance(message, Mapping):  # malformed body: counted as its JSON, uncached
                lookup.missing.append((None, message))
                continue
            key = message_key(self._cache_namespace, message)
            count = None if key is None else self._cache.get(key)
            if count is None:
                lookup.missing.append((key, message))
                lookup.missing_bytes += 0 if key is None else key[1]
            else:
                lookup.cached += count
        return lookup

    def _tokenize_missing(self, lookup: Lookup) -> int:
        total = 0
        for key, message in lookup.missing:
            if not isinstance(message, Mapping):
                total += self._raw_text(compact_json(message))
                continue
            count = self._rules.message(message)
            if key is not None:
                self._cache.put(key, count)
            total += count
        return total

    def _raw_tools(self, tools: Sequence[Any] | None, functions: Sequence[Any] | None) -> int:
        """Tool definitions repeat on every request of an agent: cached like messages."""
        if not tools and not functions:
            return 0
        key = message_key(self._tools_namespace, {"tools": tools, "functions": functions})
        count = None if key is None else self._cache.get(key)
        if count is None:
            count = self._rules.tools(tools, functions)
            if key is not None:
                self._cache.put(key, count)
        return count

    def _raw_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        lookup = self.lookup(messages)
        return lookup.cached + self._tokenize_missing(lookup) + REPLY_PRIMING

    def _raw_request(self, body: Mapping[str, Any]) -> int:
        messages = body.get("messages")
        return self._finish_request(body, self.lookup(messages if isinstance(messages, list) else []))

    def _finish_request(self, body: Mapping[str, Any], lookup: Lookup) -> int:
        """Raw tokens of a request whose messages were looked up: tokenize the rest, add the extras."""
        messages = body.get("messages")
        tools = body.get("tools")
        functions = body.get("functions")
        total = lookup.cached + self._tokenize_missing(lookup)
        total += REPLY_PRIMING if isinstance(messages, list) else 0
        total += self._raw_tools(
            tools if isinstance(tools, list) else None,
            functions if isinstance(functions, list) else None,
        )
        return total + self._rules.response_format(body.get("response_format"))

    def finish_request(self, body: Mapping[str, Any], lookup: Lookup) -> int:
        """`request(body)` given `lookup(body["messages"])` (the part safe to run in a thread)."""
        return self._scaled(self._finish_request(body, lookup))

    # --- estimates -----------------------------------------------------------

    def text(self, text: str) -> int:
        return self._scaled(self._raw_text(text))

    def message(self, message: Mapping[str, Any]) -> int:
        """One message, including its per-message framing."""
        return self._scaled(self._raw_message(message))

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """All messages plus the reply priming."""
        return self._scaled(self._raw_messages(messages))

    def tools(self, tools: Sequence[Any] | None, functions: Sequence[Any] | None = None) -> int:
        """`tools` and legacy `functions` definitions (0 when there are none)."""
        return self._scaled(self._raw_tools(tools, functions))

    def request(self, body: Mapping[str, Any]) -> int:
        """A whole chat-completions body: messages, tools/functions, response schema."""
        return self._scaled(self._raw_request(body))

    def byte_upper_bound(self, body_bytes: bytes) -> int | None:
        """An upper bound on `request()` of this JSON body, without tokenizing.

        Every BPE token covers at least one byte, and every token we count
        comes from distinct body bytes: string values decode to at most their
        escaped length; structures we count as compact JSON re-serialize to
        at most their source length; per-message, per-call and per-property
        framing (3 tokens) is paid by the JSON punctuation and keys around
        them (`{"role":`, `"k":{}` …). What remains — reply priming and the
        tools section's end — is `BYTE_BOUND_SLACK`. The one way around it is
        hand-written exponent numbers (`1e5` re-serializes as `100000.0`),
        which no JSON encoder emits for values below 1e16.

        None when the body may hold images, audio or files: their cost is a
        function of pixels, seconds or pages, not of bytes. Bodies the
        upstream would reject (e.g. functions without a name) may exceed it.
        """
        if _UNBOUNDED_BY_BYTES.search(body_bytes):
            return None
        return self._scaled(len(body_bytes) + BYTE_BOUND_SLACK)


@lru_cache(maxsize=256)
def counter_for(model: str) -> TokenCounter:
    """The counter for a model name, sharing the process-wide calibration and cache."""
    return TokenCounter(model)


async def count_request_async(counter: TokenCounter, body: Mapping[str, Any]) -> int:
    """`counter.request(body)`, tokenizing in a worker thread when much of it is new.

    The cache lookup (hashing) stays on the event loop; only what the cache does not
    know is tokenized, off the loop when it is large (tiktoken releases the GIL, so a
    big first request does not stall the others). A growing conversation's usual
    request, all cached but its newest message, never pays for a thread hop.
    """
    messages = body.get("messages")
    lookup = counter.lookup(messages if isinstance(messages, list) else [])
    if lookup.missing_bytes < INLINE_COUNT_BYTES:
        return counter.finish_request(body, lookup)
    return await asyncio.to_thread(counter.finish_request, body, lookup)
