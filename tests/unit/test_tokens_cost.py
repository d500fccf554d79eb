"""Cost on the request path: per-message cache, free byte bound, off-loop counting."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway  # noqa: F401  (offline tiktoken cache)
from gateway.tokens.cache import CountCache, message_key
from gateway.tokens.calibration import Calibration
from gateway.tokens.counter import BYTE_BOUND_SLACK, TokenCounter, count_request_async


class SpyEncoding:
    """Wraps a tiktoken encoding and records what it is asked to encode."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.texts: list[str] = []

    def encode_ordinary(self, text: str) -> list[int]:
        self.texts.append(text)
        return self.inner.encode_ordinary(text)  # type: ignore[no-any-return]


def spied(model: str = "gpt-4o", cache: CountCache | None = None) -> tuple[TokenCounter, SpyEncoding]:
    counter = TokenCounter(model, calibration=Calibration(), cache=cache or CountCache())
    spy = SpyEncoding(counter.encoding)
    counter.encoding = spy  # type: ignore[assignment]
    return counter, spy


def turn(index: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question number {index} " * 20},
        {"role": "assistant", "content": f"answer number {index} " * 30},
    ]


def test_growing_conversation_only_tokenizes_new_messages() -> None:
    counter, spy = spied()
    history: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    cold = counter.messages(history + turn(0))
    spy.texts.clear()
    assert counter.messages(history + turn(0)) == cold
    assert spy.texts == []  # fully cached

    history += turn(0)
    counter.messages(history + turn(1))
    assert spy.texts == ["user", turn(1)[0]["content"], "assistant", turn(1)[1]["content"]]


def test_cache_keys_depend_on_profile_and_content_not_key_order() -> None:
    message = {"role": "user", "content": "hello"}
    reordered = {"content": "hello", "role": "user"}
    assert message_key(b"o200k/4o", message) == message_key(b"o200k/4o", reordered)
    assert message_key(b"o200k/4o", message) != message_key(b"cl100k", message)
    assert message_key(b"o200k/4o", message) != message_key(b"o200k/4o", {**message, "content": "hellO"})


def test_shared_cache_never_mixes_tokenizers() -> None:
    cache = CountCache()
    text = "The quick brown fox — naïve résumé, 東京タワー."
    message = {"role": "user", "content": text * 10}
    o200k = TokenCounter("gpt-4o", calibration=Calibration(), cache=cache).message(message)
    cl100k = TokenCounter("gpt-4", calibration=Calibration(), cache=cache).message(message)
    assert o200k != cl100k
    assert len(cache) == 2


def test_lru_is_bounded_and_keeps_recent_entries() -> None:
    cache = CountCache(max_entries=3)
    for key in (b"a", b"b", b"c"):
        cache.put(key, 1)
    assert cache.get(b"a") == 1  # refresh a
    cache.put(b"d", 1)
    assert len(cache) == 3
    assert cache.get(b"b") is None
    assert cache.get(b"a") == 1


def test_cache_is_thread_safe() -> None:
    cache = CountCache(max_entries=64)
    errors: list[BaseException] = []

    def hammer(seed: int) -> None:
        try:
            for index in range(5000):
                key = bytes([(seed * 7 + index) % 200])
                cache.put(key, index)
                cache.get(key)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=hammer, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(cache) <= 64


# --- byte upper bound ---------------------------------------------------------

text = st.text(max_size=60)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), text)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)

tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": text,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": names, "arguments": text}),
        }
    ),
    max_size=3,
)
parts = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_use"),
            "id": text,
            "name": names,
            "input": st.dictionaries(names, json_values, max_size=3),
        }
    ),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": text, "content": text}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": text}),
)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"])},
    optional={
        "content": st.one_of(st.none(), text, st.lists(parts, max_size=3)),
        "name": names,
        "tool_calls": tool_calls,
        "tool_call_id": text,
        "reasoning_content": text,
        "prefix": st.booleans(),
        "extra": json_values,
    },
)
properties = st.dictionaries(
    names,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "array"])},
        optional={
            "description": text,
            "enum": st.lists(st.one_of(text, st.integers(0, 99), st.booleans()), max_size=4),
            "items": st.fixed_dictionaries({"type": st.just("string")}),
        },
    ),
    max_size=4,
)
functions = st.fixed_dictionaries(
    {"name": names},
    optional={
        "description": text,
        "parameters": st.fixed_dictionaries({"type": st.just("object"), "properties": properties}),
    },
)
bodies = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.lists(messages, max_size=5)},
    optional={
        "tools": st.lists(
            st.fixed_dictionaries({"type": st.just("function"), "function": functions}), max_size=3
        ),
        "functions": st.lists(functions, max_size=2),
        "response_format": st.fixed_dictionaries(
            {
                "type": st.just("json_schema"),
                "json_schema": st.fixed_dictionaries({"name": names, "schema": json_values}),
            }
        ),
    },
)
encoders = st.sampled_from(
    [
        orjson.dumps,
        lambda body: json.dumps(body).encode(),  # ASCII escapes
        lambda body: json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
    ]
)


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4", "claude-sonnet-4-5"])
@settings(max_examples=150, deadline=None)
@given(body=bodies, encode=encoders)
def test_byte_bound_is_an_upper_bound(model: str, body: dict[str, Any], encode: Any) -> None:
    counter = TokenCounter(model, calibration=Calibration(), cache=CountCache())
    raw = encode(body)
    bound = counter.byte_upper_bound(raw)
    if bound is None:  # a text value that looks like a media part's type: no fast path, still safe
        media_types = (
            b"image",
            b"file",
            b"document",
            b"image_url",
            b"input_audio",
            b"input_image",
            b"input_file",
        )
        assert any(b'"%s"' % word in raw for word in media_types)
        return
    assert counter.request(body) <= bound


def test_byte_bound_value_and_media_refusal() -> None:
    calibration = Calibration()
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert (
        TokenCounter("gpt-4o", calibration=calibration).byte_upper_bound(body) == len(body) + BYTE_BOUND_SLACK
    )
    claude = TokenCounter("claude-sonnet-4-5", calibration=calibration)
    assert claude.byte_upper_bound(body) == -(-(len(body) + BYTE_BOUND_SLACK) * claude.scale // 1)
    for part in (
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-1"}},
        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
        {"type": "document", "source": {"type": "url", "url": "https://x/y.pdf"}},
    ):
        media = orjson.dumps({"messages": [{"role": "user", "content": [part]}]})
        assert TokenCounter("gpt-4o", calibration=calibration).byte_upper_bound(media) is None


# --- off-loop counting --------------------------------------------------------


async def test_small_requests_are_counted_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    async def forbidden(*args: object, **kwargs: object) -> object:
        raise AssertionError("small body sent to a thread")

    monkeypatch.setattr(asyncio, "to_thread", forbidden)
    counter = TokenCounter("gpt-4o", calibration=Calibration(), cache=CountCache())
    body = {"messages": [{"role": "user", "content": "hello"}]}
    assert await count_request_async(counter, body) == counter.request(body)


async def test_large_new_text_is_tokenized_in_a_thread_and_cached_text_is_not() -> None:
    counter, _ = spied()
    loop_thread = threading.get_ident()
    seen: list[int] = []
    original = counter.finish_request

    def recording(body: Any, lookup: Any) -> int:
        seen.append(threading.get_ident())
        return original(body, lookup)

    counter.finish_request = recording  # type: ignore[method-assign]
    body = {"messages": [{"role": "user", "content": "lorem ipsum " * 10_000}]}
    expected = TokenCounter("gpt-4o", calibration=Calibration(), cache=CountCache()).request(body)
    assert await count_request_async(counter, body) == expected
    assert len(seen) == 1 and seen[0] != loop_thread
    # Once cached, the same large body is counted on the loop: no thread hop for a warm history.
    assert await count_request_async(counter, body) == expected
    assert len(seen) == 2 and seen[1] == loop_thread
