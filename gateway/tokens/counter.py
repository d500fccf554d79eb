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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

import tiktoken

from gateway.tokens.cache import CacheKey, CountCache, message_key
from gateway.tokens.calibration import Calibration
from gateway.tokens.encodings import ModelProfile, get_encoding, profile_for
from gateway.tokens.formats import REPLY_PRIMING, PromptRules, compact_json
from gateway.tokens.prefixes import ConversationPrefixes, Encoded, Remembered
from gateway.tokens.segments import SEGMENT_CHARS, segments

# Shared by every counter made by `counter_for`: the route feeds it the
# upstream's reported usage and persists it through the store.
CALIBRATION: Final = Calibration()
MESSAGE_COUNTS: Final = CountCache()
CONVERSATIONS: Final = ConversationPrefixes()

# `byte_upper_bound`: fixed tokens that no body byte pays for (reply priming
# 3 + the tools section's closing 12), with room to spare.
BYTE_BOUND_SLACK: Final = 64
# Parts whose cost is a formula of pixels, seconds or pages, not of their bytes.
# One regex pass is ~5x faster than five substring searches over a JSON body.
_UNBOUNDED_BY_BYTES: Final = re.compile(
    rb'"(?:image_url|image|input_audio|file|document|input_image|input_file)"'
)

# A conversation is remembered under its first messages (`TokenCounter._opening`).
OPENING_MESSAGES: Final = 2

# Below this much uncached JSON, tokenizing (~1 ms) is cheaper than a thread hop.
INLINE_COUNT_BYTES: Final = 32 * 1024


@dataclass
class Lookup:
    """A request's messages split by what is known (a remembered conversation's head, the count
    cache) and what must be tokenized; `counts` is complete once `missing` is tokenized."""

    messages: Sequence[Any]
    counts: list[int]
    keys: list[CacheKey | None]
    cached: int = 0
    missing: list[int] = field(default_factory=list)  # indices into messages
    missing_bytes: int = 0
    opening: CacheKey | None = None
    encoded: Encoded | None = None  # the messages' JSON, as far as the comparison wrote it
    remembered: Remembered | None = None  # the remembered conversation sharing the longest head
    shared: int = 0  # how many leading messages it shares


class TokenCounter:
    def __init__(
        self,
        model: str,
        *,
        calibration: Calibration | None = None,
        cache: CountCache | None = None,
        conversations: ConversationPrefixes | None = None,
    ) -> None:
        self.model = model
        self.profile: ModelProfile = profile_for(model)
        self.exact: bool = self.profile.exact
        self.encoding: tiktoken.Encoding = get_encoding(self.profile.encoding_name)
        self._calibration = CALIBRATION if calibration is None else calibration
        self._cache = MESSAGE_COUNTS if cache is None else cache
        # What a counter learns is its cache's: one given its own cache keeps its own conversations.
        if conversations is None:
            conversations = CONVERSATIONS if cache is None else ConversationPrefixes()
        self._conversations = conversations
        self._rules = PromptRules(self.profile, self._raw_text)
        self._cache_namespace = self.profile.key.encode()
        self._tools_namespace = self._cache_namespace + b"/tools"
        self._response_format_namespace = self._cache_namespace + b"/response_format"

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

    def lookup(
        self, messages: Sequence[Any], *, conversation: bool = False, encoded: Sequence[bytes] | None = None
    ) -> Lookup:
        """What is known of each message, without tokenizing. A `conversation` (a whole message
        list) first takes the head it shares with a remembered one (`prefixes.py`), comparing
        each message's compact JSON (`encoded` when the parse wrote it already); the other
        messages are keyed for the count cache."""
        lookup = Lookup(messages, [0] * len(messages), [None] * len(messages))
        start = 0
        if conversation and len(messages) > OPENING_MESSAGES:  # shorter: nothing to share beyond its opening
            lookup.opening = self._opening(lookup)
        if lookup.opening is not None:
            lookup.encoded = Encoded(messages, encoded)
            remembered, start = self._conversations.longest(lookup.opening, lookup.encoded)
            lookup.remembered, lookup.shared = remembered, start
            if remembered is not None:
                lookup.counts[:start] = remembered.counts[:start]
                lookup.keys[:start] = remembered.keys[:start]
                lookup.cached = sum(remembered.counts[:start])
        for index in range(start, len(messages)):
            message = messages[index]
            if not isinstance(message, Mapping):  # malformed body: counted as its JSON, uncached
                lookup.missing.append(index)
                continue
            key = lookup.keys[index]  # the opening's messages are keyed already
            if key is None:
                key = lookup.keys[index] = message_key(self._cache_namespace, message)
            count = None if key is None else self._cache.get(key)
            if count is None:
                lookup.missing.append(index)
                lookup.missing_bytes += 0 if key is None else key[1]
            else:
                lookup.counts[index] = count
                lookup.cached += count
        return lookup

    def keep_warm(self, lookup: Lookup) -> None:
        """Put the shared head's counts back in the count cache before a fit, which counts message
        by message (only then: on the usual request, one that fits, it would be wasted work)."""
        if lookup.remembered is not None:
            self._cache.refresh(
                lookup.remembered.keys[: lookup.shared], lookup.remembered.counts[: lookup.shared]
            )

    def _opening(self, lookup: Lookup) -> CacheKey | None:
        """A conversation's opening: its first two messages (an app's system prompt alone would
        put all of the app's conversations under one opening), keyed into `lookup.keys`."""
        opening = lookup.messages[:OPENING_MESSAGES]
        for index, message in enumerate(opening):
            if not isinstance(message, Mapping):
                return None
            lookup.keys[index] = message_key(self._cache_namespace, message)
        keys = [key for key in lookup.keys[: len(opening)] if key is not None]
        if len(keys) < len(opening):  # one of them has no JSON
            return None
        return (self._cache_namespace, sum(key[1] for key in keys), hash(tuple(key[2] for key in keys)))

    def _tokenize_missing(self, lookup: Lookup) -> int:
        total = 0
        for index in lookup.missing:
            message, key = lookup.messages[index], lookup.keys[index]
            if not isinstance(message, Mapping):
                count = self._raw_text(compact_json(message))
            else:
                count = self._rules.message(message)
                if key is not None:
                    self._cache.put(key, count)
            lookup.counts[index] = count
            total += count
        return total

    def _remember(self, lookup: Lookup) -> None:
        """Keep a counted request's messages for the next request of its conversation."""
        known, shared = lookup.remembered, lookup.shared
        if lookup.opening is None or (
            known is not None and shared == len(known.encoded) == len(lookup.messages)
        ):
            return  # not rememberable, or the very conversation already remembered
        # It grew from the remembered one, or rewrote its newest message (an edit, a retry):
        # that one will not be sent again. Otherwise it branched off earlier and both are kept.
        replaces = known if known is not None and shared >= len(known.encoded) - 1 else None
        keys = [key for key in lookup.keys if key is not None]
        encoded = (
            [] if lookup.encoded is None else [json for json in lookup.encoded.all() if json is not None]
        )
        if len(keys) == len(encoded) == len(lookup.messages):
            remembered = Remembered(tuple(encoded), tuple(keys), tuple(lookup.counts))
            self._conversations.remember(lookup.opening, remembered, replaces)

    def _raw_tools(self, tools: Sequence[Any] | None, functions: Sequence[Any] | None) -> int:
        """Tool definitions repeat on every request of an agent: cached like messages."""
        if not tools and not functions:
            return 0
        definitions = {"tools": tools, "functions": functions}
        return self._cached(self._tools_namespace, definitions, lambda: self._rules.tools(tools, functions))

    def _raw_response_format(self, response_format: object) -> int:
        """A structured-output schema repeats on every request too (instructor, `parse()`)."""
        if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
            return 0
        return self._cached(
            self._response_format_namespace,
            response_format,
            lambda: self._rules.response_format(response_format),
        )

    def _cached(self, namespace: bytes, value: Mapping[str, Any], count: Callable[[], int]) -> int:
        """`count()`, kept in the count cache under `value`'s key. Under load the tokenizer's tables
        have left the CPU caches by the time a request is counted, so even a short schema costs
        tens of microseconds to tokenize again, against one hash of its JSON here."""
        key = message_key(namespace, value, keep_order=True)
        cached = None if key is None else self._cache.get(key)
        if cached is not None:
            return cached
        counted = count()
        if key is not None:
            self._cache.put(key, counted)
        return counted

    def _raw_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        lookup = self.lookup(messages, conversation=True)
        return lookup.cached + self._tokenize_missing(lookup) + REPLY_PRIMING

    def _raw_request(self, body: Mapping[str, Any]) -> int:
        messages = body.get("messages")
        lookup = self.lookup(messages if isinstance(messages, list) else [], conversation=True)
        return self._finish_request(body, lookup)

    def _finish_request(self, body: Mapping[str, Any], lookup: Lookup) -> int:
        """Raw tokens of a request whose messages were looked up: tokenize the rest, add the extras."""
        messages = body.get("messages")
        tools = body.get("tools")
        functions = body.get("functions")
        total = lookup.cached + self._tokenize_missing(lookup)
        self._remember(lookup)
        total += REPLY_PRIMING if isinstance(messages, list) else 0
        total += self._raw_tools(
            tools if isinstance(tools, list) else None,
            functions if isinstance(functions, list) else None,
        )
        return total + self._raw_response_format(body.get("response_format"))

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


def request_lookup(
    counter: TokenCounter, body: Mapping[str, Any], encoded: Sequence[bytes] | None = None
) -> Lookup:
    """The lookup of a request's messages, as a conversation: hashing and comparing, no tokenizing
    (`encoded`: each message's compact JSON, when known)."""
    messages = body.get("messages")
    return counter.lookup(messages if isinstance(messages, list) else [], conversation=True, encoded=encoded)


async def finish_count_async(counter: TokenCounter, body: Mapping[str, Any], lookup: Lookup) -> int:
    """`counter.finish_request`, in a worker thread when much of the body is new.

    A growing conversation's usual request, all known but its newest message,
    is tokenized on the event loop and never pays for a thread hop; a large
    new part goes to a thread (tiktoken releases the GIL, so a big first
    request does not stall the others).
    """
    if lookup.missing_bytes < INLINE_COUNT_BYTES:
        return counter.finish_request(body, lookup)
    return await asyncio.to_thread(counter.finish_request, body, lookup)


async def count_request_async(counter: TokenCounter, body: Mapping[str, Any]) -> int:
    """`counter.request(body)`: the lookup on the event loop, tokenizing as `finish_count_async`."""
    return await finish_count_async(counter, body, request_lookup(counter, body))
