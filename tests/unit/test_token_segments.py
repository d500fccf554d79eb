"""Long texts are encoded in segments: linear time, and the same count as the whole text."""

from __future__ import annotations

import base64
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tokens.counter import TokenCounter
from gateway.tokens.encodings import CL100K, O200K, get_encoding
from gateway.tokens.segments import SEGMENT_CHARS, segments

# Words of several scripts and shapes, and every kind of separator the pre-tokenizers treat
# differently: spaces, newline runs, tabs, punctuation, digits, contractions.
WORDS = st.sampled_from(
    ["the", "Über", "naïve", "日本語", "данные", "x1", "I'm", "we'll", "URL", "a.b", "foo_bar", "😀", "2024"]
)
SEPARATORS = st.sampled_from([" ", "  ", "\n", "\n\n", " \n", "\t", ", ", ". ", "/", "-", "' ", "123", "   "])


@st.composite
def long_texts(draw: st.DrawFn) -> str:
    parts: list[str] = []
    size = 0
    target = draw(st.integers(2 * SEGMENT_CHARS + 1, 6 * SEGMENT_CHARS))
    while size < target:
        piece = draw(WORDS) + draw(SEPARATORS)
        parts.append(piece)
        size += len(piece)
    return "".join(parts)


@settings(max_examples=60, deadline=None)
@given(text=long_texts(), encoding=st.sampled_from([O200K, CL100K]))
def test_segmented_count_equals_the_whole_count_for_text_with_word_breaks(text: str, encoding: str) -> None:
    model = "gpt-4o" if encoding == O200K else "gpt-4"
    assert "".join(segments(text)) == text
    assert TokenCounter(model)._raw_text(text) == len(get_encoding(encoding).encode_ordinary(text))


def _pathological() -> dict[str, str]:
    rng = random.Random(7)
    return {
        "letter run": "a" * 200_000,
        "space run": " " * 200_000,
        "digit run": "1234567890" * 20_000,
        "base64": base64.b64encode(rng.randbytes(150_000)).decode(),
        "slashes": "a/" * 100_000,
    }


@pytest.mark.parametrize("name", sorted(_pathological()))
def test_runs_without_word_breaks_stay_within_a_token_per_cut(name: str) -> None:
    text = _pathological()[name]
    parts = list(segments(text))
    assert "".join(parts) == text
    assert max(len(part) for part in parts) <= 2 * SEGMENT_CHARS
    whole = len(get_encoding(O200K).encode_ordinary(text))
    assert abs(TokenCounter("gpt-4o")._raw_text(text) - whole) <= len(parts) - 1


def test_a_million_spaces_count_instead_of_crashing_the_tokenizer() -> None:
    # Whole, tiktoken's regex overflows its stack on this (a Rust panic, not an exception).
    assert TokenCounter("gpt-4o")._raw_text(" " * 1_000_000) > 0
